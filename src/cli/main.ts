import {flush, run, type Interfaces} from '@oclif/core'

// bin/run.js sets oclif's settings through this module: in the bundle (scripts/bundle.mjs) it is the one oclif.
export {settings} from '@oclif/core'

import {badInput} from '../errors.js'
import {ExitCode} from '../exit-codes.js'
import {argvWantsJson, errorDocument, isExitRequest, writeError} from './error-output.js'
import {stoppedBySignal} from './stop-signal.js'

/**
 * pdchaos's entry (bin/run.js, bin/dev.js): oclif's run, with the errors raised before any command runs (an unknown
 * command, a flag given before the command) rendered as every command renders its own: one line, a suggestion, and
 * under --json one document with a code on stdout (oclif alone prints a styled line on stderr and nothing on stdout).
 */
export async function main(load: Interfaces.LoadOptions, argv: string[] = process.argv.slice(2)): Promise<void> {
  const outputClosed = keepRunningWhenOutputCloses()
  exitOnUnhandledStop()
  try {
    if (argvWantsJson(argv) && argvWantsHelp(argv)) await helpAsJson(() => run(argv, load))
    else await run(argv, load)
    // flush() waits for stdout to drain, which a closed pipe never does.
    await Promise.race([flush(), outputClosed])
    // Stopped by a signal and reported: leftover probes (each with its deadline) do not hold the exit back.
    if (stoppedBySignal()) process.exit(process.exitCode ?? ExitCode.stopped)
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

/**
 * A SIGINT or SIGTERM that no command is listening for (while oclif loads the command, or in a command that holds
 * nothing: status, report, schema) ends the process at once with the README's "stopped" (3), not node's default death
 * by signal. A command that holds something (a run, a lease, a twin starting) has its own listener, and this one
 * then leaves the signal to it.
 */
function exitOnUnhandledStop(): void {
  // bin/run.js installs the same handlers before it loads anything (a signal during the load is heard too).
  const mark = Symbol.for('pdchaos.unhandled-stop')
  if ((process as unknown as Record<symbol, unknown>)[mark]) return
  ;(process as unknown as Record<symbol, unknown>)[mark] = true
  for (const signal of ['SIGINT', 'SIGTERM'] as const) {
    process.on(signal, () => {
      if (process.listenerCount(signal) === 1) process.exit(ExitCode.stopped)
    })
  }
}

/** --help or -h before any `--`. */
function argvWantsHelp(argv: string[]): boolean {
  const end = argv.indexOf('--')
  return argv.some((a, i) => (a === '--help' || a === '-h') && (end === -1 || i < end))
}

/**
 * `--json --help`: help wins, as oclif has it (the command does not run), but stdout still holds one JSON document and
 * nothing else: {"help": TEXT}, the help text a terminal would show. A JSON consumer never gets text it cannot parse.
 */
async function helpAsJson(show: () => Promise<unknown>): Promise<void> {
  const chunks: string[] = []
  const write = process.stdout.write.bind(process.stdout)
  process.stdout.write = ((chunk: string | Uint8Array) => {
    chunks.push(typeof chunk === 'string' ? chunk : Buffer.from(chunk).toString('utf8'))
    return true
  }) as typeof process.stdout.write
  try {
    await show()
  } finally {
    process.stdout.write = write
  }
  write(JSON.stringify({help: chunks.join('').replace(/\x1b\[[0-9;]*m/g, '')}, null, 2) + '\n')
}

/** A flag where the command belongs (`pdchaos --json status`): oclif calls it an unknown command named "--json". */
function beforeCommand(argv: string[]): Error | undefined {
  const first = argv[0]
  if (first === undefined || !first.startsWith('-')) return undefined
  return badInput(
    `${first} comes before the command: pdchaos takes its flags after the command`,
    `write the command first, then its flags: \`pdchaos <command> ${first} …\` (\`pdchaos --help\` lists the commands)`,
  )
}

/**
 * A reader that goes away (`pdchaos status | head -1`, an SSH session cut while `sim up` prints) makes the next write
 * fail with EPIPE, which node raises as an uncaught error: a stack trace, and a command killed halfway, before it
 * reverts what it injected. The output is lost either way; the command finishes its work and keeps its exit code.
 */
function keepRunningWhenOutputCloses(): Promise<void> {
  // Once per process: a caller that runs main more than once (a test running the CLI in-process) adds no listeners.
  outputClosed ??= new Promise(resolve => {
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
