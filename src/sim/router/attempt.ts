import type http from 'node:http'

import {
  type Answer,
  type AttemptResult,
  built,
  errorTypeFromStatus,
  injectBootstrap,
  letGo,
  readAll,
} from './answers.js'
import {now, type Pair, ROLES, type RouterCtx, selectPair, upstream, type Worker} from './context.js'
import {decodeError, prefillError} from './leg-errors.js'
import type {Leg, RouterRequest} from './request-state.js'
import {randomRoom} from './room.js'

/** One attempt in flight: the pair it went to, its room, its two legs and whether it has settled. */
interface Attempt {
  n: number
  startedAt: number
  // The pair this attempt went to (none when selection failed): its load and its breakers.
  chosen: Worker[]
  settled: boolean
  resolve: (r: AttemptResult) => void
  pair: Pair
  room: bigint
  text: string
  p: Leg | undefined
  d: Leg | undefined
  joined: boolean
  legs: http.ClientRequest[]
}

type Pending = Pick<Attempt, 'n' | 'startedAt' | 'chosen' | 'settled' | 'resolve'>

function settle(ctx: RouterCtx, req: RouterRequest, a: Pending, r: AttemptResult): void {
  if (a.settled) return
  a.settled = true
  req.cancelAttempt = undefined
  for (const w of a.chosen) w.load--
  ctx.record({
    event: 'attempt',
    rid: req.rid,
    room: r.room?.toString() ?? null,
    attempt: a.n,
    status: r.answer.status,
    prefillStatus: r.prefillStatus,
    decodeStatus: r.decodeStatus,
    ms: now() - a.startedAt,
    ...(r.answer.kind === 'built' && r.answer.error ? {error: r.answer.error} : {}),
  })
  a.resolve(r)
}

/**
 * The attempt's answer, and what each breaker of the pair records (dispatch.rs: per leg where the leg decided the
 * outcome, BreakerOutcomesRecorded; else the final status for both): 2xx and 4xx are not a worker's fault.
 */
