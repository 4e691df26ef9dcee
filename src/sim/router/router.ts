import {closeSync, mkdirSync, openSync, writeSync} from 'node:fs'
import http from 'node:http'
import type {AddressInfo} from 'node:net'
import {dirname} from 'node:path'
import {performance} from 'node:perf_hooks'

import {parseRoomJson, stringifyRoomJson} from '../server/json-room.js'
import {CB_DEFAULTS, CB_STATE_CODE, CircuitBreaker, type CircuitBreakerSettings} from './circuit-breaker.js'
import {type HealthCheckSettings, ROUTER_HEALTH_DEFAULTS, WorkerHealth, probe} from './health.js'
import {CACHE_AWARE_DEFAULTS, type CacheAwareSettings, makePolicy, type PolicyName} from './policy.js'
import {PromRegistry} from './prom-text.js'
import {attemptsAllowed, backoffDelayMs, isRetryableStatus, RETRY_DEFAULTS, type RetrySettings} from './retry.js'
import {randomRoom} from './room.js'

/**
 * The twin's PD router, modelled on sgl-model-gateway's PD mode (sgl-model-gateway/src/routers/http/pd_router.rs,
 * core/retry.rs, core/circuit_breaker.rs; docs/twin.md, "Router"). One or more prefill and decode workers. Each
 * request is run by a retry loop: every attempt picks the pair (each role by its policy among its workers that are
 * healthy and whose breaker lets requests through; none available is a 503), injects the chosen prefill's bootstrap
 * address and a fresh random 63-bit bootstrap room into the same body (same rid), sends it to both workers at once
 * and waits for both to answer (tokio::join!), then decode's error wins, then prefill's, else decode's answer passes
 * through. The pair's two breakers record the attempt's outcome; 408/429/500/502/503/504 are retried after a jittered
 * backoff, and the retry picks its pair again.
 */

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

export interface RunningRouter {
  url: string
  metricsUrl: string
  metrics: PromRegistry
  ready(): boolean
  close(): Promise<void>
}

const MAX_BODY = 64 * 1024 * 1024
const now = (): number => performance.timeOrigin + performance.now()
/** metrics_labels::ENDPOINT_GENERATE: the endpoint label of the retry counters. */
const ENDPOINT = 'generate'
/** The worker_type labels of the retry and error counters: PD mode counts each for both roles (dispatch.rs). */
const ROLES = ['prefill', 'decode'] as const

/** A request body with the bootstrap fields set; the room is written as a bare integer (it exceeds 2^53). */
export function injectBootstrap(body: Record<string, unknown>, host: string, port: number, room: bigint): string {
  const rest: Record<string, unknown> = {}
  for (const [k, v] of Object.entries(body)) {
    if (k !== 'bootstrap_host' && k !== 'bootstrap_port' && k !== 'bootstrap_room') rest[k] = v
  }
  return stringifyRoomJson({...rest, bootstrap_host: host, bootstrap_port: port, bootstrap_room: room})
}

/** routers/error.rs status_code_to_str, for the statuses the router answers with. */
const STATUS_TYPE: Record<number, string> = {
  400: 'bad_request',
  404: 'not_found',
  408: 'request_timeout',
  429: 'too_many_requests',
  500: 'internal_server_error',
  502: 'bad_gateway',
  503: 'service_unavailable',
  504: 'gateway_timeout',
}

/** routers/error.rs create_error: {"error": {"message", "type", "code"}}. */
export function gatewayError(
  status: number,
  code: string,
  message: string,
): {error: {message: string; type: string; code: string}} {
  return {error: {message, type: STATUS_TYPE[status] ?? 'unknown_status_code', code}}
}

/**
 * How pd_router.rs maps a worker's error status to the router's answer (process_prefill_response and
 * handle_decode_error_response): 400, 404, 500, 502 and 503 keep their status, anything else becomes a 500.
 */
function mapWorkerError(status: number, side: 'prefill' | 'decode'): {status: number; code: string} {
  switch (status) {
    case 400:
      return {status, code: `${side}_bad_request`}
    case 404:
      return {status, code: `${side}_not_found`}
    case 500:
      return {status, code: `${side}_internal_error`}
    case 502:
      return {status, code: `${side}_bad_gateway`}
    case 503:
      return {status, code: `${side}_unavailable`}
    default:
      return {status: 500, code: `${side}_error`}
  }
}

