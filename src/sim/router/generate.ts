import type http from 'node:http'

import {parseRoomJson} from '../server/json-room.js'
import {type AttemptResult, gatewayError, sendJson} from './answers.js'
import {attempt} from './attempt.js'
import {ENDPOINT, now, ROLES, type RouterCtx} from './context.js'
import type {RouterRequest} from './request-state.js'
import {attemptsAllowed, backoffDelayMs, isRetryableStatus} from './retry.js'

/** The request's answer is final: its error counter and its truth line (with the last attempt's room and statuses). */
function finish(ctx: RouterCtx, req: RouterRequest, status: number, detail: Record<string, unknown> = {}): void {
  req.done = true
  if (status >= 400)
    ctx.metrics.inc('smg_router_request_errors_total', {
      route: '/generate',
      error_type: status === 502 ? 'upstream' : String(status),
    })
  const {last, sentAt} = req
  ctx.record({
    event: 'answered',
    rid: req.rid,
    room: last?.room?.toString() ?? null,
    attempts: req.attempts,
    status,
    sentAt,
    ms: now() - sentAt,
    prefillStatus: last?.prefillStatus ?? null,
    decodeStatus: last?.decodeStatus ?? null,
    ...detail,
  })
}

/** The attempt's answer to the client: a built one at once, or decode's response piped through. */
function deliver(ctx: RouterCtx, req: RouterRequest, r: AttemptResult): void {
  const {res} = req
  const a = r.answer
  if (a.kind === 'built') {
    finish(ctx, req, a.status, a.error ? {error: a.error} : {})
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
    if (!req.done) finish(ctx, req, a.status)
  })
  d.on('error', () => {
    if (!req.done) finish(ctx, req, 502, {error: 'decode stream broke'})
    res.destroy()
  })
  d.pipe(res)
  d.resume()
}

/**
 * A retry's bookkeeping (counters, backoff summary, truth line), then its jittered backoff, cut short by a client gone.
 */
async function backOff(ctx: RouterCtx, req: RouterRequest, n: number, status: number): Promise<void> {
  const {metrics} = ctx
  const delayMs = backoffDelayMs(ctx.retry, n, ctx.random)
  for (const role of ROLES) metrics.inc('smg_worker_retries_total', {worker_type: role, endpoint: ENDPOINT})
  metrics.observe('smg_worker_retry_backoff_seconds', {attempt: String(n + 1)}, delayMs / 1000)
  ctx.record({event: 'retry', rid: req.rid, attempt: n + 1, afterStatus: status, backoffMs: delayMs})
  await new Promise<void>(wake => {
    req.backoff = {timer: setTimeout(wake, delayMs), wake}
  })
  req.backoff = undefined
}

/**
 * RetryExecutor::execute_response_with_retry: attempts until one is not retryable or max(max_retries, 1) are used.
 */
async function runRetries(ctx: RouterCtx, req: RouterRequest): Promise<void> {
  for (let n = 0; ; n++) {
    req.attempts = n + 1
    const last = await attempt(ctx, req, n)
    req.last = last
    if (req.clientGone) return
    const status = last.answer.status
    if (!isRetryableStatus(status)) return deliver(ctx, req, last)
    if (n + 1 >= req.maxAttempts) {
      for (const role of ROLES)
        ctx.metrics.inc('smg_worker_retries_exhausted_total', {worker_type: role, endpoint: ENDPOINT})
      return deliver(ctx, req, last)
    }
    if (last.answer.kind === 'pass') last.answer.res.destroy()
    await backOff(ctx, req, n, status)
    if (req.clientGone) return
  }
}

/**
 * A client that goes away takes the attempt in flight with it (the servers abort on disconnect), or ends the
 * backoff.
 */
function onClientClose(ctx: RouterCtx, req: RouterRequest): void {
  if (req.res.writableFinished) return
  req.clientGone = true
  req.cancelAttempt?.()
  if (req.backoff) {
    clearTimeout(req.backoff.timer)
    req.backoff.wake()
  }
  if (req.last?.answer.kind === 'pass') req.last.answer.res.destroy()
  if (!req.done) finish(ctx, req, 499, {error: 'client disconnected'})
}

/** POST /generate: a JSON object body, then the retry loop over PD attempts. */
export function generate(ctx: RouterCtx, res: http.ServerResponse, raw: string): void {
  ctx.metrics.inc('smg_router_requests_total', {route: '/generate'})
  let body: unknown
  try {
    body = parseRoomJson(raw)
  } catch {
    body = undefined
  }
  if (body === null || typeof body !== 'object' || Array.isArray(body)) {
    ctx.metrics.inc('smg_router_request_errors_total', {route: '/generate', error_type: 'bad_request'})
    sendJson(res, 400, gatewayError(400, 'bad_request', 'request body must be a JSON object'))
    return
  }
  const request = body as Record<string, unknown>
  const req: RouterRequest = {
    res,
    request,
    rid: typeof request.rid === 'string' ? request.rid : null,
    requestText: typeof request.text === 'string' ? request.text : '',
    stream: request.stream === true,
    sentAt: now(),
    maxAttempts: attemptsAllowed(ctx.retry),
    done: false,
    clientGone: false,
    cancelAttempt: undefined,
    backoff: undefined,
    last: undefined,
    attempts: 0,
  }
  res.on('close', () => onClientClose(ctx, req))
  void runRetries(ctx, req)
}
