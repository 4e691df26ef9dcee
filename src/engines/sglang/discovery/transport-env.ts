/**
 * What a rank's environment says about how long its KV transport waits out a stall before failing, and how long
 * SGLang's /health waits for its scheduler: read as UCX, Mooncake and SGLang read them, so a plan can state which
 * outcome to expect (a transport error, or a pin held for the watchdog) and a wedge check its detection bound.
 * Pure functions over NAME=value maps (from /proc/<pid>/environ).
 */

// ---------------------------------------------------------------- UCX RC

/**
 * UCX's RC defaults (openucx/ucx src/uct/ib/rc/base/rc_iface.c, uct_rc_iface_common_config_table): TIMEOUT "1.0s",
 * RETRY_COUNT "7". The table is reached under the "RC_" sub-table prefix (UCX_RC_TIMEOUT) and then overridden with
 * the transport's own prefix (UCX_RC_MLX5_TIMEOUT, UCX_RC_VERBS_TIMEOUT): ucs_config_apply_config_vars,
 * src/ucs/config/parser.c, "Possible override with my prefix". An environment variable beats ucx.conf.
 */
export const UCX_RC_DEFAULTS = {timeout: '1.0s', retryCount: 7} as const
/** The QP's retry_cnt is a 3-bit field (InfiniBand): 7 at most. */
export const IB_MAX_RETRY_COUNT = 7
/** UCT_IB_FABRIC_TIME_MAX (src/uct/ib/base/ib_device.h): an exponent this large means "no timeout". */
const IB_FABRIC_TIME_MAX = 32

export type RcTransport = 'rc_mlx5' | 'rc_verbs'

/**
 * ucs_config_sscanf_time (src/ucs/config/parser.c): sscanf("%lf%c%c"): a number, then nothing (seconds) or one of
 * m (minutes), s, ms, us, ns. Returns seconds, or undefined where UCX would refuse the value.
 */
export function parseUcxTime(raw: string): number | undefined {
  const m = /^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)(.{0,2})/.exec(raw)
  if (!m) return undefined
  const value = Number(m[1])
  const unit = m[2] ?? ''
  const perSec: Record<string, number> = {'': 1, m: 1 / 60, s: 1, ms: 1e3, us: 1e6, ns: 1e9}
  if (!Object.hasOwn(perSec, unit)) return undefined
  const s = value / perSec[unit]!
  return Number.isFinite(s) ? s : undefined
}

/**
 * uct_ib_to_qp_fabric_time (src/uct/ib/base/ib_device.c): the QP's local ACK timeout is 4.096 µs × 2^exponent, the
 * exponent rounded from the configured time; below 1 it is 1, at 32 or more it is 0, which means no timeout at all.
 */
export function qpAckTimeout(seconds: number): {exponent: number; seconds: number} {
  const to = Math.log(seconds / 4.096e-6) / Math.log(2)
  let exponent: number
  if (!(to >= 1)) exponent = 1
  else if (Math.floor(to + 0.5) >= IB_FABRIC_TIME_MAX) exponent = 0
  else exponent = Math.floor(to + 0.5)
  return {exponent, seconds: exponent === 0 ? Number.POSITIVE_INFINITY : 4.096e-6 * 2 ** exponent}
}

export interface RcLimits {
  transport: RcTransport
  /** The value as set (or UCX's default) and the variable it came from ('default' when unset). */
  timeout: {text: string; from: string; seconds: number}
  /** What the QP really gets: 4.096 µs × 2^exponent (exponent 0: never). */
  qpTimeout: {exponent: number; seconds: number}
  retryCount: {value: number; from: string}
  /**
   * How long a stalled QP is waited out before the work request completes in error (IBV_WC_RETRY_EXC_ERR, UCX's
   * "Transport retry count exceeded"): about qpTimeout × (retries + 1); ConnectX adaptive retransmission totals
   * qpTimeout × retries. [low, high].
   */
  giveUpSeconds: [number, number]
  /** The variables to raise for a longer wait, in the order UCX reads them. */
  settings: string[]
  warnings: string[]
}

/** rc_mlx5 unless UCX_TLS allows only the verbs flavour of RC (rc_v / rc_verbs). */
export function rcTransportOf(env: Record<string, string>): RcTransport {
  const tls = (env.UCX_TLS ?? '')
    .split(',')
    .map(t => t.trim().toLowerCase())
    .filter(Boolean)
  if (tls.length === 0 || tls[0]!.startsWith('^')) return 'rc_mlx5'
  const verbs = tls.some(t => t === 'rc_v' || t === 'rc_verbs')
  const mlx5 = tls.some(t => t === 'rc' || t === 'rc_x' || t === 'rc_mlx5' || t === 'all' || t === 'ib')
  return verbs && !mlx5 ? 'rc_verbs' : 'rc_mlx5'
}

