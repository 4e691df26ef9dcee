import {setCurrentStop} from '../util/stop.js'

/**
 * The stop of a command: one AbortController whose signal every phase of the run honours (file parsing, health
 * checks, discovery, planning, injection, observation; util/stop.ts). SIGINT (Ctrl-C) and SIGTERM (a scheduler's
 * deadline) abort it; so may any other source given `stop` (a halt file noticed by polling), with its own reason.
 * A stopped run reverts what it holds through its own flow and exits 3; a second signal is the lease guard's.
 */

export interface StopSignalOptions {
  /** Told of each signal: the first (`again` false) aborts the run; later ones only this (default: nothing). */
  onSignal?: (signal: NodeJS.Signals, again: boolean) => void
}

export interface StopSignal {
  signal: AbortSignal
  /** Stop the run from another source than a process signal; the reason is what the run reports. */
  stop(reason: string): void
}

/** Run fn with SIGINT and SIGTERM aborting its signal; the handlers are removed when fn settles. */
export async function withStopSignal<R>(fn: (stop: StopSignal) => Promise<R>, o: StopSignalOptions = {}): Promise<R> {
  const controller = new AbortController()
  const stop = (reason: string): void => {
    if (!controller.signal.aborted) controller.abort(reason)
  }
  const onSignal = (signal: NodeJS.Signals): void => {
    signalled = true
    o.onSignal?.(signal, controller.signal.aborted)
    stop(`interrupted (${signal})`)
  }
  process.on('SIGINT', onSignal)
  process.on('SIGTERM', onSignal)
  const restore = setCurrentStop(controller.signal)
  try {
    return await fn({signal: controller.signal, stop})
  } finally {
    restore()
    process.removeListener('SIGINT', onSignal)
    process.removeListener('SIGTERM', onSignal)
  }
}

let signalled = false

/**
 * A process signal stopped a command. Once the command has reported (its error or its stopped run, its journal),
 * main ends the process at once: a probe or a host read still under way (each bounded by its deadline) must not keep
 * it alive for seconds after the user asked it to stop.
 */
export function stoppedBySignal(): boolean {
  return signalled
}
