#!/usr/bin/env node
// Data flows one way: command → plan → effects → timeline → checks → reports. This reads every import in src/
// and fails when one runs back up that flow, or when the twin (src/sim) and the CLI reach into each other.
// It also fails on an import circle (type-only imports included): a circle makes the layering meaningless inside
// a folder and is how two modules end up knowing each other's internals.
//   node scripts/check-layers.mjs        (also: npm run check:layers; test/architecture/layers.test.ts runs it)
import {readdirSync, readFileSync, statSync} from 'node:fs'
import {dirname, join, relative, resolve} from 'node:path'
import {fileURLToPath} from 'node:url'

const src = resolve(dirname(fileURLToPath(import.meta.url)), '../src')

// Lower numbers sit lower: a module may import its own layer or any lower one, never a higher one.
export const LAYERS = [
  [0, ['errors.ts', 'exit-codes.ts', 'state-dir.ts', 'util']],
  [1, ['model']],
  [2, ['hosts']],
  [3, ['deployment']],
  [4, ['discovery', 'engines']],
  [5, ['checks', 'workload']],
  [6, ['faults', 'halt']],
  [7, ['report']],
  [8, ['experiment', 'restart', 'suite']],
  [9, ['cli', 'commands']],
]

// An engine is one folder (src/engines/<name>/): its contract and discovery sit at the engines layer, and three
// subfolders take the layer of what they hold, so the engine's service clients and file rules (which the deployment
// loader asks), faults and experiments live with it.
export const ENGINE_SUBLAYERS = {deployment: 3, faults: 6, experiments: 8}

/** The layer of a path relative to src/ ('sim' is a world of its own). */
export function layerOf(rel) {
  const parts = rel.split('/')
  const top = parts[0]
  if (top === 'sim') return 'sim'
  if (top === 'engines' && parts.length > 3 && Object.hasOwn(ENGINE_SUBLAYERS, parts[2]))
    return ENGINE_SUBLAYERS[parts[2]]
  for (const [n, names] of LAYERS) if (names.includes(top)) return n
  return undefined
}

function* walk(dir) {
  for (const name of readdirSync(dir)) {
    const p = join(dir, name)
    if (statSync(p).isDirectory()) yield* walk(p)
    else if (p.endsWith('.ts')) yield p
  }
}

const IMPORT = /(?:^|\n)\s*(?:import|export)\b[^'"]*?from\s*['"]([^'"]+)['"]|import\(\s*['"]([^'"]+)['"]\s*\)/g

export function violations() {
  const out = []
  for (const file of walk(src)) {
    const rel = relative(src, file)
    const from = layerOf(rel)
    if (from === undefined) {
      out.push(`${rel}: not in any layer (add its folder to LAYERS)`)
      continue
    }
    const text = readFileSync(file, 'utf8')
    for (const m of text.matchAll(IMPORT)) {
      const spec = m[1] ?? m[2]
      if (from === 'sim' && spec === '@oclif/core')
        out.push(`${rel} imports @oclif/core: the twin imports nothing of the CLI`)
      if (!spec.startsWith('.')) continue
      const target = relative(src, resolve(dirname(file), spec))
      const to = layerOf(target)
      if (from === 'sim' && to !== 'sim') out.push(`${rel} → ${target}: the twin imports nothing outside src/sim`)
      else if (to === 'sim' && from !== 'sim' && from !== 9)
        out.push(`${rel} → ${target}: only the CLI (cli/, commands/) may start the twin`)
      else if (typeof from === 'number' && typeof to === 'number' && to > from)
        out.push(`${rel} (layer ${from}) → ${target} (layer ${to}): runs back up the flow`)
    }
  }
  return out.concat(circles())
}

/** Relative imports of every module in src/, as paths relative to src/. */
function importGraph() {
  const graph = new Map()
  for (const file of walk(src)) {
    const rel = relative(src, file)
    const deps = new Set()
    for (const m of readFileSync(file, 'utf8').matchAll(IMPORT)) {
      const spec = m[1] ?? m[2]
      if (spec.startsWith('.')) deps.add(relative(src, resolve(dirname(file), spec)).replace(/\.js$/, '.ts'))
    }
    graph.set(rel, [...deps])
  }
  return graph
}

/** Every import circle (a strongly connected set of modules, Tarjan), one line each, modules in a stable order. */
export function circles() {
  const graph = importGraph()
  const index = new Map()
  const low = new Map()
  const stack = []
  const onStack = new Set()
  const found = []
  let next = 0
  const visit = v => {
    index.set(v, next)
    low.set(v, next++)
    stack.push(v)
    onStack.add(v)
    for (const w of graph.get(v) ?? []) {
      if (!graph.has(w)) continue
      if (!index.has(w)) {
        visit(w)
        low.set(v, Math.min(low.get(v), low.get(w)))
      } else if (onStack.has(w)) low.set(v, Math.min(low.get(v), index.get(w)))
    }
    if (low.get(v) !== index.get(v)) return
    const scc = []
    let w
    do {
      w = stack.pop()
      onStack.delete(w)
      scc.push(w)
    } while (w !== v)
    if (scc.length > 1 || (graph.get(v) ?? []).includes(v)) found.push(scc.sort())
  }
  for (const v of [...graph.keys()].sort()) if (!index.has(v)) visit(v)
  return found.map(
    scc => `import circle: ${scc.join(' ↔ ')} (move the shared type or function to a module both import)`,
  )
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const v = violations()
  for (const line of v) console.log(line)
  console.log(
    v.length === 0 ? 'layers: no import runs back up the flow, no import circle' : `layers: ${v.length} problem(s)`,
  )
  process.exit(v.length === 0 ? 0 : 1)
}
