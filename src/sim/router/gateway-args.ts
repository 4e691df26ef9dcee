/**
 * The router's launch command line, spelled as sgl-model-gateway's launcher spells it (sgl-model-gateway/src/main.rs
 * CliArgs; the Python launcher, bindings/python, takes the same names): what `sim up` passes to the router process,
 * what the process shows in `ps`, and what it reads back to configure itself. docs/twin.md, "Router".
 */
import {type SimConfig, serviceHosts} from '../sim-config.js'
import {CB_DEFAULTS, type CircuitBreakerSettings} from './circuit-breaker.js'
import {POLICY_NAMES, type PolicyName} from './policy.js'
import {type HealthCheckSettings, ROUTER_HEALTH_DEFAULTS} from './health.js'
import {RETRY_DEFAULTS, type RetrySettings} from './retry.js'

export interface GatewayArgs {
  /** `--prefill URL PORT` per prefill instance: its URL and --disaggregation-bootstrap-port. */
  prefill: Array<{url: string; bootstrapPort: number}>
  /** `--decode URL` per decode instance. */
  decode: string[]
  /** --policy (cache_aware upstream), and --prefill-policy / --decode-policy when they differ from it. */
  policy: PolicyName
  prefillPolicy?: PolicyName
  decodePolicy?: PolicyName
  host: string
  port: number
  prometheusHost: string
  prometheusPort: number
  /** --request-timeout-secs (1800 upstream). */
  requestTimeoutS: number
  health: HealthCheckSettings
  retry: RetrySettings
  circuitBreaker: CircuitBreakerSettings
}

const hostForUrl = (host: string): string => (host.includes(':') ? `[${host}]` : host)

/** The gateway settings of a twin: sim.json's router section over upstream's defaults. */
export function gatewayArgsFor(config: SimConfig): GatewayArgs {
  const r = config.router ?? {}
  // Its workers where they run: on a multi-node twin, every instance of a role at its node's address (same ports).
  const urls = (service: 'prefill' | 'decode', port: number): string[] =>
    serviceHosts(config, service).map(h => `http://${hostForUrl(h)}:${port}`)
  const pick = <T>(v: T | undefined, fallback: T): T => (v === undefined ? fallback : v)
  return {
    prefill: urls('prefill', config.ports.prefill).map(url => ({url, bootstrapPort: config.ports.bootstrap})),
    decode: urls('decode', config.ports.decode),
    policy: r.policy ?? 'cache_aware',
    ...(r.prefillPolicy === undefined ? {} : {prefillPolicy: r.prefillPolicy}),
    ...(r.decodePolicy === undefined ? {} : {decodePolicy: r.decodePolicy}),
    host: config.host,
    port: config.ports.router,
    prometheusHost: config.host,
    prometheusPort: config.ports.routerMetrics,
    requestTimeoutS: pick(r.requestTimeoutS, 1800),
    health: {
      intervalS: pick(r.healthIntervalS, ROUTER_HEALTH_DEFAULTS.intervalS),
      timeoutS: pick(r.healthTimeoutS, ROUTER_HEALTH_DEFAULTS.timeoutS),
      failureThreshold: pick(r.healthFailureThreshold, ROUTER_HEALTH_DEFAULTS.failureThreshold),
      successThreshold: pick(r.healthSuccessThreshold, ROUTER_HEALTH_DEFAULTS.successThreshold),
    },
    retry: {
      maxRetries: pick(r.retryMaxRetries, RETRY_DEFAULTS.maxRetries),
      initialBackoffMs: pick(r.retryInitialBackoffMs, RETRY_DEFAULTS.initialBackoffMs),
      maxBackoffMs: pick(r.retryMaxBackoffMs, RETRY_DEFAULTS.maxBackoffMs),
      backoffMultiplier: pick(r.retryBackoffMultiplier, RETRY_DEFAULTS.backoffMultiplier),
      jitterFactor: pick(r.retryJitterFactor, RETRY_DEFAULTS.jitterFactor),
      disabled: pick(r.disableRetries, RETRY_DEFAULTS.disabled),
    },
    circuitBreaker: {
      failureThreshold: pick(r.cbFailureThreshold, CB_DEFAULTS.failureThreshold),
      successThreshold: pick(r.cbSuccessThreshold, CB_DEFAULTS.successThreshold),
      timeoutDurationS: pick(r.cbTimeoutDurationS, CB_DEFAULTS.timeoutDurationS),
      windowDurationS: pick(r.cbWindowDurationS, CB_DEFAULTS.windowDurationS),
      disabled: pick(r.disableCircuitBreaker, CB_DEFAULTS.disabled),
    },
  }
}

