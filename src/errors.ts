import {ExitCode, type ExitCodeValue} from './exit-codes.js'
import {redactText} from './util/redact.js'

/**
 * An error a user can act on: a one-line cause, a suggestion, and the exit code the README assigns.
 * Library code throws these; the base command renders them without a stack trace.
 */
export class PdError extends Error {
  readonly exitCode: ExitCodeValue
  readonly suggestion?: string
  readonly code: string

  constructor(message: string, opts: {exit: ExitCodeValue; suggestion?: string; code?: string; cause?: unknown}) {
    // A URL's password never reaches the user's terminal or a JSON error (issue 12, S4).
    super(redactText(message), opts.cause === undefined ? undefined : {cause: opts.cause})
    this.name = 'PdError'
    this.exitCode = opts.exit
    this.suggestion = opts.suggestion === undefined ? undefined : redactText(opts.suggestion)
    this.code = opts.code ?? codeForExit(opts.exit)
  }
}

/** The error code of an exit code, for --json error documents. */
export function codeForExit(exit: number): string {
  switch (exit) {
    case ExitCode.badInput:
      return 'E_INPUT'
    case ExitCode.unreachable:
      return 'E_UNREACHABLE'
    case ExitCode.stopped:
      return 'E_STOPPED'
    case ExitCode.cleanupUnverified:
      return 'E_CLEANUP'
    case ExitCode.checkFailed:
      return 'E_CHECK'
    default:
      return 'E_PDCHAOS'
  }
}

export const badInput = (message: string, suggestion?: string): PdError =>
  new PdError(message, {exit: ExitCode.badInput, suggestion})

export const unreachable = (message: string, suggestion?: string, cause?: unknown): PdError =>
  new PdError(message, {exit: ExitCode.unreachable, suggestion, cause})

/** One line, whatever the thrown value was, with any URL's credentials redacted. */
export function oneLine(err: unknown): string {
  const text = redactText(err instanceof Error ? err.message : String(err))
  return text
    .split('\n')
    .map(l => l.trim())
    .filter(Boolean)
    .join(' ')
}
