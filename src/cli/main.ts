import {flush, run, type Interfaces} from '@oclif/core'

// bin/run.js sets oclif's settings through this module: in the bundle (scripts/bundle.mjs) it is the one oclif.
export {settings} from '@oclif/core'

import {badInput} from '../errors.js'
import {argvWantsJson, errorDocument, isExitRequest, writeError} from './error-output.js'

/**
 * pdchaos's entry (bin/run.js, bin/dev.js): oclif's run, with the errors raised before any command runs (an unknown
 * command, a flag given before the command) rendered as every command renders its own: one line, a suggestion, and
 * under --json one document with a code on stdout (oclif alone prints a styled line on stderr and nothing on stdout).
 */
export async function main(load: Interfaces.LoadOptions, argv: string[] = process.argv.slice(2)): Promise<void> {
  const outputClosed = keepRunningWhenOutputCloses()
  try {
    await run(argv, load)
    // flush() waits for stdout to drain, which a closed pipe never does.
    await Promise.race([flush(), outputClosed])
  } catch (error) {
    if (isExitRequest(error)) {
      process.exitCode = (error as {oclif?: {exit?: number}}).oclif?.exit ?? 0
      return
    }
    const json = argvWantsJson(argv)
    const verbose = argv.includes('--verbose')
    writeError(errorDocument(beforeCommand(argv) ?? error), {json, verbose, stack: (error as Error).stack})
  }
}

/** A flag where the command belongs (`pdchaos --json status`): oclif calls it an unknown command named "--json". */
function beforeCommand(argv: string[]): Error | undefined {
  const first = argv[0]
  if (first === undefined || !first.startsWith('-')) return undefined
  return badInput(`${first} comes before the command: pdchaos takes its flags after the command`,
    `write the command first, then its flags: \`pdchaos <command> ${first} …\` (\`pdchaos --help\` lists the commands)`)
}

/**
 * A reader that goes away (`pdchaos status | head -1`, an SSH session cut while `sim up` prints) makes the next write
 * fail with EPIPE, which node raises as an uncaught error: a stack trace, and a command killed halfway, before it
 * reverts what it injected. The output is lost either way; the command finishes its work and keeps its exit code.
 */
function keepRunningWhenOutputCloses(): Promise<void> {
  // Once per process: a caller that runs main more than once (a test running the CLI in-process) adds no listeners.
  outputClosed ??= new Promise((resolve) => {
    for (const stream of [process.stdout, process.stderr]) {
      stream.on('error', (error: NodeJS.ErrnoException) => {
        if (error.code !== 'EPIPE' && error.code !== 'ERR_STREAM_DESTROYED') throw error
        resolve()
      })
    }
  })
  return outputClosed
}

let outputClosed: Promise<void> | undefined
