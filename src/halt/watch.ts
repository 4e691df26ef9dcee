import {PdError, oneLine} from '../errors.js'
import {ExitCode} from '../exit-codes.js'
import {type HaltRecord, haltLine, markHalted} from '../model/halt.js'
import type {SuiteRun} from '../model/run.js'
import {sleep} from '../util/time.js'
import {type HaltHost, haltPresent, readHalt} from './host-halt.js'

/**
 * The halt, as every run that changes the deployment hears it: before it touches anything it refuses a deployment
 * halted on any of its hosts (exit 2), and while it runs a poller on each host (one `sh` of builtins per interval over
 * the host's open connection) stops it with the halt's who, when and why as the reason: the run's own stop
 * (cli/stop-signal.ts), so it stops between steps, reverts what it holds, records the run and exits 3.
 */

/** Every host's halt, read in parallel; the first found (in the hosts' order). */
export async function findHalt(hosts: HaltHost[], signal?: AbortSignal): Promise<HaltRecord | undefined> {
  const found = await Promise.all(hosts.map(h => readHalt(h, signal ? {signal} : {})))
  return found.find(h => h !== undefined)
}

/** The refusal of a new run while the deployment is halted: exit 2, one line, and how to lift it. */
export function haltedError(halt: HaltRecord, resume: string): PdError {
  return new PdError(`the deployment is ${haltLine(halt)}; no chaos runs until it is resumed`, {
    exit: ExitCode.badInput,
    code: 'E_HALTED',
    suggestion: `${resume} (once the incident is over; \`pdchaos status\` shows the halt)`,
  })
}

/** Exit 2 (E_HALTED) when any host of the deployment is halted; `resume` is the command that lifts it. */
export async function refuseIfHalted(hosts: HaltHost[], resume: string, signal?: AbortSignal): Promise<void> {
  const halt = await findHalt(hosts, signal)
  if (halt) throw haltedError(halt, resume)
}

export interface HaltWatch {
  /** The halt that stopped the run, and when it was noticed (epoch ms); undefined while none. */
  fired(): {halt: HaltRecord; noticedAt: number} | undefined
  close(): Promise<void>
}

/**
 * Poll each host for the halt file every `intervalMs` (default 400: noticed within half a second plus one host
 * command); the first found calls `stop` with its line ("halted by … at …: reason") and the polling ends. A poll that
 * fails (a connection lost) is tried again next interval: the lease guard, not this, answers a lost host. A halt file
 * that fails the ownership checks stops the run too (its refusal is the reason): a kill switch errs towards stopping.
 */
export function watchHalt(
  hosts: HaltHost[],
  stop: (reason: string) => void,
  o: {intervalMs?: number; say?: (line: string) => void} = {},
): HaltWatch {
  const intervalMs = o.intervalMs ?? 400
  const closing = new AbortController()
  let fired: {halt: HaltRecord; noticedAt: number} | undefined
  const pollOne = async (h: HaltHost): Promise<HaltRecord | undefined> => {
    if (!(await haltPresent(h, {timeoutMs: 5000}).catch(() => false))) return undefined
    return readHalt(h, {timeoutMs: 5000}).catch((error: unknown) =>
      error instanceof PdError && error.exitCode === ExitCode.badInput
        ? {by: 'unknown', at: Date.now(), reason: oneLine(error), host: h.name}
        : undefined,
    )
  }
  const loop = (async () => {
    // Bounded: a day of polls; a run ends long before.
    for (let i = 0; !closing.signal.aborted && i < 86_400_000 / intervalMs; i++) {
      const found = (await Promise.all(hosts.map(pollOne))).find(h => h !== undefined)
      if (found && !closing.signal.aborted) {
        fired = {halt: found, noticedAt: Date.now()}
        o.say?.(`HALT: ${haltLine(found)}`)
        stop(haltLine(found))
        return
      }
      await sleep(intervalMs, closing.signal)
    }
  })()
  return {
    fired: () => fired,
    close: async () => {
      closing.abort()
      await loop
    },
  }
}

/** A run's halt guard: the refusal done, the watch running (when the run can be stopped), the run marked if halted. */
export interface HaltGuard {
  /** A run model the halt stopped (a `SuiteRun`: inject, suite) gets the halt and its halted scenarios (model/halt). */
  record<R>(result: R): R
  close(): Promise<void>
}

/**
 * Before a run changes the deployment: refuse it when halted (exit 2), then watch for a halt on every host while it
 * runs. Without `stop` (a command with no stop of its own) only the refusal applies.
 */
export async function guardRun(
  hosts: HaltHost[],
  o: {resume: string; stop?: (reason: string) => void; say?: (line: string) => void; signal?: AbortSignal},
): Promise<HaltGuard> {
  await refuseIfHalted(hosts, o.resume, o.signal)
  const watch = o.stop ? watchHalt(hosts, o.stop, o.say ? {say: o.say} : {}) : undefined
  return {
    record: <R>(result: R): R => {
      const f = watch?.fired()
      if (f && isRun(result)) markHalted(result, f.halt, f.noticedAt)
      return result
    },
    close: async () => {
      // A poll under way is let finish in the background (each has its deadline); the run's exit never waits on it.
      await Promise.race([watch?.close(), sleep(200)])
    },
  }
}

function isRun(x: unknown): x is SuiteRun {
  const r = x as Partial<SuiteRun> | undefined
  return typeof r === 'object' && r !== null && Array.isArray(r.scenarios) && typeof r.startedAt === 'number'
}
