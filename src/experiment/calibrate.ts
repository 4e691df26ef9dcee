import type {Calibration} from '../model/timeline.js'
import type {MeasuredLags} from '../model/lags.js'
import type {Deployment} from '../deployment/config.js'
import type {RouterClient} from '../engines/sglang/deployment/router-client.js'
import {newRid, newRoom, type SglangClient} from '../engines/sglang/deployment/sglang-client.js'
import {PdError} from '../errors.js'
import {measureLags} from './lag-probes.js'
import {ExitCode} from '../exit-codes.js'

/**
 * Calibration on unfaulted requests, before any fault: how long a request takes to reach the prefill inflight
 * queue, and how late pdchaos sees what a server did. These become ε in every verdict, so they are measured in
 * the same run on the same deployment, never assumed.
 */

export interface CalibrateClients {
  prefill: SglangClient
  decode: SglangClient
  router: RouterClient
}

const quantile = (xs: number[], q: number): number => {
  const s = [...xs].sort((a, b) => a - b)
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))]
}

/** The warm-up: a fresh deployment opens its routes and KV connections on the first request, which can take longer
 * than a short watchdog deadline; it is tried until one pair succeeds, within these bounds. */
const WARM_UP_TRIES = 8
const WARM_UP_MS = 60_000

type Pair = {rid: string; prefill: {status: number; ms: number; body: unknown}; decode?: {status: number}}

/**
 * One request as the gateway sends it: the same rid and room to both servers; prefill answers once its KV transfer
 * is done. When prefill fails it (a cold start the watchdog evicted), decode is told at once, as the gateway would
 * drop it: decode never hears of it otherwise and holds its half until its waiting timeout.
 */
async function pair(
  deployment: Deployment,
  c: Pick<CalibrateClients, 'prefill' | 'decode'>,
  text: string,
): Promise<Pair> {
  const rid = newRid('pdchaos-cal')
  const req = {
    rid,
    text,
    max_new_tokens: 1,
    bootstrap_host: new URL(deployment.services.prefill.url).hostname,
    bootstrap_port: deployment.services.prefill.bootstrapPort,
    bootstrap_room: newRoom(),
  }
  const dropDecode = new AbortController()
  const decode = c.decode.generate(req, {timeoutMs: 30_000, signal: dropDecode.signal}).catch(() => undefined)
  const p = await c.prefill.generate(req, {timeoutMs: 30_000})
  if (p.status !== 200) {
    await c.decode.abort(rid).catch(() => undefined)
    dropDecode.abort()
  }
  const d = await decode
  return {rid, prefill: {status: p.status, ms: p.ms, body: p.body}, ...(d ? {decode: {status: d.status}} : {})}
}

/** Pairs until one succeeds end to end (prefill and decode 200), at most WARM_UP_TRIES within WARM_UP_MS. */
export async function warmUp(
  deployment: Deployment,
  c: Pick<CalibrateClients, 'prefill' | 'decode'>,
  text = 'warm up',
  signal?: AbortSignal,
): Promise<{ok: boolean; tries: number; last?: Pair}> {
  const by = Date.now() + WARM_UP_MS
  let last: Pair | undefined
  let tries = 0
  while (tries < WARM_UP_TRIES && Date.now() < by && !signal?.aborted) {
    tries++
    last = await pair(deployment, c, text)
    if (last.prefill.status === 200 && last.decode?.status === 200) return {ok: true, tries, last}
  }
  return {ok: false, tries, ...(last ? {last} : {})}
}

const answerText = (body: unknown): string =>
  (typeof body === 'string' ? body : (JSON.stringify(body) ?? '')).slice(0, 300)

/** Held requests measured at once at most: enough for the pins' concurrency to show, few enough to stay short. */
export const LAG_PROBES_MAX = 32

/** The pins' concurrency, for the lag probes: how many, sent `burst` at a time `gapMs` apart (0: no lag probes). */
export interface LagProbeShape {
  count: number
  burst: number
  gapMs: number
}

/** A stop (Ctrl-C) while calibrating: between two requests, never with a probe left held on the deployment. */
const stoppedCalibrating = (signal: AbortSignal): PdError =>
  new PdError(`stopped while calibrating: ${String(signal.reason ?? 'interrupted')}`, {
    exit: ExitCode.stopped,
    code: 'E_STOPPED',
  })

