import {fileURLToPath} from 'node:url'

/**
 * The argv to run one of the twin's entry modules as its own process: compiled JS runs directly,
 * TypeScript sources (tests, bin/dev.js) run through tsx.
 */
export function entryArgv(moduleUrl: string, ...args: string[]): {command: string; args: string[]} {
  const file = fileURLToPath(moduleUrl)
  const viaTsx = file.endsWith('.ts')
  return {command: process.execPath, args: [...(viaTsx ? ['--import', 'tsx'] : []), file, ...args]}
}

/** The URL of a sibling module with the same extension as the caller (.ts in src, .js in dist). */
export function sibling(callerUrl: string, baseName: string): string {
  const ext = callerUrl.endsWith('.ts') ? '.ts' : '.js'
  return new URL(`./${baseName}${ext}`, callerUrl).href
}