export function rcLimitsFromEnv(env: Record<string, string>): RcLimits {
  const transport = rcTransportOf(env)
  const own = transport === 'rc_mlx5' ? 'UCX_RC_MLX5_' : 'UCX_RC_VERBS_'
  const warnings: string[] = []
  // The transport's own prefix overrides the shared RC_ one.
  const pick = (field: string): {text: string; from: string} | undefined => {
    for (const name of [`${own}${field}`, `UCX_RC_${field}`]) {
      const v = env[name]
      if (v !== undefined && v.trim() !== '') return {text: v.trim(), from: name}
    }
    return undefined
  }
  let t = pick('TIMEOUT') ?? {text: UCX_RC_DEFAULTS.timeout, from: 'default'}
  let seconds = parseUcxTime(t.text)
  if (seconds === undefined || seconds < 0) {
    warnings.push(
      `${t.from}=${t.text} is not a UCX time (<number>[m|s|ms|us|ns]): UCX refuses it; assuming the ` +
        `default ${UCX_RC_DEFAULTS.timeout}`,
    )
    t = {text: UCX_RC_DEFAULTS.timeout, from: 'default'}
    seconds = 1
  }
  const r = pick('RETRY_COUNT') ?? {text: String(UCX_RC_DEFAULTS.retryCount), from: 'default'}
  let retries = /^\d+$/.test(r.text) ? Number(r.text) : Number.NaN
  let retryFrom = r.from
  if (!Number.isSafeInteger(retries)) {
    warnings.push(
      `${r.from}=${r.text} is not an unsigned integer: UCX refuses it; assuming the ` +
        `default ${UCX_RC_DEFAULTS.retryCount}`,
    )
    retries = UCX_RC_DEFAULTS.retryCount
    retryFrom = 'default'
  }
  if (retries > IB_MAX_RETRY_COUNT) {
    warnings.push(`${r.from}=${retries}: a QP retries at most ${IB_MAX_RETRY_COUNT} times`)
    retries = IB_MAX_RETRY_COUNT
  }
  const qp = qpAckTimeout(seconds)
  return {
    transport,
    timeout: {text: t.text, from: t.from, seconds},
    qpTimeout: qp,
    retryCount: {value: retries, from: retryFrom},
    giveUpSeconds: [qp.seconds * Math.max(1, retries), qp.seconds * (retries + 1)],
    settings: [`${own}TIMEOUT`, 'UCX_RC_TIMEOUT', `${own}RETRY_COUNT`, 'UCX_RC_RETRY_COUNT'],
    warnings,
  }
}

// ---------------------------------------------------------------- Mooncake

/** MC_TRANSFER_TIMEOUT: bounds Mooncake's batch_transfer_sync; 30 s per Mooncake's docs (not read from its source). */
export const MOONCAKE_TRANSFER_TIMEOUT_DEFAULT_S = 30

export function mooncakeTimeoutFromEnv(env: Record<string, string>): {seconds: number; from: string} {
  const raw = env.MC_TRANSFER_TIMEOUT?.trim()
  const n = raw ? Number(raw) : Number.NaN
  return Number.isFinite(n) && n > 0
    ? {seconds: n, from: 'MC_TRANSFER_TIMEOUT'}
    : {seconds: MOONCAKE_TRANSFER_TIMEOUT_DEFAULT_S, from: 'default'}
}

// ---------------------------------------------------------------- SGLang /health

/**
 * SGLang's /health (python/sglang/srt/entrypoints/http_server.py, health_generate): unless
 * SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION is false, it submits a 1-token request and answers 200 as soon as any
 * scheduler output arrives, checking once a second, and 503 after SGLANG_HEALTH_CHECK_TIMEOUT (default 20 s).
 */
export const HEALTH_CHECK_TIMEOUT_DEFAULT_S = 20
/** The health loop sleeps 1 s between checks: an answer can come up to this late. */
export const HEALTH_CHECK_GRANULARITY_S = 1

export interface HealthCheckSettings {
  timeoutSeconds: number
  /** Where the timeout came from: the variable, a twin's statement, or SGLang's default. */
  source: string
  /** /health generates (SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION not false); /health_generate always does. */
  generates: boolean
}

export function healthCheckFromEnv(env: Record<string, string> | undefined): HealthCheckSettings {
  const raw = env?.SGLANG_HEALTH_CHECK_TIMEOUT?.trim()
  const n = raw ? Number(raw) : Number.NaN
  const gen = env?.SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION?.trim().toLowerCase()
  const generates = gen === undefined || gen === '' || gen === 'true' || gen === '1'
  return Number.isFinite(n) && n > 0
    ? {timeoutSeconds: n, source: `SGLANG_HEALTH_CHECK_TIMEOUT=${raw}`, generates}
    : {
        timeoutSeconds: HEALTH_CHECK_TIMEOUT_DEFAULT_S,
        source: `SGLang's default (${HEALTH_CHECK_TIMEOUT_DEFAULT_S} s; SGLANG_HEALTH_CHECK_TIMEOUT unset)`,
        generates,
      }
}

/**
 * The environment variables discovery keeps from each rank and server (the rest never leaves the host).
 * CUDA_VISIBLE_DEVICES: with --base-gpu-id and the rank, it names the rank's GPU when nvidia-smi lists no processes.
 */
export const KEPT_ENV = /^(UCX_|MC_|NIXL_|SGLANG_|CUDA_VISIBLE_DEVICES=)/
