#!/usr/bin/env node
// No function in src/ runs over a screen (80 lines): a long function hides its phases. This measures every
// function, method, arrow and accessor in src/ (first line to last, nested functions included) and fails on one
// over the limit, unless scripts/long-functions.txt lists it: the functions still waiting to be split, each with the
// length it may not grow past. The list only shrinks: a listed function that is gone or fits is an error too, so
// that the list is kept true.
//   node scripts/check-function-length.mjs [--max 80] [--top N] [--write-list]
import {readdirSync, readFileSync, statSync, writeFileSync} from 'node:fs'
import {dirname, join, relative, resolve} from 'node:path'
import {fileURLToPath} from 'node:url'
import ts from 'typescript'

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..')
const LIST = join(root, 'scripts/long-functions.txt')
const args = process.argv.slice(2)
const opt = (name, dflt) => {
  const i = args.indexOf(name)
  return i >= 0 ? Number(args[i + 1]) : dflt
}
const MAX = opt('--max', 80)
const TOP = opt('--top', 0)

function* walk(dir) {
  for (const name of readdirSync(dir)) {
    const p = join(dir, name)
    if (statSync(p).isDirectory()) yield* walk(p)
    else if (p.endsWith('.ts')) yield p
  }
}

function nameOf(node, sf) {
  if (node.name) return node.name.getText(sf)
  const parent = node.parent
  if (parent && (ts.isVariableDeclaration(parent) || ts.isPropertyAssignment(parent))) return parent.name.getText(sf)
  if (ts.isConstructorDeclaration(node)) return 'constructor'
  return '(anonymous)'
}

/** Every function of a file with its first line and its length in lines. */
export function functionsOf(file) {
  const sf = ts.createSourceFile(file, readFileSync(file, 'utf8'), ts.ScriptTarget.Latest, true)
  const out = []
  const visit = node => {
    if (ts.isFunctionLike(node) && 'body' in node && node.body) {
      const first = sf.getLineAndCharacterOfPosition(node.getStart(sf)).line
      const last = sf.getLineAndCharacterOfPosition(node.getEnd()).line
      out.push({name: nameOf(node, sf), line: first + 1, lines: last - first + 1})
    }
    ts.forEachChild(node, visit)
  }
  visit(sf)
  return out
}

/** The functions of src/ over the limit, keyed "file name" (a name twice in a file keeps the longest). */
export function longFunctions(max = MAX) {
  const long = new Map()
  for (const file of walk(join(root, 'src'))) {
    for (const f of functionsOf(file)) {
      if (f.lines <= max) continue
      const key = `${relative(root, file)} ${f.name}`
      if ((long.get(key)?.lines ?? 0) < f.lines) long.set(key, {...f, key})
    }
  }
  return long
}

function readList() {
  const listed = new Map()
  let text = ''
  try {
    text = readFileSync(LIST, 'utf8')
  } catch {
    return listed
  }
  for (const raw of text.split('\n')) {
    const line = raw.trim()
    if (line === '' || line.startsWith('#')) continue
    const m = line.match(/^(\S+) (\S+(?: \S+)*) (\d+)$/)
    if (m) listed.set(`${m[1]} ${m[2]}`, Number(m[3]))
  }
  return listed
}

/** What is wrong, one line each: a long function not listed, one grown past its listed length, a stale entry. */
export function problems(max = MAX) {
  const long = longFunctions(max)
  const listed = readList()
  const out = []
  for (const [key, f] of long) {
    const allowed = listed.get(key)
    if (allowed === undefined)
      out.push(`${f.key.replace(' ', ':' + f.line + ' ')}: ${f.lines} lines, over ${max}: split it by its phases`)
    else if (f.lines > allowed)
      out.push(`${f.key}: ${f.lines} lines, grew past the ${allowed} that long-functions.txt allows`)
  }
  for (const key of listed.keys()) {
    if (!long.has(key))
      out.push(`${key}: listed in scripts/long-functions.txt but no longer over ${max} lines: remove it`)
  }
  return out
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  if (args.includes('--write-list')) {
    const long = [...longFunctions().values()].sort((a, b) => b.lines - a.lines)
    const head =
      `# Functions in src/ still over ${MAX} lines, each with the length it may not grow past ` +
      `(scripts/check-function-length.mjs).\n# The list only shrinks: split one, then delete its line.\n`
    writeFileSync(LIST, head + long.map(f => `${f.key} ${f.lines}`).join('\n') + (long.length ? '\n' : ''))
    console.log(`wrote ${long.length} entries to scripts/long-functions.txt`)
    process.exit(0)
  }
  if (TOP > 0) {
    const all = []
    for (const file of walk(join(root, 'src')))
      for (const f of functionsOf(file)) all.push({...f, file: relative(root, file)})
    for (const f of all.sort((a, b) => b.lines - a.lines).slice(0, TOP))
      console.log(`${f.file}:${f.line} ${f.name}: ${f.lines} lines`)
  }
  const p = problems()
  for (const line of p) console.log(line)
  const waiting = readList().size
  console.log(
    p.length === 0
      ? `functions: none over ${MAX} lines${waiting ? ` but the ${waiting} listed in scripts/long-functions.txt` : ''}`
      : `functions: ${p.length} problem(s)`,
  )
  process.exit(p.length === 0 ? 0 : 1)
}
