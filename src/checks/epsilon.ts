import {describeLags, lagAllowanceMs} from '../model/lags.js'
import {observeDelayMs, type Timeline} from '../model/timeline.js'

/**
 * The error pdchaos allows around the watchdog window, from what it measured, never a guess: the answer reaches
 * pdchaos up to one observation delay after the server acted, and the entry into the watched queue is known only
 * from the send time (scope all) or the send time plus the calibrated prefill time (scope inflight).
 */
export interface Epsilon {
  /** Allowed on the early side: the answer can never precede the eviction, so only timer granularity. */
  lowMs: number
  /** Allowed on the late side: observation delay twice (arrival, answer) plus the entry uncertainty. */
  highMs: number
  /** Offset from the send time to the entry into the watched queue. */
  entryOffsetMs: number
  why: string
}

/** The smallest ε ever allowed: timers and the scheduler loop's own iteration. */
export const EPSILON_FLOOR_MS = 5

export function epsilonFor(
  tl: Timeline,
  queue: 'bootstrap' | 'waiting' | 'inflight' | 'unknown',
  pin?: {sentAt: number; answeredAt?: number},
): Epsilon {
  const c = tl.calibration
  const d = observeDelayMs(tl, pin)
  const observe = d.ms
  const measured =
    d.source === 'near'
      ? `observation delay ${observe.toFixed(1)} ms, the slowest of ${d.probes} probe(s) around this request's ` +
        `send and answer (${c.observeMs.toFixed(1)} ms idle, p99 over ${c.samples} unfaulted requests)`
      : d.source === 'window'
        ? `observation delay p99 ${observe.toFixed(1)} ms while the pins were out (${c.observeMs.toFixed(1)} ms ` +
          `idle, over ${c.samples} unfaulted requests)`
        : `observation delay p99 ${observe.toFixed(1)} ms over ${c.samples} unfaulted requests`
  const late = lateAllowance(tl, observe, measured)
  if (tl.contract.scope === 'inflight' && queue === 'inflight') {
    const spread = Math.max(c.prefillSpreadMs, 1)
    // The calibrated prefill time carries one entry and one answer lag (their medians): a pin whose lags were
    // shorter than those is answered earlier than the offset assumes, so the early side allows them.
    const carried = c.lags ? (c.lags.entry?.p50Ms ?? 0) + c.lags.answer.p50Ms : 0
    return {
      lowMs: EPSILON_FLOOR_MS + spread / 2 + carried,
      highMs: EPSILON_FLOOR_MS + late.ms + spread / 2,
      entryOffsetMs: c.prefillMs,
      why:
        `entry into the inflight queue = send + ${c.prefillMs.toFixed(1)} ms calibrated prefill time ` +
        `(spread ${spread.toFixed(1)} ms over ${c.samples} unfaulted requests` +
        `${
          carried > 0
            ? `; the early side also allows the ${carried.toFixed(1)} ms of median lags that time ` + `carries`
            : ''
        }); ${late.why}; floor ${EPSILON_FLOOR_MS} ms`,
    }
  }
  return {
    lowMs: EPSILON_FLOOR_MS,
    highMs: EPSILON_FLOOR_MS + late.ms,
    entryOffsetMs: 0,
    why:
      `entry into the bootstrap queue = send ` +
      `time${
        c.lags
          ? ' (the entry lag after it is allowed on the late ' + 'side)'
          : ' (the request reaches prefill within one observation delay)'
      }; ` +
      `${late.why}; floor ${EPSILON_FLOOR_MS} ms`,
  }
}

/**
 * What the late side allows beyond the floor. Without measured lags: the observation delay twice (arrival, answer).
 * With them: the slowest entry lag plus the slowest answer lag measured at calibration, plus what the observation
 * delay around this pin exceeded its idle value by (a moment busier than calibration: a probe is two round trips, so
 * its excess already covers the request's way in and the answer's way out), never less than the observation delay
 * twice.
 */
function lateAllowance(tl: Timeline, observe: number, measured: string): {ms: number; why: string} {
  const c = tl.calibration
  if (!c.lags) return {ms: 2 * observe, why: `${measured}, counted twice`}
  const busier = Math.max(0, observe - Math.max(c.observeMs, 1))
  const lagged = lagAllowanceMs(c.lags) + busier
  const twice = 2 * observe
  return lagged >= twice
    ? {
        ms: lagged,
        why:
          `late side widened by the measured lags, ${lagAllowanceMs(c.lags).toFixed(1)} ms ` +
          `(${describeLags(c.lags)})${
            busier > 0
              ? `, plus the ${busier.toFixed(1)} ms by which the observation ` +
                `delay around this pin exceeded idle (${measured})`
              : ''
          }`,
      }
    : {
        ms: twice,
        why:
          `${measured}, counted twice (more than the measured lags, ${lagAllowanceMs(c.lags).toFixed(1)} ` +
          `ms: ${describeLags(c.lags)})`,
      }
}

/** A pin whose measured time is within ε of a bound: judged as it is, but the verdict rests on ε being right. */
export interface Edge {
  bound: 'low' | 'high'
  /** Distance from the bound, ms (positive inside the window, negative outside). */
  marginMs: number
  note: string
}

/**
 * At the edge: inside the window but within the late-side ε of its opening (an eviction up to that much early would
 * look the same, its lags hiding it) or of its close (passed only because ε allows that much lag), or outside it by
 * less than ε (a lag larger than measured would move it inside).
 */
export function edgeOf(answeredAt: number, low: number, high: number, eps: Epsilon): Edge | undefined {
  const e = eps.highMs
  const fromLow = answeredAt - low
  const toHigh = high - answeredAt
  const r = (x: number) => Math.round(x * 10) / 10
  const nearLow = fromLow >= -eps.lowMs && fromLow <= e
  const nearHigh = toHigh >= -e && toHigh <= e
  if (nearHigh && (!nearLow || toHigh <= fromLow)) {
    return {
      bound: 'high',
      marginMs: r(toHigh),
      note:
        toHigh >= 0
          ? `at the edge: ${r(toHigh)} ms inside the window's close, within ε (${r(e)} ms): a watchdog up to that ` +
            `late would look the same`
          : `at the edge: ${r(-toHigh)} ms past the window's close, within ε (${r(e)} ms): a lag that much larger ` +
            `than measured would put it inside`,
    }
  }
  if (nearLow) {
    return {
      bound: 'low',
      marginMs: r(fromLow),
      note:
        fromLow >= 0
          ? `at the edge: ${r(fromLow)} ms after the window opens, within ε (${r(e)} ms): an eviction up to that ` +
            `much early would look the same`
          : `at the edge: ${r(-fromLow)} ms before the window opens, within ε (${r(eps.lowMs)} ms)`,
    }
  }
  return undefined
}