/** Rust's StatusCode Display: "500 Internal Server Error". */
const statusDisplay = (status: number): string => `${status} ${http.STATUS_CODES[status] ?? '<unknown status code>'}`

/** grpc/utils.rs error_type_from_status: the error_type label of smg_worker_errors_total. */
function errorTypeFromStatus(status: number): string {
  switch (status) {
    case 400:
      return 'invalid_request'
    case 401:
      return 'auth_error'
    case 403:
      return 'permission_denied'
    case 404:
      return 'not_found'
    case 408:
      return 'timeout'
    case 429:
      return 'rate_limit_exceeded'
    case 501:
      return 'not_supported'
    case 502:
      return 'upstream_error'
    case 503:
      return 'service_unavailable'
    default:
      return 'internal_error'
  }
}

function readAll(res: http.IncomingMessage): Promise<{text: string} | {error: string}> {
  return new Promise(resolve => {
    const chunks: Buffer[] = []
    res.on('data', (c: Buffer) => chunks.push(c))
    res.on('end', () => resolve({text: Buffer.concat(chunks).toString('utf8')}))
    res.on('error', e => resolve({error: e.message}))
    res.on('aborted', () => resolve({error: 'connection closed before message completed'}))
    res.on('close', () => {
      if (!res.complete) resolve({error: 'connection closed before message completed'})
    })
    res.resume()
  })
}

/** What one attempt produced: an answer the router builds, or decode's response to pass through. */
type Answer =
  | {kind: 'built'; status: number; contentType: string; body: string; error?: string}
  | {kind: 'pass'; status: number; res: http.IncomingMessage}

interface AttemptResult {
  answer: Answer
  room: bigint | null
  prefillStatus: number | null
  decodeStatus: number | null
}

