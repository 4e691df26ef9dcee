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

export function epsilonFor(tl: Timeline, queue: 'bootstrap' | 'waiting' | 'inflight' | 'unknown', pin?: {sentAt: number; answeredAt?: number}): Epsilon {
  const c = tl.calibration
  const d = observeDelayMs(tl, pin)
  const observe = d.ms
  const measured = d.source === 'near'
    ? `observation delay ${observe.toFixed(1)} ms, the slowest of ${d.probes} probe(s) around this request's send and answer (${c.observeMs.toFixed(1)} ms idle, p99 over ${c.samples} unfaulted requests)`
    : d.source === 'window'
      ? `observation delay p99 ${observe.toFixed(1)} ms while the pins were out (${c.observeMs.toFixed(1)} ms idle, over ${c.samples} unfaulted requests)`
      : `observation delay p99 ${observe.toFixed(1)} ms over ${c.samples} unfaulted requests`
  if (tl.contract.scope === 'inflight' && queue === 'inflight') {
    const spread = Math.max(c.prefillSpreadMs, 1)
    return {
      lowMs: EPSILON_FLOOR_MS + spread / 2,
      highMs: EPSILON_FLOOR_MS + 2 * observe + spread / 2,
      entryOffsetMs: c.prefillMs,
      why: `entry into the inflight queue = send + ${c.prefillMs.toFixed(1)} ms calibrated prefill time (spread ${spread.toFixed(1)} ms over ${c.samples} unfaulted requests); ` +
        `${measured}, counted twice; floor ${EPSILON_FLOOR_MS} ms`,
    }
  }
  return {
    lowMs: EPSILON_FLOOR_MS,
    highMs: EPSILON_FLOOR_MS + 2 * observe,
    entryOffsetMs: 0,
    why: `entry into the bootstrap queue = send time (the request reaches prefill within one observation delay); ` +
      `${measured}, counted twice; floor ${EPSILON_FLOOR_MS} ms`,
  }
}
