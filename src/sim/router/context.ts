import {closeSync, mkdirSync, openSync, writeSync} from 'node:fs'
import http from 'node:http'
import {dirname} from 'node:path'
import {performance} from 'node:perf_hooks'

import {CB_DEFAULTS, CB_STATE_CODE, CircuitBreaker, type CircuitBreakerSettings} from './circuit-breaker.js'
import {type HealthCheckSettings, ROUTER_HEALTH_DEFAULTS, WorkerHealth} from './health.js'
import {CACHE_AWARE_DEFAULTS, type CacheAwareSettings, makePolicy, type Policy, type PolicyName} from './policy.js'
import {PromRegistry} from './prom-text.js'
import {RETRY_DEFAULTS, type RetrySettings} from './retry.js'

/** The router's options and its state, shared by the request handlers (router.ts, generate.ts, attempt.ts). */

export interface RouterOptions {
  host: string
  port: number
  metricsPort: number
  /**
   * `--prefill URL PORT`, once per prefill instance: its URL and --disaggregation-bootstrap-port (injected as
   * bootstrap_port).
   */
  prefill: ReadonlyArray<{url: string; bootstrapPort: number}>
  /** `--decode URL`, once per decode instance. */
  decode: readonly string[]
  /** --prefill-policy and --decode-policy (each defaulting to --policy, cache_aware upstream). */
  policy?: {prefill?: PolicyName; decode?: PolicyName}
  /** cache_aware's thresholds; unset fields keep upstream's defaults. */
  cacheAware?: Partial<CacheAwareSettings>
  health?: Partial<HealthCheckSettings>
  /** --request-timeout-secs (1800 in the real router). */
  requestTimeoutS?: number
  /** --retry-* and --disable-retries; unset fields keep upstream's defaults. */
  retry?: Partial<RetrySettings>
  /** --cb-* and --disable-circuit-breaker; unset fields keep upstream's defaults. */
  circuitBreaker?: Partial<CircuitBreakerSettings>
  /** Ground truth JSON lines; none when undefined. */
  truthFile?: string
  log?: (line: string) => void
  /** The backoff jitter's random source, [0, 1) (tests). */
  random?: () => number
  /**
   * `sim up --bug half-dispatch` (SGLang #31206, sgl-router v0.2.4 as reported): with every prefill's breaker open, the
   * request still goes to decode alone, which then waits for KV that never comes.
   */
  halfDispatch?: boolean
}

export type Role = 'prefill' | 'decode'

/** One worker as the router sees it: its health checker, its breaker and the attempts it is serving. */
export interface Worker {
  role: Role
  url: string
  h: WorkerHealth
  cb: CircuitBreaker
  load: number
}

/** Everything a request handler needs, built once by startRouter and passed explicitly. */
export interface RouterCtx {
  opts: RouterOptions
  health: HealthCheckSettings
  retry: RetrySettings
  cbSettings: CircuitBreakerSettings
  random: () => number
  requestTimeoutMs: number
  log: (line: string) => void
  agent: http.Agent
  metrics: PromRegistry
  /** Appends one ground-truth line (none without a truth file). */
  record: (o: Record<string, unknown>) => void
  /** Closes the truth file; later records are dropped. */
  closeTruth: () => void
  workers: Worker[]
  bootstrapOf: Map<string, number>
  policies: {prefill: Policy; decode: Policy}
}

export const now = (): number => performance.timeOrigin + performance.now()
/** metrics_labels::ENDPOINT_GENERATE: the endpoint label of the retry counters. */
export const ENDPOINT = 'generate'
/** The worker_type labels of the retry and error counters: PD mode counts each for both roles (dispatch.rs). */
export const ROLES = ['prefill', 'decode'] as const

export const ofRole = (ctx: RouterCtx, role: Role): Worker[] => ctx.workers.filter(w => w.role === role)

/** pd_router.rs readiness(): at least one healthy prefill and one healthy decode worker. */
export const isReady = (ctx: RouterCtx): boolean =>
  ofRole(ctx, 'prefill').some(w => w.h.healthy) && ofRole(ctx, 'decode').some(w => w.h.healthy)