/** The launch flags, in the launcher's names; every setting is spelled out, the two switches only when on. */
export function gatewayArgv(a: GatewayArgs): string[] {
  return [
    '--pd-disaggregation',
    ...a.prefill.flatMap(p => ['--prefill', p.url, String(p.bootstrapPort)]),
    ...a.decode.flatMap(d => ['--decode', d]),
    '--policy',
    a.policy,
    ...(a.prefillPolicy ? ['--prefill-policy', a.prefillPolicy] : []),
    ...(a.decodePolicy ? ['--decode-policy', a.decodePolicy] : []),
    '--host',
    a.host,
    '--port',
    String(a.port),
    '--prometheus-host',
    a.prometheusHost,
    '--prometheus-port',
    String(a.prometheusPort),
    '--request-timeout-secs',
    String(a.requestTimeoutS),
    '--health-check-interval-secs',
    String(a.health.intervalS),
    '--health-check-timeout-secs',
    String(a.health.timeoutS),
    '--health-failure-threshold',
    String(a.health.failureThreshold),
    '--health-success-threshold',
    String(a.health.successThreshold),
    '--retry-max-retries',
    String(a.retry.maxRetries),
    '--retry-initial-backoff-ms',
    String(a.retry.initialBackoffMs),
    '--retry-max-backoff-ms',
    String(a.retry.maxBackoffMs),
    '--retry-backoff-multiplier',
    String(a.retry.backoffMultiplier),
    '--retry-jitter-factor',
    String(a.retry.jitterFactor),
    ...(a.retry.disabled ? ['--disable-retries'] : []),
    '--cb-failure-threshold',
    String(a.circuitBreaker.failureThreshold),
    '--cb-success-threshold',
    String(a.circuitBreaker.successThreshold),
    '--cb-timeout-duration-secs',
    String(a.circuitBreaker.timeoutDurationS),
    '--cb-window-duration-secs',
    String(a.circuitBreaker.windowDurationS),
    ...(a.circuitBreaker.disabled ? ['--disable-circuit-breaker'] : []),
  ]
}

const policyArg = (flag: string, raw: string | undefined): PolicyName => {
  if (!(POLICY_NAMES as readonly string[]).includes(raw ?? ''))
    throw new Error(
      `${flag} must be one of ${POLICY_NAMES.join(', ')}, got ${raw === undefined ? 'nothing' : `"${raw}"`}`,
    )
  return raw as PolicyName
}
const numArg = (flag: string, raw: string | undefined): number => {
  const v = Number(raw)
  if (raw === undefined || raw.trim() === '' || !Number.isFinite(v))
    throw new Error(`${flag} needs a number, got ${raw === undefined ? 'nothing' : `"${raw}"`}`)
  return v
}
const strArg = (flag: string, raw: string | undefined): string => {
  if (raw === undefined || raw.startsWith('--')) throw new Error(`${flag} needs a value`)
  return raw
}