export async function startRouter(opts: RouterOptions): Promise<RunningRouter> {
  // Unset (undefined) settings keep the real router's defaults.
  const defined = <T extends object>(o: Partial<T> | undefined): Partial<T> =>
    Object.fromEntries(Object.entries(o ?? {}).filter(([, v]) => v !== undefined)) as Partial<T>
  const health: HealthCheckSettings = {...ROUTER_HEALTH_DEFAULTS, ...defined(opts.health)}
  const retry: RetrySettings = {...RETRY_DEFAULTS, ...defined(opts.retry)}
  const cbSettings: CircuitBreakerSettings = {...CB_DEFAULTS, ...defined(opts.circuitBreaker)}
  const random = opts.random ?? Math.random
  const requestTimeoutMs = (opts.requestTimeoutS ?? 1800) * 1000
  const log = opts.log ?? (() => {})
  const agent = new http.Agent({keepAlive: true, maxSockets: Infinity, maxFreeSockets: 256})

  const metrics = new PromRegistry()
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

  // Synchronous appends: a reader never misses a line for a request that was already answered.
  let truthFd: number | undefined
  if (opts.truthFile) {
    mkdirSync(dirname(opts.truthFile), {recursive: true})
    truthFd = openSync(opts.truthFile, 'a')
  }
  const record = (o: Record<string, unknown>): void => {
    if (truthFd !== undefined) writeSync(truthFd, JSON.stringify({t: now(), role: 'router', ...o}) + '\n')
  }

  if (opts.prefill.length === 0 || opts.decode.length === 0)
    throw new Error('the PD router needs at least one prefill and one decode worker')
  const bootstrapOf = new Map(opts.prefill.map(p => [p.url, p.bootstrapPort]))
  const listed = [
    ...opts.prefill.map(p => ['prefill', p.url] as const),
    ...opts.decode.map(u => ['decode', u] as const),
  ]
  const workers = listed.map(([role, url]) => {
    metrics.set('smg_worker_health', {worker: url}, 0)
    const h = new WorkerHealth(url, health, ok => {
      metrics.set('smg_worker_health', {worker: url}, ok ? 1 : 0)
      log(`Worker ${role} ${url} is now ${ok ? 'healthy' : 'unhealthy'}`)
    })
    // The breaker's metric label is the worker's URL (worker_builder.rs), its state published from the start.
    metrics.set('smg_worker_cb_state', {worker: url}, CB_STATE_CODE.closed)
    const cb = new CircuitBreaker(cbSettings, {
      transition: (from, to) => {
        log(`Circuit breaker state transition: ${from} -> ${to} (${role} ${url})`)
        metrics.inc('smg_worker_cb_transitions_total', {worker: url, from, to})
        metrics.set('smg_worker_cb_state', {worker: url}, CB_STATE_CODE[to])
        record({event: 'breaker', worker: url, workerType: role, from, to})
      },
      counts: (failures, successes) => {
        metrics.set('smg_worker_cb_consecutive_failures', {worker: url}, failures)
        metrics.set('smg_worker_cb_consecutive_successes', {worker: url}, successes)
      },
    })
    return {role, url, h, cb, load: 0}
  })
  type Worker = (typeof workers)[number]
  const ofRole = (role: 'prefill' | 'decode'): Worker[] => workers.filter(w => w.role === role)
  const cacheAware = {...CACHE_AWARE_DEFAULTS, ...defined(opts.cacheAware)}
  const policies = {
    prefill: makePolicy(opts.policy?.prefill ?? 'cache_aware', random, cacheAware),
    decode: makePolicy(opts.policy?.decode ?? 'cache_aware', random, cacheAware),
  }
  // pd_router.rs readiness(): at least one healthy prefill and one healthy decode worker.
  const ready = (): boolean => ofRole('prefill').some(w => w.h.healthy) && ofRole('decode').some(w => w.h.healthy)

  const upstream = (
    url: string,
    body: string,
    onRes: (res: http.IncomingMessage) => void,
    onErr: (e: Error) => void,
  ): http.ClientRequest => {
    const req = http.request(
      url + '/generate',
      {
        method: 'POST',
        agent,
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

  const sendJson = (res: http.ServerResponse, status: number, obj: unknown): void => {
    const text = JSON.stringify(obj)
    res.writeHead(status, {'content-type': 'application/json', 'content-length': Buffer.byteLength(text)})
    res.end(text)
  }
  const built = (status: number, code: string, message: string): Answer => ({
    kind: 'built',
    status,
    contentType: 'application/json',
    body: JSON.stringify(gatewayError(status, code, message)),
    error: message,
  })

  /**
   * select_pd_pair → pick_worker_by_policy_arc: each role among its workers that are healthy and whose breaker lets
   * requests through.
   */
  const selectPair = (text: string): {prefill: Worker; decode: Worker; decodeOnly?: boolean} | {error: string} => {
    const pick = (role: 'prefill' | 'decode'): Worker | string => {
      const available = ofRole(role).filter(w => w.h.healthy && w.cb.canExecute())
      if (available.length === 0) return `No available ${role} workers (all circuits open or unhealthy)`
      return available[policies[role].select(available, text)]!
    }
    const prefill = pick('prefill')
    if (typeof prefill === 'string') {
      // The defect: a healthy prefill behind an open breaker is still named in the body, and decode is sent alone.
      const shut = opts.halfDispatch ? ofRole('prefill').find(w => w.h.healthy && !w.cb.canExecute()) : undefined
      const decode = shut ? pick('decode') : undefined
      if (shut && decode !== undefined && typeof decode !== 'string') return {prefill: shut, decode, decodeOnly: true}
      return {error: prefill}
    }
    const decode = pick('decode')
    if (typeof decode === 'string') return {error: decode}
    return {prefill, decode}
  }

  const generate = (res: http.ServerResponse, raw: string): void => {
    metrics.inc('smg_router_requests_total', {route: '/generate'})
    let body: unknown
    try {
      body = parseRoomJson(raw)
    } catch {
      body = undefined
    }
    if (body === null || typeof body !== 'object' || Array.isArray(body)) {
      metrics.inc('smg_router_request_errors_total', {route: '/generate', error_type: 'bad_request'})
      sendJson(res, 400, gatewayError(400, 'bad_request', 'request body must be a JSON object'))
      return
    }
    const request = body as Record<string, unknown>
    const rid = typeof request.rid === 'string' ? request.rid : null
    const requestText = typeof request.text === 'string' ? request.text : ''
    const stream = request.stream === true
    const sentAt = now()
    const maxAttempts = attemptsAllowed(retry)

    let done = false
    let clientGone = false
    let cancelAttempt: (() => void) | undefined
    let backoff: {timer: NodeJS.Timeout; wake: () => void} | undefined
    let last: AttemptResult | undefined
    let attempts = 0

    const finish = (status: number, detail: Record<string, unknown> = {}): void => {
      done = true
      if (status >= 400)
        metrics.inc('smg_router_request_errors_total', {
          route: '/generate',
          error_type: status === 502 ? 'upstream' : String(status),
        })
      record({
        event: 'answered',
        rid,
        room: last?.room?.toString() ?? null,
        attempts,
        status,
        sentAt,
        ms: now() - sentAt,
        prefillStatus: last?.prefillStatus ?? null,
        decodeStatus: last?.decodeStatus ?? null,
        ...detail,
      })
    }

    /** One attempt: execute_dual_dispatch's operation closure around execute_dual_dispatch_internal. */
    const attempt = (n: number): Promise<AttemptResult> =>
      new Promise(resolve => {
        const startedAt = now()
        // The pair this attempt went to (none when selection failed): its load and its breakers.
        let chosen: Worker[] = []
        let settled = false
        const settle = (r: AttemptResult): void => {
          if (settled) return
          settled = true
          cancelAttempt = undefined
          for (const w of chosen) w.load--
          record({
            event: 'attempt',
            rid,
            room: r.room?.toString() ?? null,
            attempt: n,
            status: r.answer.status,
            prefillStatus: r.prefillStatus,
            decodeStatus: r.decodeStatus,
            ms: now() - startedAt,
            ...(r.answer.kind === 'built' && r.answer.error ? {error: r.answer.error} : {}),
          })
          resolve(r)
        }
        const pair = selectPair(requestText)
        if ('error' in pair) {
          // handle_server_selection_error: a 503 before anything is sent, no breaker outcome recorded.
          settle({
            answer: built(503, 'server_selection_failed', `No available servers: ${pair.error}`),
            room: null,
            prefillStatus: null,
            decodeStatus: null,
          })
          return
        }
        chosen = pair.decodeOnly ? [pair.decode] : [pair.prefill, pair.decode]
        // WorkerLoadGuard: the pair's load counts this attempt until it settles.
        for (const w of chosen) w.load++
        const room = randomRoom()
        const text = injectBootstrap(
          request,
          new URL(pair.prefill.url).hostname,
          bootstrapOf.get(pair.prefill.url)!,
          room,
        )
        record({
          event: 'sent',
          rid,
          room: room.toString(),
          attempt: n,
          prefill: pair.prefill.url,
          decode: pair.decode.url,
        })

        type Leg = {res: http.IncomingMessage} | {error: string}
        let p: Leg | undefined
        let d: Leg | undefined
        let joined = false
        const legs: http.ClientRequest[] = []
        const drop = (): void => {
          for (const r of legs) r.destroy()
          for (const l of [p, d]) if (l && 'res' in l) l.res.destroy()
        }
        // The client went away: drop both legs and end the attempt without an outcome (nothing reached the client).
        cancelAttempt = () => {
          drop()
          if (!settled) {
            settled = true
            for (const w of chosen) w.load--
            resolve({
              answer: built(499, 'client_disconnected', 'client disconnected'),
              room,
              prefillStatus: null,
              decodeStatus: null,
            })
          }
        }

        /**
         * The attempt's answer, and what each breaker of the pair records (dispatch.rs: per leg where the leg decided
         * the
         * outcome, BreakerOutcomesRecorded; else the final status for both): 2xx and 4xx are not a worker's fault.
         */
        const outcome = (
          answer: Answer,
          prefillStatus: number | null,
          decodeStatus: number | null,
          records?: Array<[Worker, boolean]>,
        ): void => {
          const ok = (answer.status >= 200 && answer.status < 300) || (answer.status >= 400 && answer.status < 500)
          for (const [w, good] of records ?? chosen.map(w => [w, ok] as [Worker, boolean])) {
            w.cb.record(good)
            metrics.inc('smg_worker_cb_outcomes_total', {worker: w.url, outcome: good ? 'success' : 'failure'})
          }
          if (answer.status >= 500) {
            for (const role of ROLES)
              metrics.inc('smg_worker_errors_total', {
                worker_type: role,
                connection_mode: 'http',
                error_type: errorTypeFromStatus(answer.status),
              })
          }
          settle({answer, room, prefillStatus, decodeStatus})
        }
        /**
         * A finished answer is drained (its connection goes back to the pool intact); one still streaming is closed.
         */
        const letGo = (r: http.IncomingMessage): void => {
          if (r.complete) r.resume()
          else r.destroy()
        }
        const clientFault = (status: number): boolean => status >= 400 && status < 500
        const failed = (l: Leg | undefined): boolean =>
          l !== undefined && ('error' in l || (l.res.statusCode ?? 0) < 200 || (l.res.statusCode ?? 0) >= 300)

        /** handle_decode_error_response: decode's transport error or error status as the router answers it. */
        const decodeError = async (leg: Leg): Promise<Answer | undefined> => {
          if ('error' in leg) return built(502, 'decode_server_error', `Decode server error: ${leg.error}`)
          const dres = leg.res
          const ds = dres.statusCode ?? 0
          const read = await readAll(dres)
          if (clientGone) return undefined
          if (stream) {
            let message: unknown
            if ('error' in read) message = `Decode server error: ${read.error}`
            else {
              try {
                message = JSON.parse(read.text)
              } catch {
                message = read.text
              }
            }
            const sse = `data: {'error': ${JSON.stringify({message, status: ds})}}`
            return {
              kind: 'built',
              status: ds,
              contentType: 'text/event-stream',
              body: sse,
              error: `decode status ${ds}`,
            }
          }
          const mapped = mapWorkerError(ds, 'decode')
          if ('error' in read) return built(mapped.status, 'decode_read_failed', `Decode server error: ${read.error}`)
          let message = read.text
          try {
            const j = JSON.parse(read.text) as {error?: {message?: unknown}; message?: unknown}
            if (typeof j?.error?.message === 'string') message = j.error.message
            else if (typeof j?.message === 'string') message = j.message
          } catch {}
          return built(mapped.status, mapped.code, message)
        }

        /**
         * process_prefill_response on a failed prefill: its transport error or error status as the router answers it.
         */
        const prefillError = async (leg: Leg): Promise<Answer | undefined> => {
          if ('error' in leg) {
            return built(
              502,
              'prefill_server_error',
              `Prefill server error: ${leg.error}. This will cause decode timeout.`,
            )
          }
          const ps = leg.res.statusCode ?? 0
          const read = await readAll(leg.res)
          if (clientGone) return undefined
          const mapped = mapWorkerError(ps, 'prefill')
          const text = 'error' in read ? 'Unknown prefill error' : read.text
          return built(mapped.status, mapped.code, `Prefill server error (${statusDisplay(ps)}): ${text}`)
        }

        /**
         * execute_dual_dispatch_internal: both legs are polled until prefill resolves. Decode failing first drops
         * prefill
         * and ticks decode alone; prefill failing drops decode (it would wait for KV that never comes) and ticks
         * prefill
         * alone, so a prefill error storm cannot trip a healthy decode's breaker. Prefill ok: decode's answer decides.
         */
        const join = async (): Promise<void> => {
          if (joined) return
          const statusOf = (l: Leg | undefined): number | null => (l && 'res' in l ? (l.res.statusCode ?? 0) : null)
          if (p === undefined) {
            if (!failed(d)) return
            joined = true
            legs[0]?.destroy()
            const ds = statusOf(d)
            const answer = await decodeError(d!)
            if (answer) outcome(answer, null, ds, [[pair.decode, ds !== null && clientFault(ds)]])
            return
          }
          const ps = statusOf(p)
          if (failed(p)) {
            joined = true
            // Decode is dropped: its connection closed (decode aborts the request), or an answer it already gave
            // drained.
            if (d && 'res' in d) letGo(d.res)
            else legs[1]?.destroy()
            const answer = await prefillError(p)
            if (answer) outcome(answer, ps, statusOf(d), [[pair.prefill, ps !== null && clientFault(ps)]])
            return
          }
          if (d === undefined) return
          joined = true
          const ds = statusOf(d)
          const pres = (p as {res: http.IncomingMessage}).res
          if (failed(d)) {
            letGo(pres)
            const answer = await decodeError(d)
            if (answer)
              outcome(answer, ps, ds, [
                [pair.prefill, true],
                [pair.decode, ds !== null && clientFault(ds)],
              ])
            return
          }
          // Both answered 2xx: prefill's body is read to its end, then decode's answer passes through.
          const dres = (d as {res: http.IncomingMessage}).res
          await readAll(pres)
          if (clientGone) return
          outcome({kind: 'pass', status: ds!, res: dres}, ps, ds)
        }

        const onLeg =
          (side: 'prefill' | 'decode', url: string) =>
          (r: http.IncomingMessage): void => {
            metrics.inc('smg_router_upstream_responses_total', {worker: url, status: String(r.statusCode)})
            r.pause()
            if (side === 'prefill') p = {res: r}
            else d = {res: r}
            void join()
          }
        const onErr =
          (side: 'prefill' | 'decode', url: string) =>
          (e: Error): void => {
            if (side === 'prefill' ? p !== undefined : d !== undefined) return
            metrics.inc('smg_router_upstream_responses_total', {worker: url, status: 'error'})
            if (side === 'prefill') p = {error: e.message}
            else d = {error: e.message}
            void join()
          }
        if (pair.decodeOnly) {
          // --bug half-dispatch: no prefill leg; decode's answer (whenever it gives up waiting for KV) is the
          // attempt's.
          record({
            event: 'half-dispatch',
            rid,
            room: room.toString(),
            attempt: n,
            prefill: pair.prefill.url,
            decode: pair.decode.url,
          })
          const whole = (r: http.IncomingMessage): void => {
            metrics.inc('smg_router_upstream_responses_total', {worker: pair.decode.url, status: String(r.statusCode)})
            const ds = r.statusCode ?? 0
            if (ds >= 200 && ds < 300) return outcome({kind: 'pass', status: ds, res: r}, null, ds)
            void decodeError({res: r}).then(a => a && outcome(a, null, ds))
          }
          const lost = (e: Error): void =>
            outcome(built(502, 'decode_server_error', `Decode server error: ${e.message}`), null, null)
          legs.push(upstream(pair.decode.url, text, whole, lost))
          return
        }
        legs.push(
          upstream(pair.prefill.url, text, onLeg('prefill', pair.prefill.url), onErr('prefill', pair.prefill.url)),
        )
        legs.push(upstream(pair.decode.url, text, onLeg('decode', pair.decode.url), onErr('decode', pair.decode.url)))
      })

    const deliver = (r: AttemptResult): void => {
      const a = r.answer
      if (a.kind === 'built') {
        finish(a.status, a.error ? {error: a.error} : {})
        res.writeHead(a.status, {'content-type': a.contentType, 'content-length': Buffer.byteLength(a.body)})
        res.end(a.body)
        return
      }
      const d = a.res
      const headers: http.OutgoingHttpHeaders = {'content-type': d.headers['content-type'] ?? 'application/json'}
      if (d.headers['content-length']) headers['content-length'] = d.headers['content-length']
      res.writeHead(a.status, headers)
      // Recorded before pipe() ends the response, so the truth line exists once the client has its answer.
      d.on('end', () => {
        if (!done) finish(a.status)
      })
      d.on('error', () => {
        if (!done) finish(502, {error: 'decode stream broke'})
        res.destroy()
      })
      d.pipe(res)
      d.resume()
    }

    /**
     * RetryExecutor::execute_response_with_retry: attempts until one is not retryable or max(max_retries, 1) are used.
     */
    const run = async (): Promise<void> => {
      for (let n = 0; ; n++) {
        attempts = n + 1
        last = await attempt(n)
        if (clientGone) return
        const status = last.answer.status
        if (!isRetryableStatus(status)) return deliver(last)
        if (n + 1 >= maxAttempts) {
          for (const role of ROLES)
            metrics.inc('smg_worker_retries_exhausted_total', {worker_type: role, endpoint: ENDPOINT})
          return deliver(last)
        }
        if (last.answer.kind === 'pass') last.answer.res.destroy()
        const delayMs = backoffDelayMs(retry, n, random)
        for (const role of ROLES) metrics.inc('smg_worker_retries_total', {worker_type: role, endpoint: ENDPOINT})
        metrics.observe('smg_worker_retry_backoff_seconds', {attempt: String(n + 1)}, delayMs / 1000)
        record({event: 'retry', rid, attempt: n + 1, afterStatus: status, backoffMs: delayMs})
        await new Promise<void>(wake => {
          backoff = {timer: setTimeout(wake, delayMs), wake}
        })
        backoff = undefined
        if (clientGone) return
      }
    }

    // A client that goes away takes the attempt in flight with it (the servers abort on disconnect), or ends the
    // backoff.
    res.on('close', () => {
      if (res.writableFinished) return
      clientGone = true
      cancelAttempt?.()
      if (backoff) {
        clearTimeout(backoff.timer)
        backoff.wake()
      }
      if (last?.answer.kind === 'pass') last.answer.res.destroy()
      if (!done) finish(499, {error: 'client disconnected'})
    })

    void run()
  }

  const healthGenerate = async (res: http.ServerResponse): Promise<void> => {
    const codes = await Promise.all(workers.map(w => probe(w.url + '/health_generate', health.timeoutS * 1000, agent)))
    const ok = codes.every(c => c >= 200 && c < 300)
    sendJson(res, ok ? 200 : 503, {
      status: ok ? 'healthy' : 'unhealthy',
      workers: workers.map((w, i) => ({url: w.url, status: codes[i]})),
    })
  }

  const server = http.createServer((req, res) => {
    const path = (req.url ?? '/').split('?')[0]
    if (req.method === 'POST' && path === '/generate') {
      const chunks: Buffer[] = []
      let size = 0
      req.on('data', (c: Buffer) => {
        size += c.length
        if (size > MAX_BODY) {
          sendJson(res, 413, {error: {message: 'request body too large'}})
          req.destroy()
          return
        }
        chunks.push(c)
      })
      req.on('end', () => generate(res, Buffer.concat(chunks).toString('utf8')))
      return
    }
    if (req.method !== 'GET') {
      sendJson(res, 405, {error: {message: `method ${req.method} not allowed on ${path}`}})
      return
    }
    switch (path) {
      case '/health':
      case '/liveness':
        res.writeHead(200, {'content-type': 'text/plain'}).end('OK')
        return
      case '/readiness': {
        const ok = ready()
        sendJson(res, ok ? 200 : 503, {
          status: ok ? 'ready' : 'not ready',
          workers: workers.map(w => ({role: w.role, url: w.url, healthy: w.h.healthy})),
        })
        return
      }
      case '/health_generate':
        void healthGenerate(res)
        return
      default:
        sendJson(res, 404, {error: {message: `no route ${path}`}})
    }
  })
  server.keepAliveTimeout = 65_000

  const metricsServer = http.createServer((req, res) => {
    if ((req.url ?? '').split('?')[0] === '/metrics') {
      res.writeHead(200, {'content-type': 'text/plain; version=0.0.4'}).end(metrics.render())
    } else {
      res.writeHead(404).end()
    }
  })

  const listen = (s: http.Server, port: number): Promise<number> =>
    new Promise((resolve, reject) => {
      s.once('error', reject)
      s.listen(port, opts.host, () => {
        s.off('error', reject)
        resolve((s.address() as AddressInfo).port)
      })
    })

  const port = await listen(server, opts.port)
  let metricsPort: number
  try {
    metricsPort = await listen(metricsServer, opts.metricsPort)
  } catch (error) {
    server.close()
    throw error
  }
  for (const w of workers) w.h.start()
  const hostForUrl = opts.host.includes(':') ? `[${opts.host}]` : opts.host
  const shown = (role: 'prefill' | 'decode') =>
    ofRole(role)
      .map(w => (role === 'prefill' ? `${w.url} bootstrap ${bootstrapOf.get(w.url)}` : w.url))
      .join(', ')
  log(
    `sgl-model-gateway (twin) PD router listening on ${hostForUrl}:${port}, prefill ${shown('prefill')} ` +
      `(${policies.prefill.name}), decode ${shown('decode')} (${policies.decode.name}), metrics on :${metricsPort}; ` +
      `${attemptsAllowed(retry)} attempt(s) per request${retry.disabled ? ' (retries disabled)' : ''}, circuit ` +
      `breaker ${cbSettings.disabled ? 'disabled' : `opens after ${cbSettings.failureThreshold} consecutive failures`}`,
  )

  return {
    url: `http://${hostForUrl}:${port}`,
    metricsUrl: `http://${hostForUrl}:${metricsPort}/metrics`,
    metrics,
    ready,
    async close() {
      for (const w of workers) w.h.stop()
      server.closeAllConnections()
      metricsServer.closeAllConnections()
      await Promise.all([new Promise(r => server.close(r)), new Promise(r => metricsServer.close(r))])
      agent.destroy()
      if (truthFd !== undefined) closeSync(truthFd)
      truthFd = undefined
    },
  }
}