export async function calibrate(
  deployment: Deployment,
  c: CalibrateClients,
  opts: {
    requests?: number
    promptTokens?: number
    routerToo?: boolean
    lagProbes?: LagProbeShape
    signal?: AbortSignal
  } = {},
): Promise<Calibration & {routerMs: number}> {
  const n = opts.requests ?? 8
  const text = 'chaos '.repeat(Math.round(((opts.promptTokens ?? 128) * 4) / 6))
  const stop = opts.signal
  const checkStop = (): void => {
    if (stop?.aborted) throw stoppedCalibrating(stop)
  }
  // Warm up (not counted): until one pair succeeds end to end, with a deadline.
  const {last: warm, ok} = await warmUp(deployment, c, text, stop)
  checkStop()
  if (!ok) {
    throw unhealthy(
      `no unfaulted request succeeded in ${WARM_UP_TRIES} tries before any fault (last ${warm?.rid}: ` +
        `prefill ${warm?.prefill.status} ${answerText(warm?.prefill.body)}, ` +
        `decode ${warm?.decode?.status ?? 'dropped'})`,
    )
  }
  const {prefillMs, routerMs} = await timedRequests(deployment, c, {n, text, routerToo: opts.routerToo, checkStop})
  // One observation hop each way: router and prefill round trips on cheap endpoints.
  const hops: number[] = []
  for (let i = 0; i < 20; i++) {
    checkStop()
    const a = await c.router.liveness()
    // /v1/loads is answered from a shared snapshot, not by the scheduler: a pure network hop.
    const b = await c.prefill.health('/v1/loads')
    hops.push(a.ms + b.ms)
  }
  checkStop()
  const lags = await lagsOf(deployment, c, opts.lagProbes, text)
  return {
    ...(lags && lags.samples > 0 ? {lags} : {}),
    prefillMs: quantile(prefillMs, 0.5),
    prefillSpreadMs: quantile(prefillMs, 0.99) - quantile(prefillMs, 0.01),
    observeMs: quantile(hops, 0.99),
    samples: n,
    routerMs: routerMs.length > 0 ? quantile(routerMs, 0.5) : Number.NaN,
  }
}

const unhealthy = (what: string) =>
  new PdError(`${what}: the deployment is not healthy`, {
    exit: ExitCode.unreachable,
    suggestion: 'run `pdchaos status` and fix the deployment before injecting faults',
  })

/** n unfaulted requests, each timed on prefill (and through the router unless told not to); any failure ends it. */
async function timedRequests(
  deployment: Deployment,
  c: CalibrateClients,
  o: {n: number; text: string; routerToo?: boolean; checkStop: () => void},
): Promise<{prefillMs: number[]; routerMs: number[]}> {
  const prefillMs: number[] = []
  const routerMs: number[] = []
  for (let i = 0; i < o.n; i++) {
    o.checkStop()
    const r = await pair(deployment, c, o.text)
    if (r.prefill.status !== 200 || r.decode?.status !== 200) {
      throw unhealthy(
        `calibration request ${r.rid} failed before any fault ` +
          `(prefill ${r.prefill.status} ${answerText(r.prefill.body)}, decode ${r.decode?.status ?? 'dropped'})`,
      )
    }
    prefillMs.push(r.prefill.ms)
    if (o.routerToo === false) continue
    const routed = await c.router.generate(
      {rid: newRid('pdchaos-cal'), text: o.text, max_new_tokens: 1},
      {timeoutMs: 30_000},
    )
    if (routed.status !== 200)
      throw unhealthy(
        `calibration request through the router failed before any fault (${routed.status} ${answerText(routed.body)})`,
      )
    routerMs.push(routed.ms)
  }
  return {prefillMs, routerMs}
}

/** Entry and answer lag, under the pins' concurrency: aborted long before the watchdog could evict one. */
async function lagsOf(
  deployment: Deployment,
  c: CalibrateClients,
  lagProbes: LagProbeShape | undefined,
  text: string,
): Promise<MeasuredLags | undefined> {
  const shape = lagProbes ?? {count: 8, burst: 1, gapMs: 20}
  const {deadlineSeconds, pollSeconds} = deployment.watchdog
  if (shape.count <= 0) return undefined
  return measureLags(c.prefill, {
    count: Math.min(shape.count, LAG_PROBES_MAX),
    burst: shape.burst,
    gapMs: shape.gapMs,
    text,
    holdLimitMs: Math.min(deadlineSeconds * 500, 10_000),
    answerWaitMs: Math.min((deadlineSeconds + pollSeconds) * 1000 + 5000, 60_000),
    bootstrap: {
      host: new URL(deployment.services.prefill.url).hostname,
      port: deployment.services.prefill.bootstrapPort,
    },
  })
}
