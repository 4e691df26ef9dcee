import {existsSync, readFileSync} from 'node:fs'
import {createRequire} from 'node:module'
import {dirname, join} from 'node:path'
import {fileURLToPath, pathToFileURL} from 'node:url'

/**
 * A dependency loaded on first use, not at start-up: every pdchaos command pays for what it imports before it parses
 * its flags, and most runs never open an SSH connection or push metrics (a CLI spawn that dies on bad input took
 * 1.1 CPU-s, a third of it ssh2, execa and prom-client). CommonJS packages only: an ES module must be imported
 * lazily with import(), since require() of one fails under tsx (bin/dev.js) when a dependency exports only for import.
 */
export function lazyRequire<T>(id: string): () => T {
  let loaded: T | undefined
  return () => {
    loaded ??= createRequire(import.meta.url)(id) as T
    return loaded
  }
}

/**
 * One of pdchaos's own modules to run as a worker thread (`deployment/yaml-worker`): dist/…/NAME.js in the built
 * CLI, or under sources (tests, bin/dev.js) src/…/NAME.ts, which a worker loads only through tsx's loader (`viaTsx`,
 * the module to register it). Found from the package root, whatever the caller's depth (a chunk of the bundle).
 */
export function ownWorkerModule(rel: string): {url: string; viaTsx?: string} {
  const here = fileURLToPath(import.meta.url)
  let root = dirname(here)
  for (let i = 0; i < 8 && !isPdchaosRoot(root); i++) root = dirname(root)
  if (!isPdchaosRoot(root)) throw new Error(`pdchaos's package.json not found above ${here}`)
  if (!here.endsWith('.ts')) return {url: pathToFileURL(join(root, 'dist', `${rel}.js`)).href}
  const tsx = createRequire(import.meta.url).resolve('tsx/esm/api')
  return {url: pathToFileURL(join(root, 'src', `${rel}.ts`)).href, viaTsx: pathToFileURL(tsx).href}
}

function isPdchaosRoot(dir: string): boolean {
  const pkg = join(dir, 'package.json')
  return existsSync(pkg) && /"name":\s*"pdchaos"/.test(readFileSync(pkg, 'utf8'))
}
