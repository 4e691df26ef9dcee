import {Agent as HttpAgent, type ClientRequest, request as httpRequestRaw} from 'node:http'
import {Agent as HttpsAgent, request as httpsRequest} from 'node:https'

import {PdError, unreachable} from '../errors.js'
import {ExitCode} from '../exit-codes.js'
import {redactUrl} from '../util/redact.js'

/**
 * HTTP with a mandatory deadline and errors a user can act on. Every failure is a PdError (exit 5) that names
 * the service and the URL: refused, timed out, HTTP status, or a body that is not what was expected.
 * The deadline covers the whole exchange, body included, so a service that hangs mid-body still fails in time.
 */

export interface HttpRequest {
  /** Who answers, for messages: "prefill", "router", "bootstrap server"... */
  service: string
  url: string
  method?: 'GET' | 'POST' | 'PUT' | 'DELETE'
  /** A JSON text (sent with content-type application/json) or nothing. */
  body?: string
  headers?: Record<string, string>
  timeoutMs: number
  /** The caller's own cancel; aborting it gives a PdError with code E_ABORTED (exit 3). */
  signal?: AbortSignal
}

/** An answer's headers by lower-case name. Not the fetch API's Headers: that global loads undici, about 40 ms of
 * compilation in every CLI run that reads one header. */
export interface ResponseHeaders {
  get(name: string): string | null
}

export interface HttpResponse {
  status: number
  headers: ResponseHeaders
  text: string
  /** Wall time from sending to the last byte of the body. */
  ms: number
}

/** Longest piece of a body quoted in an error message. */
const SNIPPET = 120

export function snippet(text: string): string {
  const flat = text.replace(/\s+/g, ' ').trim()
  if (flat === '') return '(empty body)'
  return flat.length > SNIPPET ? JSON.stringify(flat.slice(0, SNIPPET)) + '…' : JSON.stringify(flat)
}

/**
 * GETs reuse connections. A run polls loads, liveness and metrics several times a second, and one connection per poll
 * left about 50 sockets a second in TIME_WAIT on the serving host (a minute each: thousands, which every reader of its
 * TCP table then walks). An idle pooled socket is closed after IDLE_MS, well before SGLang's own keep-alive timeout
 * (uvicorn's timeout_keep_alive=5 in entrypoints/http_server.py), so the server rarely closes one under a request; when
 * it does (or a restarted server dropped it), the GET is sent once more on a fresh connection. Other methods (pins,
 * aborts, generations) keep one connection each: their connection is part of what they do.
 */
const IDLE_MS = 2000
const pools = {
  'http:': new HttpAgent({keepAlive: true, timeout: IDLE_MS, maxFreeSockets: 8}),
  'https:': new HttpsAgent({keepAlive: true, timeout: IDLE_MS, maxFreeSockets: 8}),
}

/** Send one request and read the whole body. Throws only on transport failures; any HTTP status is returned. */
export async function httpRequest(req: HttpRequest): Promise<HttpResponse> {
  if (!(req.timeoutMs > 0)) throw new Error(`httpRequest: timeoutMs must be positive (got ${req.timeoutMs})`)
  // Never the password of a URL with credentials (http://user:pass@host) in what the user reads.
  const where = `${req.service} at ${redactUrl(req.url)}`
  const timeout = AbortSignal.timeout(req.timeoutMs)
  const signal = req.signal ? AbortSignal.any([timeout, req.signal]) : timeout
  const started = performance.now()
  const pooled = (req.method ?? 'GET') === 'GET'
  try {
    const res = await send(req, signal, pooled).catch((error: unknown) => {
      // A reused connection the server had already closed: nothing of this GET was answered; a fresh one decides.
      if (error instanceof StaleSocket && !signal.aborted) return send(req, signal, false)
      throw error instanceof StaleSocket ? error.cause : error
    })
    return {...res, ms: performance.now() - started}
  } catch (error) {
    throw transportError(where, req, error, timeout, performance.now() - started)
  }
}

