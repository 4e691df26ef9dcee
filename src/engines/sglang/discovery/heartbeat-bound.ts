import {TIMEOUT_DEFAULTS, TIMEOUT_ENV} from './watchdog-env.js'

/**
 * Decode's liveness check of its prefill peers, as decode's own environment sets it: the bound SGLang promises for
 * noticing a lost (or replaced) prefill. SGLang reads both variables in decode's KV manager only
 * (common/conn.py CommonKVManager.__init__: `max(HEARTBEAT_INTERVAL, 2.0)`, `max(HEARTBEAT_MAX_FAILURE, 1)`; defaults
 * environ.py 5.0 and 2), and the checker thread (~882) fails a peer after that many missed `/health` probes, one per
 * interval; `_handle_node_failure` (~932) then drops the peer's cached endpoints and fails its rooms.
 */
export interface HeartbeatSettings {
  intervalSeconds: number
  maxFailure: number
  /** interval × max failures: how long decode may take to notice a lost prefill. */
  boundSeconds: number
  /** Where each value came from (decode's environment, or SGLang's default where decode leaves it unset). */
  source: string
}

const num = (v: string | undefined): number | undefined => {
  if (v === undefined || v.trim() === '') return undefined
  const n = Number(v)
  return Number.isFinite(n) ? n : undefined
}

/**
 * SGLang's clamps of decode's heartbeat (common/conn.py CommonKVManager.__init__: `max(HEARTBEAT_INTERVAL, 2.0)`,
 * `max(HEARTBEAT_MAX_FAILURE, 1)`) and the bound they give: the one home of this rule (sglang-timeouts.ts reads the
 * values, this clamps them).
 */
export function heartbeatBound(
  interval: number,
  maxFailure: number,
): Pick<HeartbeatSettings, 'intervalSeconds' | 'maxFailure' | 'boundSeconds'> {
  const intervalSeconds = Math.max(interval, 2)
  const failures = Math.max(Math.floor(maxFailure), 1)
  return {
    intervalSeconds,
    maxFailure: failures,
    boundSeconds: Math.round(intervalSeconds * failures * 1000) / 1000,
  }
}

/**
 * From a bare decode environment (discovery reads it once, in sglang-timeouts.ts, and derives the bound with
 * heartbeatSettingsOf); undefined when it was not read (then the bound is unknown, not the default).
 */
export function heartbeatFromEnv(decodeEnv: Record<string, string> | undefined): HeartbeatSettings | undefined {
  if (decodeEnv === undefined) return undefined
  const i = num(decodeEnv[TIMEOUT_ENV.heartbeatInterval])
  const f = num(decodeEnv[TIMEOUT_ENV.heartbeatMaxFailure])
  const said = (v: number | undefined, name: string) =>
    v === undefined ? `${name} unset (SGLang's default)` : `${name}=${v}`
  return {
    ...heartbeatBound(i ?? TIMEOUT_DEFAULTS.heartbeatInterval, f ?? TIMEOUT_DEFAULTS.heartbeatMaxFailure),
    source:
      `decode's environment: ${said(i, TIMEOUT_ENV.heartbeatInterval)}, ` + said(f, TIMEOUT_ENV.heartbeatMaxFailure),
  }
}
