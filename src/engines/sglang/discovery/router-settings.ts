/**
 * The PD gateway's retry and circuit-breaker settings, read from its command line (sgl-model-gateway's launcher
 * flags; sgl-model-gateway/src/config/types.rs holds the defaults), and what they do to requests under a fault.
 * pdchaos sends its pins to prefill and decode directly for exactly this reason; users' requests go through here.
 * From the gateway's source (docs/twin.md, "Router"): --retry-max-retries counts attempts in all (core/retry.rs runs
 * max(max_retries, 1) attempts); each attempt waits for prefill AND decode (pd_router.rs, execute_dual_dispatch), so
 * an attempt whose prefill half was failed ends only when decode gives up; the breaker opens on consecutive failures.
 */

export interface RouterSettings {
  /** Where the figures came from: the router's command line, or the gateway's defaults for flags it did not set. */
  source: string
  /**
   * attempts: in all, the first included (the gateway's --retry-max-retries). backoff: --retry-initial-backoff-ms,
   * --retry-backoff-multiplier, --retry-max-backoff-ms, --retry-jitter-factor (core/retry.rs BackoffCalculator).
   */
  retries: {
    enabled: boolean
    attempts: number
    backoff?: {initialMs: number; multiplier: number; maxMs: number; jitter: number}
  }
  /**
   * openSeconds: how long an open breaker refuses before it half-opens (--cb-timeout-duration-secs); successThreshold:
   * consecutive successes that close a half-open one (--cb-success-threshold).
   */
  circuitBreaker: {enabled: boolean; failureThreshold: number; openSeconds: number; successThreshold?: number}
  /** One line each: what these settings do to a request a fault holds or fails. */
  underFaults: string[]
}

/** sgl-model-gateway's defaults (config/types.rs): 5 attempts; a per-worker breaker that opens after 10 failures. */
export const GATEWAY_DEFAULTS = {
  attempts: 5,
  failureThreshold: 10,
  openSeconds: 60,
  successThreshold: 3,
  backoff: {initialMs: 50, multiplier: 1.5, maxMs: 30_000, jitter: 0.2},
} as const

/** The longest the gateway sleeps between `attempts` attempts in all (each backoff at its cap and full jitter), ms. */
export function worstBackoffMs(r: RouterSettings['retries']): number {
  const b = r.backoff ?? GATEWAY_DEFAULTS.backoff
  let total = 0
  for (let n = 0; n + 1 < r.attempts; n++) total += Math.min(b.maxMs, b.initialMs * b.multiplier ** n) * (1 + b.jitter)
  return total
}

function flagValue(argv: string[], name: string): string | undefined {
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!
    if (a === name) return argv[i + 1]
    if (a.startsWith(`${name}=`)) return a.slice(name.length + 1)
  }
  return undefined
}

function numFlag(argv: string[], name: string, dflt: number): number {
  const v = flagValue(argv, name)
  const n = v === undefined ? Number.NaN : Number(v)
  return Number.isFinite(n) && n >= 0 ? n : dflt
}

function intFlag(argv: string[], name: string, dflt: number): number {
  const v = flagValue(argv, name)
  const n = v === undefined ? Number.NaN : Number(v)
  return Number.isInteger(n) && n >= 0 ? n : dflt
}

/** The router's argv (from /proc/<pid>/cmdline, NUL-separated, or ps; a process title is one space-separated string,
 * so every element is split on white space), parsed for the gateway's own flags. */
export function routerSettingsFromArgv(raw: string[], where: string): RouterSettings {
  const argv = raw.flatMap(a => a.split(/\s+/)).filter(Boolean)
  const retriesOn = !argv.includes('--disable-retries')
  const breakerOn = !argv.includes('--disable-circuit-breaker')
  const attempts = retriesOn ? Math.max(1, intFlag(argv, '--retry-max-retries', GATEWAY_DEFAULTS.attempts)) : 1
  const failureThreshold = intFlag(argv, '--cb-failure-threshold', GATEWAY_DEFAULTS.failureThreshold)
  const openSeconds = intFlag(argv, '--cb-timeout-duration-secs', GATEWAY_DEFAULTS.openSeconds)
  const successThreshold = intFlag(argv, '--cb-success-threshold', GATEWAY_DEFAULTS.successThreshold)
  const d = GATEWAY_DEFAULTS.backoff
  const backoff = {
    initialMs: numFlag(argv, '--retry-initial-backoff-ms', d.initialMs),
    multiplier: numFlag(argv, '--retry-backoff-multiplier', d.multiplier),
    maxMs: numFlag(argv, '--retry-max-backoff-ms', d.maxMs),
    jitter: numFlag(argv, '--retry-jitter-factor', d.jitter),
  }
  const known = [
    '--retry-max-retries',
    '--disable-retries',
    '--cb-failure-threshold',
    '--cb-timeout-duration-secs',
    '--disable-circuit-breaker',
  ]
  const set = known.filter(f => argv.some(a => a === f || a.startsWith(`${f}=`)))
  const underFaults: string[] = []
  if (attempts > 1) {
    underFaults.push(
      `a request the fault fails (408/429/500/502/503/504) is tried up to ${attempts} times in all, each with a ` +
        `new bootstrap room, ` +
        `and each attempt waits for decode too: a client may wait ${attempts} × (the time decode takes to give up) ` +
        `plus the backoff, ` +
        `and failure counters move up to ${attempts}× per client request`,
    )
  } else {
    underFaults.push('no retries: a request the fault fails reaches the client at once')
  }
  if (breakerOn) {
    underFaults.push(
      `after ${failureThreshold} failures a worker's circuit breaker opens (about ${openSeconds} s): healthy ` +
        `requests then get 503 until it closes`,
    )
  } else {
    underFaults.push('no circuit breaker: a failing worker keeps receiving requests')
  }
  return {
    source:
      set.length > 0
        ? `${where}: ${set.join(', ')}${set.length < known.length ? "; the gateway's defaults for the rest" : ''}`
        : `${where}: no retry or breaker flag, so the gateway's defaults`,
    retries: {enabled: attempts > 1, attempts, backoff},
    circuitBreaker: {enabled: breakerOn, failureThreshold, openSeconds, successThreshold},
    underFaults,
  }
}

/** Is this process the PD gateway? (its binary, or the Python launcher) */
export function isRouterCommand(raw: string[]): boolean {
  const argv = raw.flatMap(a => a.split(/\s+/)).filter(Boolean)
  const head = argv.slice(0, 3).join(' ')
  return (
    /(^|\/)(sgl-model-gateway|smg|sgl-router)(\s|$)/.test(head) || /sglang_router\.launch_router/.test(argv.join(' '))
  )
}
