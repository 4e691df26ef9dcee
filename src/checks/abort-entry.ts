import type {Attribution} from './release-cause.js'
import type {AbortEntry} from '../model/run.js'
import type {Timeline} from '../model/timeline.js'

/**
 * Had the trial's request entered prefill before its abort arrived? SGLang drops an abort for a rid it does not
 * know yet (managers/tokenizer_manager.py abort_request returns when the rid is not in rid_to_state; the
 * scheduler's abort_request, managers/scheduler.py, finds nothing to abort in its queues), so an abort that
 * arrived first was never lost: it did not land. A trial is judged lost only once its entry before the abort is
 * shown; when the evidence puts the entry after the abort it is "not landed"; otherwise entry is unknown.
 * Pure: from the answer's words, the watchdog's own count of the time it held the request (its log line or its
 * words in the answer), and the entry lags measured at calibration (/v1/loads?include=disagg counts).
 */

/** The watchdog's words in an answer: "evicted by the disaggregation watchdog after 2.514s in the … queue". */
const WATCHDOG_HELD = /watchdog\b[^.]*?\bafter (\d+(?:\.\d+)?)\s*s\b/i

export function heldSecondsOf(
  detail: string | undefined,
  released?: Pick<Attribution, 'watchdogHeldSeconds'>,
): number | undefined {
  if (released?.watchdogHeldSeconds !== undefined) return released.watchdogHeldSeconds
  const m = WATCHDOG_HELD.exec(detail ?? '')
  return m ? Number(m[1]) : undefined
}

export interface EntryFacts {
  sentAt: number
  abortAt: number
  answer?: {t: number; detail?: string}
  released?: Pick<Attribution, 'cause' | 'watchdogHeldSeconds'>
  /** The late-side allowance for the answer's way out (ε high): the watchdog's count is read from a late answer. */
  answerLagMs: number
}

const ms = (x: number): string => `${Math.round(x)} ms`

export function entryOf(tl: Timeline, f: EntryFacts): AbortEntry {
  const offset = f.abortAt - f.sentAt
  // An abort that released the request found it there (prefill's own words, or decode's ABORT failing its room).
  if (f.answer && f.answer.t > f.abortAt && (f.released?.cause === 'abort' || f.released?.cause === 'decode-abort')) {
    const evidence = "the abort released it (the answer's words): the request was there when it arrived"
    return {shown: 'before', source: 'answer', evidence}
  }
  const held = heldSecondsOf(f.answer?.detail, f.released)
  if (f.answer && held !== undefined && f.released?.cause === 'watchdog') {
    // The watchdog counts from the request's entry into its watched queue: entry = eviction - held. The answer
    // reaches pdchaos up to one answer lag after the eviction, so the entry read this way is at most that late.
    const entryAt = f.answer.t - held * 1000
    const queue = tl.contract.scope === 'inflight' ? 'the inflight queue' : "prefill's bootstrap queue"
    const atMs = Math.round(entryAt - f.sentAt)
    const said =
      `the watchdog held it ${held.toFixed(3)} s, so it entered ${queue} by +${ms(entryAt - f.sentAt)} ` +
      'after the send'
    const abort = `its abort (+${ms(offset)})`
    const lag = `${ms(f.answerLagMs)} answer lag allowed`
    if (entryAt <= f.abortAt) return {shown: 'before', source: 'watchdog', atMs, evidence: `${said}, before ${abort}`}
    // Only the bootstrap queue is entry into prefill: entering the inflight queue late says nothing of before.
    if (tl.contract.scope !== 'inflight' && entryAt - f.answerLagMs > f.abortAt) {
      return {shown: 'after', source: 'watchdog', atMs, evidence: `${said} (${lag}), after ${abort}`}
    }
    return {shown: 'unknown', source: 'watchdog', atMs, evidence: `${said}, within the ${lag} of ${abort}`}
  }
  // No count for this request: the entry lags measured at calibration, when the host offers a live queue count.
  const entry = tl.calibration.lags?.entry
  if (entry && offset > entry.maxMs) {
    return {
      shown: 'before',
      source: 'calibration',
      evidence:
        `inferred: the abort was fired +${ms(offset)} after the ` +
        `send, later than the slowest of ${entry.samples} entries measured at calibration (${ms(entry.maxMs)}, ` +
        '/v1/loads?include=disagg)',
    }
  }
  return {
    shown: 'unknown',
    source: 'none',
    evidence: entry
      ? `the abort was fired +${ms(offset)} after the send, within the slowest entry measured at calibration ` +
        `(${ms(entry.maxMs)}), and nothing counts this request's own entry`
      : 'nothing shows when it entered prefill (no watchdog count in its answer or log, and no live queue count at ' +
        'calibration: /v1/loads?include=disagg has no disagg section)',
  }
}

/** Why a trial is not counted for want of entry (undefined: its entry before the abort is shown). */
export function notEnteredWhy(e: AbortEntry): string | undefined {
  if (e.shown === 'before') return undefined
  return e.shown === 'after'
    ? `not landed: it entered prefill after its abort (${e.evidence})`
    : `not shown to have entered prefill before its abort (${e.evidence})`
}
