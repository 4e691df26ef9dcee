/**
 * The twin's lag options (`sim up --entry-lag-ms N[:J]`, `--answer-lag-ms N[:J]`): not SGLang behaviour but the
 * delays a busy SGLang host puts between pdchaos and its scheduler, so that pdchaos's ε can be shown to cover them.
 * A lag is N ms, drawn uniformly from [N - J, N + J] each time.
 */
export interface Lag {
  ms: number
  jitterMs: number
}

/** The largest lag accepted: longer than any watchdog poll a test would use, short of hiding a deadline. */
export const MAX_LAG_MS = 60_000

/** "N" or "N:J" (ms, J <= N): the lag, or why it is not one. */
export function parseLag(raw: string): Lag | string {
  const m = /^\s*(\d+(?:\.\d+)?)\s*(?::\s*(\d+(?:\.\d+)?)\s*)?$/.exec(raw)
  if (!m) return `"${raw}" is not N or N:JITTER (milliseconds)`
  const ms = Number(m[1])
  const jitterMs = m[2] === undefined ? 0 : Number(m[2])
  if (ms > MAX_LAG_MS) return `${ms} ms is more than ${MAX_LAG_MS} ms`
  if (jitterMs > ms) return `the jitter (${jitterMs} ms) is larger than the lag (${ms} ms)`
  return {ms, jitterMs}
}

/** One draw of the lag, ms (never negative). */
export function drawLag(l: Lag, random: () => number = Math.random): number {
  return Math.max(0, l.ms - l.jitterMs + 2 * l.jitterMs * random())
}

export const describeLag = (l: Lag): string => (l.jitterMs > 0 ? `${l.ms} ms ± ${l.jitterMs} ms` : `${l.ms} ms`)
