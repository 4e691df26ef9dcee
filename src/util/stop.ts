import {PdError} from '../errors.js'
import {ExitCode} from '../exit-codes.js'

/**
 * The run's one stop: an AbortSignal that every phase honours (file parsing, health checks, discovery, planning,
 * injection, observation). Whatever aborts it (SIGINT, SIGTERM, a halt file noticed by polling), a phase that has
 * changed nothing yet ends with `stoppedError` (exit 3) within a second; a phase that holds faults reverts them
 * through its own flow first.
 */

/** Exit 3, saying what was under way and that nothing was changed by it. */
export function stoppedError(signal: AbortSignal, phase: string, done = 'stopped before changing anything'): PdError {
  // A stop's reason: "interrupted (SIGINT)", or a stop condition's (an Error whose message says it).
  const why =
    typeof signal.reason === 'string'
      ? signal.reason
      : signal.reason instanceof Error
        ? signal.reason.message
        : 'stopped'
  return new PdError(`${why} during ${phase}: ${done}`, {
    exit: ExitCode.stopped,
    code: 'E_STOPPED',
    suggestion: 'run the command again when you are ready',
  })
}

/** Throw `stoppedError` when the signal has been aborted (between two phases, after a synchronous step). */
export function throwIfStopped(signal: AbortSignal | undefined, phase: string, done?: string): void {
  if (signal?.aborted) throw stoppedError(signal, phase, done)
}

/**
 * `work`, or `stoppedError` as soon as the signal aborts, whichever comes first. For a wait that has its own deadline
 * but no cancel of its own (an SSH connect, a discovery's host commands): the work still ends at its deadline, and
 * its late result or error is dropped here.
 */
export function abortable<T>(
  work: Promise<T>,
  signal: AbortSignal | undefined,
  phase: string,
  done?: string,
): Promise<T> {
  if (!signal) return work
  if (signal.aborted) {
    work.catch(() => {})
    return Promise.reject(stoppedError(signal, phase, done))
  }
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(stoppedError(signal, phase, done))
    signal.addEventListener('abort', onAbort, {once: true})
    work.then(
      v => {
        signal.removeEventListener('abort', onAbort)
        resolve(v)
      },
      (error: unknown) => {
        signal.removeEventListener('abort', onAbort)
        reject(error)
      },
    )
  })
}

/** Let the event loop run (a signal handler, a timer) inside a long synchronous loop; every ~50 ms at most. */
export function yielder(everyMs = 50): () => Promise<void> {
  let last = performance.now()
  return async () => {
    if (performance.now() - last < everyMs) return
    await new Promise(resolve => setImmediate(resolve))
    last = performance.now()
  }
}

/** The stop of the command under way (cli/stop-signal.ts sets it), for work that is not handed a signal. */
let current: AbortSignal | undefined

/**
 * The stop of the command under way, if any: reading a file (a large YAML parses in a worker that a stop
 * terminates) is reached from many callers that have no signal to pass.
 */
export function currentStop(): AbortSignal | undefined {
  return current
}

/** Make `signal` the current stop until the returned function restores the one before it. */
export function setCurrentStop(signal: AbortSignal): () => void {
  const before = current
  current = signal
  return () => {
    current = before
  }
}