function outcome(
  ctx: RouterCtx,
  req: RouterRequest,
  a: Attempt,
  answer: Answer,
  prefillStatus: number | null,
  decodeStatus: number | null,
  records?: Array<[Worker, boolean]>,
): void {
  const {metrics} = ctx
  const ok = (answer.status >= 200 && answer.status < 300) || (answer.status >= 400 && answer.status < 500)
  for (const [w, good] of records ?? a.chosen.map(w => [w, ok] as [Worker, boolean])) {
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
  settle(ctx, req, a, {answer, room: a.room, prefillStatus, decodeStatus})
}

const clientFault = (status: number): boolean => status >= 400 && status < 500
const failed = (l: Leg | undefined): boolean =>
  l !== undefined && ('error' in l || (l.res.statusCode ?? 0) < 200 || (l.res.statusCode ?? 0) >= 300)
const statusOf = (l: Leg | undefined): number | null => (l && 'res' in l ? (l.res.statusCode ?? 0) : null)

/** Decode failed before prefill answered: prefill is dropped and decode's breaker alone records the outcome. */
async function decodeFailedFirst(ctx: RouterCtx, req: RouterRequest, a: Attempt): Promise<void> {
  a.joined = true
  a.legs[0]?.destroy()
  const ds = statusOf(a.d)
  const answer = await decodeError(req, a.d!)
  if (answer) outcome(ctx, req, a, answer, null, ds, [[a.pair.decode, ds !== null && clientFault(ds)]])
}

/**
 * execute_dual_dispatch_internal: both legs are polled until prefill resolves. Decode failing first drops prefill
 * and ticks decode alone; prefill failing drops decode (it would wait for KV that never comes) and ticks prefill
 * alone, so a prefill error storm cannot trip a healthy decode's breaker. Prefill ok: decode's answer decides.
 */
async function join(ctx: RouterCtx, req: RouterRequest, a: Attempt): Promise<void> {
  if (a.joined) return
  const {p, d, pair} = a
  if (p === undefined) {
    if (failed(d)) await decodeFailedFirst(ctx, req, a)
    return
  }
  const ps = statusOf(p)
  if (failed(p)) {
    a.joined = true
    // Decode is dropped: its connection closed (decode aborts the request), or an answer it already gave drained.
    if (d && 'res' in d) letGo(d.res)
    else a.legs[1]?.destroy()
    const answer = await prefillError(req, p)
    if (answer) outcome(ctx, req, a, answer, ps, statusOf(a.d), [[pair.prefill, ps !== null && clientFault(ps)]])
    return
  }
  if (d === undefined) return
  a.joined = true
  const ds = statusOf(d)
  const pres = (p as {res: http.IncomingMessage}).res
  if (failed(d)) {
    letGo(pres)
    const answer = await decodeError(req, d)
    if (answer)
      outcome(ctx, req, a, answer, ps, ds, [
        [pair.prefill, true],
        [pair.decode, ds !== null && clientFault(ds)],
      ])
    return
  }
  // Both answered 2xx: prefill's body is read to its end, then decode's answer passes through.
  const dres = (d as {res: http.IncomingMessage}).res
  await readAll(pres)
  if (req.clientGone) return
  outcome(ctx, req, a, {kind: 'pass', status: ds!, res: dres}, ps, ds)
}

/** Both legs at once (tokio::join!): each answer or transport error is kept and the pair joined again. */
function dispatchBoth(ctx: RouterCtx, req: RouterRequest, a: Attempt): void {
  const onLeg =
    (side: 'prefill' | 'decode', url: string) =>
    (r: http.IncomingMessage): void => {
      ctx.metrics.inc('smg_router_upstream_responses_total', {worker: url, status: String(r.statusCode)})
      r.pause()
      if (side === 'prefill') a.p = {res: r}
      else a.d = {res: r}
      void join(ctx, req, a)
    }
  const onErr =
    (side: 'prefill' | 'decode', url: string) =>
    (e: Error): void => {
      if (side === 'prefill' ? a.p !== undefined : a.d !== undefined) return
      ctx.metrics.inc('smg_router_upstream_responses_total', {worker: url, status: 'error'})
      if (side === 'prefill') a.p = {error: e.message}
      else a.d = {error: e.message}
      void join(ctx, req, a)
    }
  const {prefill, decode} = a.pair
  a.legs.push(upstream(ctx, prefill.url, a.text, onLeg('prefill', prefill.url), onErr('prefill', prefill.url)))
  a.legs.push(upstream(ctx, decode.url, a.text, onLeg('decode', decode.url), onErr('decode', decode.url)))
}

/** --bug half-dispatch: no prefill leg; decode's answer (whenever it gives up waiting for KV) is the attempt's. */
function dispatchDecodeOnly(ctx: RouterCtx, req: RouterRequest, a: Attempt): void {
  const {pair} = a
  ctx.record({
    event: 'half-dispatch',
    rid: req.rid,
    room: a.room.toString(),
    attempt: a.n,
    prefill: pair.prefill.url,
    decode: pair.decode.url,
  })
  const whole = (r: http.IncomingMessage): void => {
    ctx.metrics.inc('smg_router_upstream_responses_total', {worker: pair.decode.url, status: String(r.statusCode)})
    const ds = r.statusCode ?? 0
    if (ds >= 200 && ds < 300) return outcome(ctx, req, a, {kind: 'pass', status: ds, res: r}, null, ds)
    void decodeError(req, {res: r}).then(answer => answer && outcome(ctx, req, a, answer, null, ds))
  }
  const lost = (e: Error): void =>
    outcome(ctx, req, a, built(502, 'decode_server_error', `Decode server error: ${e.message}`), null, null)
  a.legs.push(upstream(ctx, pair.decode.url, a.text, whole, lost))
}

/** The client went away: drop both legs and end the attempt without an outcome (nothing reached the client). */
function cancel(a: Attempt): void {
  for (const r of a.legs) r.destroy()
  for (const l of [a.p, a.d]) if (l && 'res' in l) l.res.destroy()
  if (!a.settled) {
    a.settled = true
    for (const w of a.chosen) w.load--
    a.resolve({
      answer: built(499, 'client_disconnected', 'client disconnected'),
      room: a.room,
      prefillStatus: null,
      decodeStatus: null,
    })
  }
}

/** One attempt: execute_dual_dispatch's operation closure around execute_dual_dispatch_internal. */
export function attempt(ctx: RouterCtx, req: RouterRequest, n: number): Promise<AttemptResult> {
  return new Promise(resolve => {
    const pending: Pending = {n, startedAt: now(), chosen: [], settled: false, resolve}
    const pair = selectPair(ctx, req.requestText)
    if ('error' in pair) {
      // handle_server_selection_error: a 503 before anything is sent, no breaker outcome recorded.
      settle(ctx, req, pending, {
        answer: built(503, 'server_selection_failed', `No available servers: ${pair.error}`),
        room: null,
        prefillStatus: null,
        decodeStatus: null,
      })
      return
    }
    pending.chosen = pair.decodeOnly ? [pair.decode] : [pair.prefill, pair.decode]
    // WorkerLoadGuard: the pair's load counts this attempt until it settles.
    for (const w of pending.chosen) w.load++
    const room = randomRoom()
    const host = new URL(pair.prefill.url).hostname
    const text = injectBootstrap(req.request, host, ctx.bootstrapOf.get(pair.prefill.url)!, room)
    ctx.record({
      event: 'sent',
      rid: req.rid,
      room: room.toString(),
      attempt: n,
      prefill: pair.prefill.url,
      decode: pair.decode.url,
    })
    const a: Attempt = {...pending, pair, room, text, p: undefined, d: undefined, joined: false, legs: []}
    req.cancelAttempt = () => cancel(a)
    if (pair.decodeOnly) dispatchDecodeOnly(ctx, req, a)
    else dispatchBoth(ctx, req, a)
  })
}