/** Unset (undefined) settings keep the real router's defaults. */
const defined = <T extends object>(o: Partial<T> | undefined): Partial<T> =>
  Object.fromEntries(Object.entries(o ?? {}).filter(([, v]) => v !== undefined)) as Partial<T>

function defineMetrics(metrics: PromRegistry): void {
  metrics.define('smg_router_requests_total', 'counter', 'Total requests received by the router')
  metrics.define('smg_router_request_errors_total', 'counter', 'Requests the router answered with an error')
  metrics.define('smg_router_upstream_responses_total', 'counter', 'Responses from workers by status')
  metrics.define('smg_worker_health', 'gauge', 'Worker health status (1=healthy, 0=unhealthy)')
  metrics.define(
    'smg_worker_errors_total',
    'counter',
    'Worker-level errors by worker_type, connection_mode, error_type',
  )
  // observability/metrics.rs, "Layer 3: Worker resilience metrics".
  metrics.define('smg_worker_cb_state', 'gauge', 'Circuit breaker state per worker (0=closed, 1=open, 2=half_open)')
  metrics.define('smg_worker_cb_transitions_total', 'counter', 'Circuit breaker state transitions by worker, from, to')
  metrics.define(
    'smg_worker_cb_outcomes_total',
    'counter',
    'Circuit breaker outcomes by worker and outcome (success/failure)',
  )
  metrics.define('smg_worker_cb_consecutive_failures', 'gauge', 'Current consecutive failure count per worker')
  metrics.define('smg_worker_cb_consecutive_successes', 'gauge', 'Current consecutive success count per worker')
  metrics.define('smg_worker_retries_total', 'counter', 'Total retry attempts by worker_type and endpoint')
  metrics.define(
    'smg_worker_retries_exhausted_total',
    'counter',
    'Requests that exhausted all retries by worker_type and endpoint',
  )
  metrics.define('smg_worker_retry_backoff_seconds', 'summary', 'Retry backoff duration by attempt number')
}

/** The truth file, opened for synchronous appends: a reader never misses a line for a request already answered. */
function openTruth(file: string | undefined): Pick<RouterCtx, 'record' | 'closeTruth'> {
  let truthFd: number | undefined
  if (file) {
    mkdirSync(dirname(file), {recursive: true})
    truthFd = openSync(file, 'a')
  }
  return {
    record: o => {
      if (truthFd !== undefined) writeSync(truthFd, JSON.stringify({t: now(), role: 'router', ...o}) + '\n')
    },
    closeTruth: () => {
      if (truthFd !== undefined) closeSync(truthFd)
      truthFd = undefined
    },
  }
}

/** One worker: its health gauge and its breaker, whose transitions are logged, counted and recorded. */
function makeWorker(
  ctx: Pick<RouterCtx, 'health' | 'cbSettings' | 'log' | 'metrics' | 'record'>,
  role: Role,
  url: string,
): Worker {
  const {metrics, log} = ctx
  metrics.set('smg_worker_health', {worker: url}, 0)
  const h = new WorkerHealth(url, ctx.health, ok => {
    metrics.set('smg_worker_health', {worker: url}, ok ? 1 : 0)
    log(`Worker ${role} ${url} is now ${ok ? 'healthy' : 'unhealthy'}`)
  })
  // The breaker's metric label is the worker's URL (worker_builder.rs), its state published from the start.
  metrics.set('smg_worker_cb_state', {worker: url}, CB_STATE_CODE.closed)
  const cb = new CircuitBreaker(ctx.cbSettings, {
    transition: (from, to) => {
      log(`Circuit breaker state transition: ${from} -> ${to} (${role} ${url})`)
      metrics.inc('smg_worker_cb_transitions_total', {worker: url, from, to})
      metrics.set('smg_worker_cb_state', {worker: url}, CB_STATE_CODE[to])
      ctx.record({event: 'breaker', worker: url, workerType: role, from, to})
    },
    counts: (failures, successes) => {
      metrics.set('smg_worker_cb_consecutive_failures', {worker: url}, failures)
      metrics.set('smg_worker_cb_consecutive_successes', {worker: url}, successes)
    },
  })
  return {role, url, h, cb, load: 0}
}

