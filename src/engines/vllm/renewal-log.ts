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

/** Whether P logs at DEBUG, as its environment says, with the evidence. */
export interface LogLevelEvidence {
  debug: boolean
  evidence: string
}

/**
 * P's log level from its environment (/proc/<pid>/environ): vllm/envs.py `VLLM_LOGGING_LEVEL` (default "INFO",
 * upper-cased) sets the "vllm" logger and handler of vllm/logger.py's DEFAULT_LOGGING_CONFIG, which vLLM applies
 * only when VLLM_CONFIGURE_LOGGING is on (default 1) and no VLLM_LOGGING_CONFIG_PATH replaces it. Undefined
 * environment: not known either way.
 */
export function logLevelFromEnv(env: Record<string, string> | undefined, source: string): LogLevelEvidence {
  if (env === undefined) return {debug: false, evidence: `${source} not readable: P's log level unknown`}
  if (env.VLLM_CONFIGURE_LOGGING === '0')
    return {debug: false, evidence: `${source}: VLLM_CONFIGURE_LOGGING=0 (vLLM does not configure its logging)`}
  if (env.VLLM_LOGGING_CONFIG_PATH)
    return {
      debug: false,
      evidence: `${source}: VLLM_LOGGING_CONFIG_PATH=${env.VLLM_LOGGING_CONFIG_PATH} (its level unread)`,
    }
  const level = (env.VLLM_LOGGING_LEVEL ?? 'INFO').toUpperCase()
  const set = env.VLLM_LOGGING_LEVEL === undefined ? "unset: vLLM's default INFO" : `VLLM_LOGGING_LEVEL=${level}`
  return {debug: level === 'DEBUG', evidence: `${source}: ${set}`}
}
