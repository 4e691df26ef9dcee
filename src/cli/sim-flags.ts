import {statSync} from 'node:fs'
import {resolve} from 'node:path'

import {Flags} from '@oclif/core'

import {
  type WatchdogRuleBreak,
  type WatchdogTiming,
  watchdogRuleBreaks,
} from '../engines/sglang/deployment/watchdog-rules.js'
import {badInput} from '../errors.js'
import type {RouterUpOptions} from '../sim/lifecycle/index.js'
import {POLICY_NAMES} from '../sim/router/policy.js'
import {defaultSimDir} from '../state-dir.js'

/** The twin's state dir flag of `pdchaos sim …` (same env variable as the global --state-dir). */
export const stateDirFlag = Flags.string({
  summary: "The twin's state dir (default $PDCHAOS_SIM_DIR or ~/.local/state/pdchaos/sim).",
  env: 'PDCHAOS_SIM_DIR',
  default: async () => defaultSimDir(),
})

/**
 * The twin's state dir as given (--state-dir or $PDCHAOS_SIM_DIR), resolved: a path that exists and is not a directory
 * is bad input (exit 2), not "no twin is running".
 */
export function simStateDir(raw: string): string {
  const dir = resolve(raw)
  let isDir = true
  try {
    isDir = statSync(dir).isDirectory()
  } catch {
    // Absent: `sim up` creates it, the others find no twin there.
  }
  if (!isDir)
    throw badInput(
      `--state-dir ${raw} is not a directory`,
      "give the twin's state dir (`pdchaos sim up --state-dir DIR` creates one)",
    )
  return dir
}

/** A number of seconds given on the command line; a non-number is bad input naming the flag. */
export function seconds(flag: string, raw: string | undefined): number | undefined {
  if (raw === undefined) return undefined
  const v = Number(raw)
  if (raw.trim() === '' || !Number.isFinite(v))
    throw badInput(`${flag} must be a number of seconds, got "${raw}"`, `pass for example ${flag} 30`)
  return v
}

/** A plain number given on the command line (a factor, a multiplier); a non-number is bad input naming the flag. */
function decimal(flag: string, raw: string | undefined): number | undefined {
  if (raw === undefined) return undefined
  const v = Number(raw)
  if (raw.trim() === '' || !Number.isFinite(v))
    throw badInput(`${flag} must be a number, got "${raw}"`, `pass for example ${flag} 1.5`)
  return v
}

/**
 * The router's retry and circuit-breaker flags of `pdchaos sim up`, named as sgl-model-gateway's launcher names them
 * and defaulting to its defaults (docs/twin.md, "Router"). The twin's router runs with them on its command line.
 */
export const routerFlags = {
  'retry-max-retries': Flags.integer({
    summary: "Router: attempts per request in all, the first included (sgl-model-gateway's --retry-max-retries).",
    default: 5,
    helpGroup: 'ROUTER',
  }),
  'retry-initial-backoff-ms': Flags.integer({
    summary: 'Router: backoff after the first failed attempt, ms.',
    default: 50,
    helpGroup: 'ROUTER',
  }),
  'retry-max-backoff-ms': Flags.integer({
    summary: 'Router: cap of the backoff, ms.',
    default: 30_000,
    helpGroup: 'ROUTER',
  }),
  'retry-backoff-multiplier': Flags.string({
    summary: 'Router: backoff growth per attempt.',
    default: '1.5',
    helpGroup: 'ROUTER',
  }),
  'retry-jitter-factor': Flags.string({
    summary: 'Router: backoff jitter, a fraction (0-1) either way.',
    default: '0.2',
    helpGroup: 'ROUTER',
  }),
  'disable-retries': Flags.boolean({summary: 'Router: one attempt per request.', default: false, helpGroup: 'ROUTER'}),
  'cb-failure-threshold': Flags.integer({
    summary: "Router: consecutive failures that open a worker's circuit breaker.",
    default: 10,
    helpGroup: 'ROUTER',
  }),
  'cb-success-threshold': Flags.integer({
    summary: 'Router: successes in half-open that close it.',
    default: 3,
    helpGroup: 'ROUTER',
  }),
  'cb-timeout-duration-secs': Flags.integer({
    summary: 'Router: seconds a breaker stays open before half-open.',
    default: 60,
    helpGroup: 'ROUTER',
  }),
  'cb-window-duration-secs': Flags.integer({
    summary: 'Router: the breaker window, seconds (accepted and shown; unused upstream too).',
    default: 120,
    helpGroup: 'ROUTER',
  }),
  'disable-circuit-breaker': Flags.boolean({
    summary: 'Router: no circuit breaker.',
    default: false,
    helpGroup: 'ROUTER',
  }),
  policy: Flags.string({
    summary: 'Router: how it picks among several instances of a role (--prefill-host/--decode-host lists).',
    options: [...POLICY_NAMES],
    default: 'cache_aware',
    helpGroup: 'ROUTER',
  }),
}