/** A transport error on a pooled connection that was reused, before any answer: the request may be sent again. */
class StaleSocket extends Error {
  constructor(override readonly cause: unknown) {
    super('stale pooled connection')
  }
}

/**
 * node:http rather than fetch: fetch's dispatcher also gives up after 300 s without headers, which would cut a
 * generation that is pinned on purpose (watchdog deadlines, the router's 1800 s). The signal is the only deadline.
 */
function send(req: HttpRequest, signal: AbortSignal, pooled: boolean): Promise<Omit<HttpResponse, 'ms'>> {
  return new Promise((resolve, reject) => {
    let url: URL
    try {
      url = new URL(req.url)
    } catch {
      reject(Object.assign(new Error(`invalid URL ${JSON.stringify(redactUrl(req.url))}`), {code: 'ERR_INVALID_URL'}))
      return
    }
    const request = url.protocol === 'https:' ? httpsRequest : url.protocol === 'http:' ? httpRequestRaw : undefined
    if (!request) {
      reject(Object.assign(new Error(`unsupported protocol ${url.protocol}`), {code: 'ERR_INVALID_PROTOCOL'}))
      return
    }
    let settled = false
    const fail = (error: unknown) => {
      if (settled) return
      settled = true
      signal.removeEventListener('abort', onAbort)
      reject(error)
    }
    const onAbort = () => {
      fail(signal.reason)
      outgoing.destroy()
    }
    const headers: Record<string, string> = {...req.headers}
    if (req.body !== undefined) {
      headers['content-type'] ??= 'application/json'
      headers['content-length'] = String(Buffer.byteLength(req.body))
    }
    let answered = false
    const agent = pooled ? pools[url.protocol as keyof typeof pools] : false
    const outgoing: ClientRequest = request(url, {method: req.method ?? 'GET', headers, agent}, res => {
      answered = true
      const chunks: Buffer[] = []
      res.on('data', (c: Buffer) => chunks.push(c))
      res.on('error', fail)
      res.on('close', () => {
        if (settled) return
        if (!res.complete) {
          fail(Object.assign(new Error('connection closed mid-answer'), {code: 'ECONNRESET'}))
          return
        }
        settled = true
        signal.removeEventListener('abort', onAbort)
        const raw = res.headers
        const headers: ResponseHeaders = {
          get: name => {
            const v = raw[name.toLowerCase()]
            return v === undefined ? null : Array.isArray(v) ? v.join(', ') : v
          },
        }
        resolve({status: res.statusCode ?? 0, headers, text: Buffer.concat(chunks).toString('utf8')})
      })
    })
    outgoing.on('error', error =>
      fail(pooled && outgoing.reusedSocket && !answered && !signal.aborted ? new StaleSocket(error) : error),
    )
    if (signal.aborted) {
      onAbort()
      return
    }
    signal.addEventListener('abort', onAbort, {once: true})
    outgoing.end(req.body)
  })
}

function transportError(where: string, req: HttpRequest, error: unknown, timeout: AbortSignal, ms: number): PdError {
  if (req.signal?.aborted && !timeout.aborted) {
    return new PdError(`request to ${where} was cancelled after ${Math.round(ms)} ms`, {
      exit: ExitCode.stopped,
      code: 'E_ABORTED',
      cause: error,
    })
  }
  if (timeout.aborted) {
    return new PdError(`${where} did not answer within ${fmtSeconds(req.timeoutMs)}`, {
      exit: ExitCode.unreachable,
      code: 'E_TIMEOUT',
      suggestion:
        `check that the ${req.service} is not hung or overloaded (its log, its process state), or raise ` +
        `the timeout`,
      cause: error,
    })
  }
  const code = causeCode(error)
  if (code === 'ECONNREFUSED') {
    return unreachable(
      `${where} refused the connection`,
      `check that the ${req.service} is running and listening on that port`,
      error,
    )
  }
  if (code === 'ECONNRESET' || code === 'UND_ERR_SOCKET' || code === 'EPIPE') {
    return unreachable(
      `${where} closed the connection before its answer was complete (${code})`,
      `check the ${req.service} log: it may have crashed or restarted`,
      error,
    )
  }
  if (code?.startsWith('HPE_')) {
    return unreachable(
      `${where} answered garbage: not an HTTP response (${code})`,
      `check that the URL points at the ${req.service} HTTP port`,
      error,
    )
  }
  if (code === 'ENOTFOUND' || code === 'EAI_AGAIN') {
    return unreachable(`${where}: host name not found (${code})`, 'check the URL in the deployment file', error)
  }
  const detail = code ?? (error instanceof Error ? error.message : String(error))
  return unreachable(`${where} is unreachable: ${detail}`, `check the URL and that the ${req.service} is up`, error)
}

