#!/usr/bin/env node
// Data flows one way: command → plan → effects → timeline → checks → reports. This reads every import in src/
// and fails when one runs back up that flow, or when the twin (src/sim) and the CLI reach into each other.
//   node scripts/check-layers.mjs        (also: npm run check:layers; test/layers.test.ts runs it)
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
  [4, ['discovery']],
  [5, ['checks', 'workload']],
  [6, ['faults']],
  [7, ['report']],
  [8, ['experiment', 'restart', 'suite']],
  [9, ['cli', 'commands']],
]

/** The layer of a path relative to src/ ('sim' is a world of its own). */
export function layerOf(rel) {
  const top = rel.split('/')[0]
  if (top === 'sim') return 'sim'
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
    if (from === undefined) { out.push(`${rel}: not in any layer (add its folder to LAYERS)`); continue }
    const text = readFileSync(file, 'utf8')
    for (const m of text.matchAll(IMPORT)) {
      const spec = m[1] ?? m[2]
      if (from === 'sim' && spec === '@oclif/core') out.push(`${rel} imports @oclif/core: the twin imports nothing of the CLI`)
      if (!spec.startsWith('.')) continue
      const target = relative(src, resolve(dirname(file), spec))
      const to = layerOf(target)
      if (from === 'sim' && to !== 'sim') out.push(`${rel} → ${target}: the twin imports nothing outside src/sim`)
      else if (to === 'sim' && from !== 'sim' && from !== 9) out.push(`${rel} → ${target}: only the CLI (cli/, commands/) may start the twin`)
      else if (typeof from === 'number' && typeof to === 'number' && to > from) out.push(`${rel} (layer ${from}) → ${target} (layer ${to}): runs back up the flow`)
    }
  }
  return out
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const v = violations()
  for (const line of v) console.log(line)
  console.log(v.length === 0 ? 'layers: no import runs back up the flow' : `layers: ${v.length} import(s) run back up the flow`)
  process.exit(v.length === 0 ? 0 : 1)
}