/** routerFlags' values as `sim up` options (SimUpOptions.router). */
export function routerUpOptions(f: {
  'retry-max-retries': number
  'retry-initial-backoff-ms': number
  'retry-max-backoff-ms': number
  'retry-backoff-multiplier': string
  'retry-jitter-factor': string
  'disable-retries': boolean
  'cb-failure-threshold': number
  'cb-success-threshold': number
  'cb-timeout-duration-secs': number
  'cb-window-duration-secs': number
  'disable-circuit-breaker': boolean
  policy: string
}): RouterUpOptions {
  return {
    policy: f.policy as NonNullable<RouterUpOptions['policy']>,
    retryMaxRetries: f['retry-max-retries'],
    retryInitialBackoffMs: f['retry-initial-backoff-ms'],
    retryMaxBackoffMs: f['retry-max-backoff-ms'],
    retryBackoffMultiplier: decimal('--retry-backoff-multiplier', f['retry-backoff-multiplier']),
    retryJitterFactor: decimal('--retry-jitter-factor', f['retry-jitter-factor']),
    disableRetries: f['disable-retries'],
    cbFailureThreshold: f['cb-failure-threshold'],
    cbSuccessThreshold: f['cb-success-threshold'],
    cbTimeoutDurationS: f['cb-timeout-duration-secs'],
    cbWindowDurationS: f['cb-window-duration-secs'],
    disableCircuitBreaker: f['disable-circuit-breaker'],
  }
}

/**
 * The rail NIC flags of `pdchaos sim up` (docs/twin.md, "Rail NICs"): one NIC per GPU carrying its KV as RoCE-like UDP
 * 4791, and UCX's RC retransmission limits, put in the services' environment as UCX_RC_TIMEOUT / UCX_RC_RETRY_COUNT.
 */
export const railFlags = {
  'rail-nics': Flags.boolean({
    summary: "One NIC per GPU (interfaces rail0..railN-1, needs root): KV moves as UDP 4791 over the GPU's rail.",
    default: false,
    helpGroup: 'RAIL NICS',
  }),
  'ucx-rc-timeout': Flags.string({
    summary: "UCX_RC_TIMEOUT for the services, UCX's syntax (300ms, 1s); unset: UCX's 1.0s.",
    helpGroup: 'RAIL NICS',
  }),
  'ucx-rc-retry-count': Flags.integer({
    summary: "UCX_RC_RETRY_COUNT for the services (UCX caps it at 7); unset: UCX's 7.",
    helpGroup: 'RAIL NICS',
  }),
}

/** railFlags' values as `sim up` options. */
export function railUpOptions(f: {'rail-nics': boolean; 'ucx-rc-timeout'?: string; 'ucx-rc-retry-count'?: number}): {
  railNics: boolean
  ucxRcTimeout?: string
  ucxRcRetryCount?: number
} {
  return {
    railNics: f['rail-nics'],
    ...(f['ucx-rc-timeout'] === undefined ? {} : {ucxRcTimeout: f['ucx-rc-timeout']}),
    ...(f['ucx-rc-retry-count'] === undefined ? {} : {ucxRcRetryCount: f['ucx-rc-retry-count']}),
  }
}

/** The twin's lag flags (docs/twin.md, "Not SGLang: the twin's own surfaces"): delays a busy host puts between
 * pdchaos and the scheduler, so that ε can be shown to cover them. */
export const lagFlags = {
  'entry-lag-ms': Flags.string({
    summary:
      'Not SGLang: the schedulers receive new requests and aborts only every N ms (N[:JITTER]), as behind a long ' +
      'forward pass.',
    helpGroup: 'LAGS',
  }),
  'answer-lag-ms': Flags.string({
    summary: "Not SGLang: a released request's HTTP answer is held N ms (N[:JITTER], drawn per answer).",
    helpGroup: 'LAGS',
  }),
  'tokenize-ms': Flags.string({
    summary:
      'Each request is tokenized N ms (N[:JITTER]), one at a time; an abort of a rid not yet tokenized is dropped, ' +
      'as SGLang drops an unknown rid.',
    helpGroup: 'LAGS',
  }),
}

