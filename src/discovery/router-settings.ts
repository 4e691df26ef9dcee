/**
 * The PD gateway's retry and circuit-breaker settings, read from its command line (sgl-model-gateway's launcher
 * flags; sgl-model-gateway/src/config/types.rs holds the defaults), and what they do to requests under a fault.
 * pdchaos sends its pins to prefill and decode directly for exactly this reason; users' requests go through here.
 */

export interface RouterSettings {
  /** Where the figures came from: the router's command line, or the gateway's defaults for flags it did not set. */
  source: string
  retries: {enabled: boolean; maxRetries: number}
  circuitBreaker: {enabled: boolean; failureThreshold: number}
  /** One line each: what these settings do to a request a fault holds or fails. */
  underFaults: string[]
}

/** sgl-model-gateway's defaults (config/types.rs): 5 retries; a per-worker breaker that opens after 10 failures. */
export const GATEWAY_DEFAULTS = {maxRetries: 5, failureThreshold: 10, openSeconds: 60} as const

function flagValue(argv: string[], name: string): string | undefined {
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!
    if (a === name) return argv[i + 1]
    if (a.startsWith(`${name}=`)) return a.slice(name.length + 1)
  }
  return undefined
}

function intFlag(argv: string[], name: string, dflt: number): number {
  const v = flagValue(argv, name)
  const n = v === undefined ? Number.NaN : Number(v)
  return Number.isInteger(n) && n >= 0 ? n : dflt
}

/** The router's argv (from /proc/<pid>/cmdline, NUL-separated, or ps), parsed for the gateway's own flags. */
export function routerSettingsFromArgv(argv: string[], where: string): RouterSettings {
  const retriesOn = !argv.includes('--disable-retries')
  const breakerOn = !argv.includes('--disable-circuit-breaker')
  const maxRetries = retriesOn ? intFlag(argv, '--retry-max-retries', GATEWAY_DEFAULTS.maxRetries) : 0
  const failureThreshold = intFlag(argv, '--cb-failure-threshold', GATEWAY_DEFAULTS.failureThreshold)
  const set = ['--retry-max-retries', '--disable-retries', '--cb-failure-threshold', '--disable-circuit-breaker'].filter((f) => argv.some((a) => a === f || a.startsWith(`${f}=`)))
  const underFaults: string[] = []
  if (retriesOn && maxRetries > 0) {
    underFaults.push(`a request the fault fails (500/502/503/504) is sent again up to ${maxRetries} time(s), each with a new bootstrap room: ` +
      `a client may wait up to ${maxRetries + 1} × (deadline + poll) plus the backoff, and failure counters move up to ${maxRetries + 1}× per client request`)
  } else {
    underFaults.push('no retries: a request the fault fails reaches the client at once')
  }
  if (breakerOn) {
    underFaults.push(`after ${failureThreshold} failures a worker's circuit breaker opens (about ${GATEWAY_DEFAULTS.openSeconds} s): healthy requests then get 503 until it closes`)
  } else {
    underFaults.push('no circuit breaker: a failing worker keeps receiving requests')
  }
  return {
    source: set.length > 0 ? `${where}: ${set.join(', ')}${set.length < 4 ? '; the gateway\'s defaults for the rest' : ''}` : `${where}: no retry or breaker flag, so the gateway's defaults`,
    retries: {enabled: retriesOn && maxRetries > 0, maxRetries},
    circuitBreaker: {enabled: breakerOn, failureThreshold},
    underFaults,
  }
}

/** Is this process the PD gateway? (its binary, or the Python launcher) */
export function isRouterCommand(argv: string[]): boolean {
  const head = argv.slice(0, 3).join(' ')
  return /(^|\/)(sgl-model-gateway|smg|sgl-router)(\s|$)/.test(head) || /sglang_router\.launch_router/.test(argv.join(' '))
}
