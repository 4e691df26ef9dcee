/**
 * The twin's own errors: what went wrong, in the twin's words, and what to do about it. The twin knows nothing
 * of the CLI's exit codes; the CLI (src/cli/twin.ts) maps each kind to one.
 */

/**
 * - bad-input: the caller asked for something the twin cannot do (a bad option, a state dir in use, a port taken).
 * - unavailable: a service did not start or did not become healthy.
 * - cleanup-unverified: a process of the twin could not be stopped.
 */
export type SimErrorKind = 'bad-input' | 'unavailable' | 'cleanup-unverified'

export class SimError extends Error {
  readonly kind: SimErrorKind
  /** The next step for whoever reads the message (a command to run, a flag to pass). */
  readonly suggestion?: string

  constructor(kind: SimErrorKind, message: string, opts: {suggestion?: string; cause?: unknown} = {}) {
    super(message, opts.cause === undefined ? undefined : {cause: opts.cause})
    this.name = 'SimError'
    this.kind = kind
    this.suggestion = opts.suggestion
  }
}

export const badInput = (message: string, suggestion?: string): SimError =>
  new SimError('bad-input', message, {suggestion})

export const unavailable = (message: string, suggestion?: string, cause?: unknown): SimError =>
  new SimError('unavailable', message, {suggestion, cause})

/** The exit status of a process interrupted (SIGINT, SIGTERM) while `up` starts the twin. */
export const EXIT_INTERRUPTED = 3
