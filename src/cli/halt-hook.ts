import {findHalt, type HaltGuard} from '../halt/watch.js'
import type {HaltRecord} from '../model/halt.js'
import {shellQuote} from '../hosts/quote.js'
import {everyHostOf, type Target} from './target.js'

/**
 * The halt's two hooks in TargetCommand.withTarget (issue 32): the command that lifts a halt on the deployment a run
 * was given, for its refusal; and the run's function wrapped so that a run model the halt stopped records it.
 */

/** `pdchaos resume -c FILE`, or `pdchaos resume --sim [--state-dir DIR]`: the same deployment the run named. */
export function resumeCommand(flags: Record<string, unknown>, file: string): string {
  if (flags.sim) {
    const dir = flags['state-dir']
    return `pdchaos resume --sim${typeof dir === 'string' ? ` --state-dir ${shellQuote(dir)}` : ''}`
  }
  return `pdchaos resume -c ${shellQuote(file)}`
}

/** fn, its result marked by the guard when the halt stopped the run. */
export function haltRecorded<T, R>(fn: (t: T) => Promise<R>, guard: HaltGuard): (t: T) => Promise<R> {
  return async t => guard.record(await fn(t))
}

/** `status`'s reading, with the deployment's halt when any host has one (a host that cannot say: omitted). */
export function withHaltOf<R extends object>(
  read: (t: Target) => Promise<R>,
): (t: Target) => Promise<R & {halt?: HaltRecord}> {
  return async t => {
    const [r, halt] = await Promise.all([read(t), findHalt(everyHostOf(t).hosts).catch(() => undefined)])
    return halt ? {...r, halt} : r
  }
}
