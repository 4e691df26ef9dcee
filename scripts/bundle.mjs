#!/usr/bin/env node
// The CLI's bundle (npm run build, after tsc): each command and the CLI's main become one ES module with the code
// they share split into dist/chunks/, so a command loads a handful of files instead of ~450 (pdchaos's modules,
// zod, yaml). Node 20 spends about 1 ms of CPU per module on loading alone: a third of every command's start.
// The twin's processes (dist/sim/server, dist/sim/router) keep running tsc's output, one file per module.
//   node scripts/bundle.mjs [DIST]      (DIST: tsc's output to bundle in place; default dist/ of this repository)
import {readdirSync, readFileSync, rmSync, statSync} from 'node:fs'
import {dirname, join, relative, resolve} from 'node:path'
import {fileURLToPath} from 'node:url'

import {build} from 'esbuild'

const dist = resolve(process.argv[2] ?? join(dirname(fileURLToPath(import.meta.url)), '..', 'dist'))

function* walk(dir) {
  for (const name of readdirSync(dir)) {
    const p = join(dir, name)
    if (statSync(p).isDirectory()) yield* walk(p)
    else if (p.endsWith('.js')) yield p
  }
}

const entryPoints = [
  ...walk(join(dist, 'commands')),
  join(dist, 'cli', 'main.js'),
  join(dist, 'deployment', 'yaml-worker.js'),
]
// deployment/yaml-worker.js is a worker thread's module (src/util/worker.ts): its own entry, yaml from the chunks.
rmSync(join(dist, 'chunks'), {recursive: true, force: true})
const result = await build({
  entryPoints,
  outdir: dist,
  outbase: dist,
  absWorkingDir: dist,
  allowOverwrite: true,
  bundle: true,
  splitting: true,
  format: 'esm',
  platform: 'node',
  target: 'node20',
  chunkNames: 'chunks/[name]-[hash]',
  metafile: true,
  logLevel: 'warning',
  // oclif is bundled too (bin/run.js takes its settings from dist/cli/main.js: one instance); its help plugin, native
  // packages, lazily required ones and the TypeScript tooling oclif only loads in development stay in node_modules.
  external: ['@oclif/plugin-help', 'ssh2', 'cpu-features', 'zeromq', 'prom-client', 'typescript', 'ts-node', 'tsx'],
  // A bundled CommonJS dependency may require() a Node builtin, or name its own file.
  banner: {
    js: [
      "import {createRequire as __pdchaosRequire} from 'node:module';",
      "import {fileURLToPath as __pdchaosPath} from 'node:url';",
      'const require = __pdchaosRequire(import.meta.url);',
      'const __filename = __pdchaosPath(import.meta.url);',
      "const __dirname = __filename.slice(0, __filename.lastIndexOf('/'));",
    ].join(' '),
  },
})

// A module that finds files next to itself must not be moved into a chunk unless it finds them by the package root
// (src/sim/entry.ts: packageRootOf, simModule). createRequire(import.meta.url) resolves packages from any depth.
// Metafile paths are relative to DIST (absWorkingDir); node_modules ones start with ../.
const allowed = new Set([
  'sim/entry.js',
  'util/lazy-require.js',
  'sim/lifecycle/services.js',
  'sim/lifecycle/deployment-file.js',
  'sim/vllm/up.js',
])
const moved = Object.keys(result.metafile.inputs)
  .filter(p => !p.startsWith('..') && !allowed.has(p))
  .filter(
    p =>
      /import\.meta\.(url|resolve)/.test(readFileSync(join(dist, p), 'utf8')) && !entryPoints.includes(join(dist, p)),
  )
if (moved.length > 0) {
  console.error(`bundle: these modules use import.meta and would run from dist/chunks/: ${moved.join(', ')}`)
  process.exit(1)
}
const out = Object.keys(result.metafile.outputs).filter(p => p.endsWith('.js'))
console.log(
  `bundle: ${entryPoints.length} entries, ${out.length - entryPoints.length} shared chunks, ` +
    `from ${Object.keys(result.metafile.inputs).length} modules (${relative(process.cwd(), dist) || '.'}/)`,
)