/** The router's settings (unset ones at upstream's defaults), its metrics, truth file and workers. */
export function buildRouterContext(opts: RouterOptions): RouterCtx {
  const random = opts.random ?? Math.random
  const base = {
    opts,
    health: {...ROUTER_HEALTH_DEFAULTS, ...defined(opts.health)} as HealthCheckSettings,
    retry: {...RETRY_DEFAULTS, ...defined(opts.retry)} as RetrySettings,
    cbSettings: {...CB_DEFAULTS, ...defined(opts.circuitBreaker)} as CircuitBreakerSettings,
    random,
    requestTimeoutMs: (opts.requestTimeoutS ?? 1800) * 1000,
    log: opts.log ?? (() => {}),
    agent: new http.Agent({keepAlive: true, maxSockets: Infinity, maxFreeSockets: 256}),
    metrics: new PromRegistry(),
  }
  defineMetrics(base.metrics)
  const truth = openTruth(opts.truthFile)
  if (opts.prefill.length === 0 || opts.decode.length === 0)
    throw new Error('the PD router needs at least one prefill and one decode worker')
  const withTruth = {...base, ...truth}
  const listed = [
    ...opts.prefill.map(p => ['prefill', p.url] as const),
    ...opts.decode.map(u => ['decode', u] as const),
  ]
  const workers = listed.map(([role, url]) => makeWorker(withTruth, role, url))
  const cacheAware = {...CACHE_AWARE_DEFAULTS, ...defined(opts.cacheAware)}
  return {
    ...withTruth,
    workers,
    bootstrapOf: new Map(opts.prefill.map(p => [p.url, p.bootstrapPort])),
    policies: {
      prefill: makePolicy(opts.policy?.prefill ?? 'cache_aware', random, cacheAware),
      decode: makePolicy(opts.policy?.decode ?? 'cache_aware', random, cacheAware),
    },
  }
}

/** One POST /generate to a worker, with the request timeout (--request-timeout-secs) as its deadline. */
export function upstream(
  ctx: RouterCtx,
  url: string,
  body: string,
  onRes: (res: http.IncomingMessage) => void,
  onErr: (e: Error) => void,
): http.ClientRequest {
  const {requestTimeoutMs} = ctx
  const req = http.request(
    url + '/generate',
    {
      method: 'POST',
      agent: ctx.agent,
      headers: {'content-type': 'application/json', 'content-length': Buffer.byteLength(body)},
      timeout: requestTimeoutMs,
    },
    onRes,
  )
  req.on('timeout', () => req.destroy(new Error(`upstream timed out after ${requestTimeoutMs / 1000}s`)))
  req.on('error', onErr)
  req.end(body)
  return req
}

/** A pair for one attempt; decodeOnly under `--bug half-dispatch` when every prefill's breaker is open. */
export type Pair = {prefill: Worker; decode: Worker; decodeOnly?: boolean}

/**
 * select_pd_pair → pick_worker_by_policy_arc: each role among its workers that are healthy and whose breaker lets
 * requests through.
 */
export function selectPair(ctx: RouterCtx, text: string): Pair | {error: string} {
  const pick = (role: Role): Worker | string => {
    const available = ofRole(ctx, role).filter(w => w.h.healthy && w.cb.canExecute())
    if (available.length === 0) return `No available ${role} workers (all circuits open or unhealthy)`
    return available[ctx.policies[role].select(available, text)]!
  }
  const prefill = pick('prefill')
  if (typeof prefill === 'string') {
    // The defect: a healthy prefill behind an open breaker is still named in the body, and decode is sent alone.
    const shut = ctx.opts.halfDispatch ? ofRole(ctx, 'prefill').find(w => w.h.healthy && !w.cb.canExecute()) : undefined
    const decode = shut ? pick('decode') : undefined
    if (shut && decode !== undefined && typeof decode !== 'string') return {prefill: shut, decode, decodeOnly: true}
    return {error: prefill}
  }
  const decode = pick('decode')
  if (typeof decode === 'string') return {error: decode}
  return {prefill, decode}
}
