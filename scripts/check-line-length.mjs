#!/usr/bin/env node
// No line in src/ over 120 characters (issue 29): biome wraps code at 120 but cannot break strings, template
// literals, comments or regexes, so this checks what it leaves. No list of exceptions: zero allowed.
//   node scripts/check-line-length.mjs [--max 120]
import {readdirSync, readFileSync, statSync} from 'node:fs'
import {dirname, join, relative, resolve} from 'node:path'
import {fileURLToPath} from 'node:url'

const root = resolve(dirname(fileURLToPath(import.meta.url)), '..')
const args = process.argv.slice(2)
const i = args.indexOf('--max')
const MAX = i >= 0 ? Number(args[i + 1]) : 120

function* walk(dir) {
  for (const name of readdirSync(dir)) {
    const p = join(dir, name)
    if (statSync(p).isDirectory()) yield* walk(p)
    else if (p.endsWith('.ts')) yield p
  }
}

/** The lines of a text longer than max characters: {line (1-based), length}. */
export function longLines(text, max = MAX) {
  const out = []
  text.split('\n').forEach((l, n) => {
    const line = l.endsWith('\r') ? l.slice(0, -1) : l
    if (line.length > max) out.push({line: n + 1, length: line.length})
  })
  return out
}

/** Every src/ line over the limit, as "file:line: N characters (max M)". */
export function problems(max = MAX) {
  const out = []
  for (const file of walk(join(root, 'src'))) {
    for (const l of longLines(readFileSync(file, 'utf8'), max)) {
      out.push(`${relative(root, file)}:${l.line}: ${l.length} characters (max ${max})`)
    }
  }
  return out.sort()
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const found = problems()
  for (const p of found) console.error(p)
  if (found.length > 0) {
    console.error(`${found.length} line(s) in src/ over ${MAX} characters: split the string, comment or template.`)
    process.exit(1)
  }
  console.log(`lines: none over ${MAX} characters`)
}
