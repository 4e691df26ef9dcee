import type {ScenarioRun, SuiteRun} from './run.js'

/**
 * The kill switch (`pdchaos halt`, issue 32): a file `halt.json` in the deployment's state dir on every host. While it
 * is there, no pdchaos run acts on the deployment: a run under way stops between steps and reverts what it holds, a new
 * one refuses, and each lease's host-side reverter reverts its fault at once. This module is the pure half: the
 * record, how it reads back, how it is said, and how a halted run is recorded. halt/ holds the host half.
 */

/** The file's name in the state dir (beside leases/ and lock.json). */
export const HALT_FILE = 'halt.json'
/** A halt file is read up to this size; a longer one still halts, its record unread. */
export const HALT_MAX_BYTES = 4096
/** A halt's reason is cut to this many characters (the file stays well under HALT_MAX_BYTES). */
export const HALT_REASON_MAX = 500

export interface HaltRecord {
  /** user@machine of whoever ran `pdchaos halt`. */
  by: string
  /** When, epoch ms, on the clock of the machine that halted (0: unknown). */
  at: number
  reason: string
  /** The machine that noticed a halt names the host it found it on (set when read, not stored). */
  host?: string
}

/** The record to store for a halt: the reason on one line (control characters dropped), bounded. */
export function newHalt(by: string, at: number, reason: string | undefined): HaltRecord {
  const clean = (reason ?? '').replace(/[\u0000-\u001f\u007f]+/g, ' ').trim()
  return {by, at, reason: clean === '' ? 'no reason given' : clean.slice(0, HALT_REASON_MAX)}
}

/** The halt file's text: one JSON line. */
export function haltText(h: HaltRecord): string {
  return JSON.stringify({pdchaos: 1, by: h.by, at: h.at, reason: h.reason})
}

/**
 * A halt file's text as a record. Whatever it holds, the deployment is halted: a file that cannot be read as a
 * record (truncated, hand-edited, over the size limit) still halts, with a reason that says so.
 */
export function parseHalt(text: string, host?: string): HaltRecord {
  const on = host === undefined ? {} : {host}
  let data: unknown
  try {
    data = JSON.parse(text)
  } catch {
    data = undefined
  }
  const o = typeof data === 'object' && data !== null ? (data as Record<string, unknown>) : {}
  const ok =
    typeof o.by === 'string' && typeof o.reason === 'string' && typeof o.at === 'number' && Number.isFinite(o.at)
  if (!ok) return {by: 'unknown', at: 0, reason: `an unreadable halt file (${HALT_FILE})`, ...on}
  return {...newHalt(String(o.by).slice(0, 200), o.at as number, String(o.reason)), ...on}
}

/** "halted by alice@ops1 at 2026-12-04T03:12:00.000Z: INC-4411, prefill OOMs" (and "on gpu-a" when known). */
export function haltLine(h: HaltRecord): string {
  const when = Number.isFinite(h.at) && h.at > 0 && h.at <= 8.64e15 ? new Date(h.at).toISOString() : 'an unknown time'
  return (
    `halted by ${h.by} at ${when}${h.host === undefined || h.host === 'host' ? '' : ` (on ${h.host})`}: ` +
    `${h.reason}`
  )
}

/**
 * A run the halt stopped: `stopped` names the halt, and every scenario that had not finished when the halt was noticed
 * (still running, or never run) is marked `halted`. A scenario that finished before keeps its verdicts as they are.
 */
export function markHalted(run: SuiteRun, halt: HaltRecord, noticedAt: number): SuiteRun {
  run.stopped = {reason: haltLine(halt), halt}
  for (const s of run.scenarios) if (unfinished(s, noticedAt)) s.status = 'halted'
  return run
}

function unfinished(s: ScenarioRun, noticedAt: number): boolean {
  return s.error !== undefined || s.verdicts.length === 0 || s.finishedAt >= noticedAt
}

/** A run's halted scenarios (the reports name them). */
export function haltedScenarios(run: SuiteRun): ScenarioRun[] {
  return run.scenarios.filter(s => s.status === 'halted')
}
