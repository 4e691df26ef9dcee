import {existsSync, statSync} from 'node:fs'
import {fileURLToPath} from 'node:url'

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