/** The flags that take one number, each setting its field of `a`. */
const numericSetters = (a: GatewayArgs): Record<string, (v: number) => void> => ({
  '--port': v => (a.port = v),
  '--prometheus-port': v => (a.prometheusPort = v),
  '--request-timeout-secs': v => (a.requestTimeoutS = v),
  '--health-check-interval-secs': v => (a.health.intervalS = v),
  '--health-check-timeout-secs': v => (a.health.timeoutS = v),
  '--health-failure-threshold': v => (a.health.failureThreshold = v),
  '--health-success-threshold': v => (a.health.successThreshold = v),
  '--retry-max-retries': v => (a.retry.maxRetries = v),
  '--retry-initial-backoff-ms': v => (a.retry.initialBackoffMs = v),
  '--retry-max-backoff-ms': v => (a.retry.maxBackoffMs = v),
  '--retry-backoff-multiplier': v => (a.retry.backoffMultiplier = v),
  '--retry-jitter-factor': v => (a.retry.jitterFactor = v),
  '--cb-failure-threshold': v => (a.circuitBreaker.failureThreshold = v),
  '--cb-success-threshold': v => (a.circuitBreaker.successThreshold = v),
  '--cb-timeout-duration-secs': v => (a.circuitBreaker.timeoutDurationS = v),
  '--cb-window-duration-secs': v => (a.circuitBreaker.windowDurationS = v),
})

/** The flags that take a policy name. */
const policySetters = (a: GatewayArgs): Record<string, (p: PolicyName) => void> => ({
  '--policy': p => (a.policy = p),
  '--prefill-policy': p => (a.prefillPolicy = p),
  '--decode-policy': p => (a.decodePolicy = p),
})

/** The parse in progress: the args so far, and whether a --prefill (--decode) has replaced the base's list yet. */
interface Parse {
  a: GatewayArgs
  base: GatewayArgs
  argv: string[]
  given: {prefill: boolean; decode: boolean}
}

/**
 * `--prefill URL [PORT|none]`: the bootstrap port after the URL is optional, as in the launcher. Returns the next i.
 */
function prefillArg(s: Parse, i: number): number {
  const {argv, a} = s
  const url = strArg('--prefill', argv[++i])
  // The bootstrap port after the URL is optional ("none" or absent), as in the launcher: the base's port then.
  let bootstrapPort = s.base.prefill[0]?.bootstrapPort ?? 8998
  const next = argv[i + 1]
  if (next !== undefined && !next.startsWith('--')) {
    i++
    if (next !== 'none') bootstrapPort = numArg('--prefill bootstrap port', next)
  }
  if (!s.given.prefill) a.prefill = []
  s.given.prefill = true
  a.prefill.push({url, bootstrapPort})
  return i
}

/** One flag that is neither numeric nor a policy, at argv[i]; returns the index of its last word. */
function otherFlag(s: Parse, i: number): number {
  const {argv, a} = s
  const flag = argv[i]
  switch (flag) {
    case '--pd-disaggregation':
      break
    case '--disable-retries':
      a.retry.disabled = true
      break
    case '--disable-circuit-breaker':
      a.circuitBreaker.disabled = true
      break
    case '--prefill':
      return prefillArg(s, i)
    case '--decode':
      if (!s.given.decode) a.decode = []
      s.given.decode = true
      a.decode.push(strArg(flag, argv[++i]))
      break

    case '--host':
      a.host = strArg(flag, argv[++i])
      break
    case '--prometheus-host':
      a.prometheusHost = strArg(flag, argv[++i])
      break
    default:
      throw new Error(`unknown flag ${flag}`)
  }
  return i
}

/**
 * Read the launch flags back (the router process configures itself from its own command line). Flags that are absent
 * keep `base`; an unknown flag or a value that is not a number is an error naming the flag.
 */
export function parseGatewayArgv(argv: string[], base: GatewayArgs): GatewayArgs {
  const a: GatewayArgs = {
    ...base,
    prefill: [...base.prefill],
    decode: [...base.decode],
    health: {...base.health},
    retry: {...base.retry},
    circuitBreaker: {...base.circuitBreaker},
  }
  // The first --prefill (--decode) replaces the base's list; each further one adds an instance.
  const s: Parse = {a, base, argv, given: {prefill: false, decode: false}}
  const numeric = numericSetters(a)
  const policies = policySetters(a)
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i]
    if (flag in numeric) numeric[flag](numArg(flag, argv[++i]))
    else if (flag in policies) policies[flag](policyArg(flag, argv[++i]))
    else i = otherFlag(s, i)
  }
  return a
}
