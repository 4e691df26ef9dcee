import {type LogClock, parseLogLine} from './log-lines.js'

/**
 * P's lease renewals as P logs them, at DEBUG only: nixl/base_worker.py `_handle_heartbeat` logs, for each request a
 * heartbeat names that P still holds, `logger.debug("Heartbeat extended lease for request %s by %ds (old_expiry=%.1f,
 * new_expiry=%.1f)", …)` (its expiries are P's perf_counter, not a wall clock: only the line's time is used). No
 * counter counts heartbeats (the worker's xfer_stats records expiries, not renewals), so without VLLM_LOGGING_LEVEL=
 * DEBUG on P a renewal cannot be seen from outside. Pure: text in, observations out.
 */

export interface RenewalObservation {
  /** Epoch ms of the log's timestamp: the renewal happened in [t, t + resolutionMs). */
  t: number
  resolutionMs: number
  requestId: string
  extensionS: number
  line: string
}

const RENEWAL = /^Heartbeat extended lease for request (\S+) by (\d+)s\b/

/** Every renewal a log text names, in the log's order. */
export function parseRenewalLog(text: string, clock: LogClock): RenewalObservation[] {
  const out: RenewalObservation[] = []
  for (const raw of text.split('\n')) {
    if (!raw.includes('Heartbeat extended lease')) continue
    const l = parseLogLine(raw, clock)
    const m = l ? RENEWAL.exec(l.msg) : null
    if (l && m) out.push({t: l.t, resolutionMs: l.resolutionMs, requestId: m[1]!, extensionS: +m[2]!, line: l.line})
  }
  return out
}

/** Whether P's log shows it logs renewals at all (DEBUG lines present), so that an absent renewal means none. */
export function logsAtDebug(text: string): boolean {
  return /\bDEBUG\s+\d\d-\d\d\s/.test(text)
}
