import {existsSync, readFileSync, statSync} from 'node:fs'
import {dirname, join} from 'node:path'
import {fileURLToPath, pathToFileURL} from 'node:url'

/** Set by the system tests (vitest.config.ts), which build first: the twin's processes run dist/, not src/ via tsx. */
export const TWIN_FROM_DIST_ENV = 'PDCHAOS_TWIN_FROM_DIST'

/**
 * The argv to run one of the twin's entry modules as its own process: compiled JS runs directly,
 * TypeScript sources (tests, bin/dev.js) run through tsx, or, under PDCHAOS_TWIN_FROM_DIST=1, as their compiled
 * dist/ file when it is at least as new (tsx costs each of the twin's processes about 0.5 CPU-s more to start).
 */
export function entryArgv(moduleUrl: string, ...args: string[]): {command: string; args: string[]} {
  let file = fileURLToPath(moduleUrl)
  if (file.endsWith('.ts') && process.env[TWIN_FROM_DIST_ENV] === '1') file = compiled(file) ?? file
  const viaTsx = file.endsWith('.ts')
  return {command: process.execPath, args: [...(viaTsx ? ['--import', 'tsx'] : []), file, ...args]}
}

/** The URL of a sibling module with the same extension as the caller (.ts in src, .js in dist). */
export function sibling(callerUrl: string, baseName: string): string {
  const ext = callerUrl.endsWith('.ts') ? '.ts' : '.js'
  return new URL(`./${baseName}${ext}`, callerUrl).href
}

/** src/…/x.ts's dist/…/x.js, when it exists and is not older than the source. */
function compiled(tsFile: string): string | undefined {
  const i = tsFile.lastIndexOf('/src/')
  if (i < 0) return undefined
  const js = `${tsFile.slice(0, i)}/dist/${tsFile.slice(i + 5, -3)}.js`
  return existsSync(js) && statSync(js).mtimeMs >= statSync(tsFile).mtimeMs ? js : undefined
}

/**
 * The package root (the directory of pdchaos's package.json) above a module, whatever its depth: a module runs from
 * src/ (tsx), from dist/ as tsc wrote it, or from a chunk of the CLI's bundle (dist/chunks/, scripts/bundle.mjs).
 */
export function packageRootOf(callerUrl: string): string {
  let dir = dirname(fileURLToPath(callerUrl))
  for (let i = 0; i < 8; i++) {
    const pkg = join(dir, 'package.json')
    if (existsSync(pkg) && /"name":\s*"pdchaos"/.test(readFileSync(pkg, 'utf8'))) return dir
    const up = dirname(dir)
    if (up === dir) break
    dir = up
  }
  throw new Error(`pdchaos's package.json not found above ${fileURLToPath(callerUrl)}`)
}

/**
 * The URL of one of the twin's modules (`server/server-main`), from src/ when the caller runs from sources, else dist/.
 */
export function simModule(callerUrl: string, rel: string): string {
  const fromSource = callerUrl.endsWith('.ts')
  return pathToFileURL(
    join(packageRootOf(callerUrl), fromSource ? 'src' : 'dist', 'sim', `${rel}${fromSource ? '.ts' : '.js'}`),
  ).href
}