/** lagFlags' values as `sim up` options. */
export function lagUpOptions(f: {'entry-lag-ms'?: string; 'answer-lag-ms'?: string; 'tokenize-ms'?: string}): {
  entryLagMs?: string
  answerLagMs?: string
  tokenizeMs?: string
} {
  return {
    ...(f['tokenize-ms'] === undefined ? {} : {tokenizeMs: f['tokenize-ms']}),
    ...(f['entry-lag-ms'] === undefined ? {} : {entryLagMs: f['entry-lag-ms']}),
    ...(f['answer-lag-ms'] === undefined ? {} : {answerLagMs: f['answer-lag-ms']}),
  }
}

/**
 * A twin a command starts itself: its watchdog, and how long its gateway's circuit breaker stays open (absent: 60 s).
 */
export interface TwinStart {
  deadlineS: number
  pollS: number
  cbTimeoutS?: number
  /** Decode's SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL / _MAX_FAILURE (absent: SGLang's 5 s × 2). */
  heartbeatIntervalS?: number
  heartbeatMaxFailure?: number
}

const SUITE_TWIN_CB_TIMEOUT_S = 5
/**
 * Decode's heartbeat on a twin the suite starts: 2 s (SGLang's minimum) × 2 misses, a 4 s bound instead of 10 s, so the
 * scenario that restarts prefill alone waits 4 s for it, not 10 (two misses, not one: a probe slowed by a loaded host
 * must not fail the rooms of other scenarios).
 */
const SUITE_TWIN_HEARTBEAT = {heartbeatIntervalS: 2, heartbeatMaxFailure: 2}

/**
 * A twin the suite starts itself: a short watchdog, and a gateway breaker that half-opens after 5 s, not 60 (a
 * fault's failed steady load can open it, and the suite waits for it before its canaries; trip-breaker waits out its
 * open duration to see it half-open and close), so the built-in suite takes well under a minute.
 */
export function suiteTwin(f: {sim: boolean; 'sim-deadline'?: string; 'sim-poll'?: string}): TwinStart {
  for (const flag of ['sim-deadline', 'sim-poll'] as const) {
    if (f[flag] !== undefined && !f.sim)
      throw badInput(`--${flag} applies only with --sim`, `add --sim, or drop --${flag}`)
  }
  const deadlineS = seconds('--sim-deadline', f['sim-deadline']) ?? 3
  const pollS = seconds('--sim-poll', f['sim-poll']) ?? 0.5
  if (!(deadlineS > 0 && pollS > 0))
    throw badInput('--sim-deadline and --sim-poll must be above 0 seconds', 'e.g. --sim-deadline 3 --sim-poll 0.5')
  checkWatchdogFlags({deadlineSeconds: deadlineS, pollSeconds: pollS}, SUITE_WATCHDOG_WORDS)
  return {deadlineS, pollS, cbTimeoutS: SUITE_TWIN_CB_TIMEOUT_S, ...SUITE_TWIN_HEARTBEAT}
}

/** How a command words a watchdog rule its flags break: the cause and the "Try this:" suggestion. */
export type WatchdogWords = Partial<Record<WatchdogRuleBreak['rule'], (b: WatchdogRuleBreak) => [string, string]>>

/**
 * The watchdog a twin is started with, judged by the contract's one home of its rules (deployment/watchdog-rules.ts,
 * poll <= deadline among them): the first rule broken that the command words is bad input in the command's words.
 * A rule the command does not word (the poll's maximum) is left to the twin's own bounds, as before.
 */
export function checkWatchdogFlags(t: WatchdogTiming, words: WatchdogWords): void {
  for (const b of watchdogRuleBreaks(t)) {
    const word = words[b.rule]
    if (!word) continue
    const [cause, suggestion] = word(b)
    throw badInput(cause, suggestion)
  }
}

/** `suite --sim-deadline / --sim-poll`. */
const SUITE_WATCHDOG_WORDS: WatchdogWords = {
  'deadline-min': b => [`--sim-deadline must be at least ${b.limit} seconds, got ${b.value}`, 'e.g. --sim-deadline 3'],
  'poll-min': b => [
    `--sim-poll must be at least ${b.limit} seconds (10 ms; shorter is a busy loop), got ${b.value}`,
    'e.g. --sim-poll 0.5',
  ],
  'deadline-max': b => [
    `--sim-deadline must be at most ${b.limit} seconds, got ${b.value}`,
    `pass --sim-deadline ${b.limit} or less`,
  ],
  'poll-over-deadline': b => [
    `--sim-poll (${b.value} s) is longer than --sim-deadline (${b.limit} s)`,
    'give a poll interval at most the deadline',
  ],
}
