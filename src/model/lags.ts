/**
 * The two lags between a pin and its verdict, measured at calibration on held requests (experiment/lag-probes.ts):
 * a request enters the scheduler's queue some time after its send (the scheduler takes new requests once per loop
 * iteration, and an iteration can be a long forward pass), and its answer reaches pdchaos some time after the server
 * released it. pdchaos's clock is the send and the answer, so both lags add to every measured time.
 */
export interface MeasuredLags {
  /** Held requests out at once while measuring (the pins' concurrency, capped). */
  concurrency: number
  /** Probes released by their abort and answered (the samples behind `answer`). */
  samples: number
  /**
   * Send → entry into the prefill bootstrap queue: the first /v1/loads?include=disagg snapshot that counts the
   * request (an upper bound: the snapshot is read over HTTP). Absent: the host offers no live queue count.
   */
  entry?: {p50Ms: number; maxMs: number; samples: number}
  /**
   * Release → pdchaos reading the answer: abort sent → answer read, less that request's entry lag (the abort takes
   * the same way into the scheduler as the request did). includesEntry: entry could not be measured, so this is
   * the whole abort → answer time, entry lag included.
   */
  answer: {p50Ms: number; maxMs: number; includesEntry: boolean}
  /** What was not a sample, and why (released before its abort, no answer in time...). */
  notes: string[]
}

/** The lag ε must allow on the late side: the slowest entry plus the slowest answer seen. */
export const lagAllowanceMs = (l: MeasuredLags): number => (l.entry?.maxMs ?? 0) + l.answer.maxMs

export function describeLags(l: MeasuredLags): string {
  const entry = l.entry
    ? `entry lag (send → queue entry, first /v1/loads snapshot counting it) p50 ${l.entry.p50Ms.toFixed(1)} ms, ` +
      `max ${l.entry.maxMs.toFixed(1)} ms`
    : 'entry lag not measured separately (no live queue count in /v1/loads)'
  const answer =
    `answer lag (release → answer read, from aborts of held ` +
    `requests${l.answer.includesEntry ? ', entry lag included' : ''}) p50 ${l.answer.p50Ms.toFixed(1)} ms, ` +
    `max ${l.answer.maxMs.toFixed(1)} ms`
  return `${entry}; ${answer}; over ${l.samples} held request(s), ${l.concurrency} out at once`
}