/** undici hides the socket error under `cause` (sometimes twice). */
function causeCode(error: unknown): string | undefined {
  let e: unknown = error
  for (let depth = 0; depth < 4 && e && typeof e === 'object'; depth++) {
    const code = (e as {code?: unknown}).code
    if (typeof code === 'string' && code !== 'ABORT_ERR') return code
    e = (e as {cause?: unknown}).cause
  }
  return undefined
}

export function fmtSeconds(ms: number): string {
  return ms % 1000 === 0 ? `${ms / 1000} s` : `${(ms / 1000).toFixed(1)} s`
}

/** A non-2xx answer as the error a user reads. */
export function statusError(
  service: string,
  url: string,
  res: Pick<HttpResponse, 'status' | 'text'>,
  suggestion?: string,
): PdError {
  return unreachable(
    `${service} at ${redactUrl(url)} answered HTTP ${res.status}: ${snippet(res.text)}`,
    suggestion ?? `check the ${service} log and health`,
  )
}

/** Parse a body that must be JSON; anything else is "answered garbage". */
export function parseJsonBody(service: string, url: string, res: Pick<HttpResponse, 'text'>): unknown {
  try {
    return JSON.parse(res.text)
  } catch {
    throw unreachable(
      `${service} at ${redactUrl(url)} answered garbage: ${snippet(res.text)} is not JSON`,
      `check that the URL points at the ${service} and not another service`,
    )
  }
}

/** GET (or send) and require a 2xx JSON answer. */
export async function requestJson(req: HttpRequest): Promise<{json: unknown; status: number; ms: number}> {
  const res = await httpRequest(req)
  if (res.status < 200 || res.status > 299) throw statusError(req.service, req.url, res)
  return {json: parseJsonBody(req.service, req.url, res), status: res.status, ms: res.ms}
}

/** GET and require a 2xx answer; the body as text. */
export async function requestText(req: HttpRequest): Promise<HttpResponse> {
  const res = await httpRequest(req)
  if (res.status < 200 || res.status > 299) throw statusError(req.service, req.url, res)
  return res
}

/** Join a base URL and a path without doubling or losing slashes. */
export function joinUrl(base: string, path: string): string {
  return base.replace(/\/+$/, '') + (path.startsWith('/') ? path : '/' + path)
}

/**
 * JSON text in which bigint values are written as bare integers. SGLang's bootstrap_room is a 63-bit integer that
 * a JS number cannot hold; JSON.stringify would throw on a bigint and a number would lose the low bits.
 */
export function jsonWithBigInts(value: unknown): string {
  if (typeof value === 'bigint') return value.toString()
  if (value === null || typeof value !== 'object') {
    const text = JSON.stringify(value)
    return text === undefined ? 'null' : text
  }
  if (Array.isArray(value)) return '[' + value.map(v => (v === undefined ? 'null' : jsonWithBigInts(v))).join(',') + ']'
  const parts: string[] = []
  for (const [k, v] of Object.entries(value)) {
    if (v === undefined || typeof v === 'function') continue
    parts.push(JSON.stringify(k) + ':' + jsonWithBigInts(v))
  }
  return '{' + parts.join(',') + '}'
}
