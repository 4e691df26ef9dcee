import {randomBytes} from 'node:crypto'

import {badInput, PdError} from '../../../errors.js'
import {ExitCode} from '../../../exit-codes.js'
import {
  httpRequest,
  type HttpResponse,
  jsonWithBigInts,
  joinUrl,
  parseJsonBody,
  requestJson,
  requestText,
  snippet,
  statusError,
} from '../../../deployment/http.js'
import {type ParsedMetrics, parsePromText} from '../../../deployment/prom-text.js'

/**
 * HTTP client of one SGLang server (prefill or decode), with SGLang's own endpoint names
 * (SGLang's entrypoints/http_server.py). Probes have a short timeout; generation requests a long one of their own and a
 * signal,
 * since a pinned request is expected to hang until something evicts it.
 */

export interface ClientOptions {
  /** Deadline of every probe (health, server_info, metrics...). */
  timeoutMs?: number
  /** Deadline of a generation request; a pin can last the whole watchdog deadline. */
  generateTimeoutMs?: number
  /** Named in errors: "prefill", "decode", "router". */
  service?: string
  /** The run's stop: every probe of this client ends at once when it aborts (exit 3), not at its deadline. */
  signal?: AbortSignal
}

export interface GenerateRequest {
  /** pdchaos's own request id; SGLang aborts by prefix, so make ids that are never a prefix of another (newRid). */
  rid: string
  text?: string
  input_ids?: number[]
  max_new_tokens?: number
  /** Extra sampling params; max_new_tokens above wins. */
  sampling_params?: Record<string, unknown>
  stream?: boolean
  bootstrap_host?: string
  bootstrap_port?: number
  /** A 63-bit integer: a bigint or a decimal string, never a JS number (it would lose the low bits). */
  bootstrap_room?: bigint | string
}

export interface GenerateResult {
  rid: string
  /** The HTTP status: 200, or 500 when SGLang failed or aborted the request (an expected outcome under chaos). */
  status: number
  /** The JSON answer; for a stream, the array of events; the raw text when an error answer is not JSON. */
  body: unknown
  ms: number
}

export interface HealthResult {
  ok: boolean
  status?: number
  ms: number
  /** Why it is not ok, one line naming the service. */
  error?: string
}

/** The deadline of a probe (health, server_info, metrics, abort...) when the caller names none. */
export const DEFAULT_PROBE_TIMEOUT_MS = 5000

export const MAX_ROOM = (1n << 63n) - 1n

/** A rid unique to this process and run, fixed-length so no rid is a prefix of another. */
export function newRid(prefix = 'pdchaos'): string {
  return `${prefix}-${Date.now().toString(36)}-${randomBytes(6).toString('hex')}`
}

/** A random bootstrap room as the router makes them: 63 bits. */
export function newRoom(): bigint {
  return randomBytes(8).readBigUInt64BE() & MAX_ROOM
}

/** The room as a bigint, or a PdError (exit 2) when it is not a 63-bit non-negative integer. */
export function toRoom(room: bigint | string): bigint {
  let value: bigint
  if (typeof room === 'bigint') value = room
  else if (/^\d{1,19}$/.test(room)) value = BigInt(room)
  else
    throw badInput(
      `bootstrap_room ${JSON.stringify(room)} is not a decimal integer`,
      'pass the room as a decimal string or a bigint',
    )
  if (value < 0n || value > MAX_ROOM)
    throw badInput(`bootstrap_room ${value} is outside 0..2^63-1`, 'use a 63-bit room, e.g. newRoom()')
  return value
}

/** The /generate body SGLang and the router take. The room goes out as a bare 63-bit integer. */
export function generateBody(req: GenerateRequest): string {
  if (!req.rid) throw badInput('a generate request needs a rid', 'use newRid()')
  if ((req.text === undefined) === (req.input_ids === undefined))
    throw badInput('a generate request needs exactly one of text or input_ids')
  const sampling = {...req.sampling_params}
  if (req.max_new_tokens !== undefined) sampling.max_new_tokens = req.max_new_tokens
  return jsonWithBigInts({
    rid: req.rid,
    text: req.text,
    input_ids: req.input_ids,
    sampling_params: sampling,
    stream: req.stream ? true : undefined,
    bootstrap_host: req.bootstrap_host,
    bootstrap_port: req.bootstrap_port,
    bootstrap_room: req.bootstrap_room === undefined ? undefined : toRoom(req.bootstrap_room),
  })
}

/** Shared by the SGLang and router clients: POST /generate and read the whole answer (or stream). */
export async function postGenerate(
  service: string,
  baseUrl: string,
  req: GenerateRequest,
  timeoutMs: number,
  signal?: AbortSignal,
): Promise<GenerateResult> {
  const url = joinUrl(baseUrl, '/generate')
  const res = await httpRequest({service, url, method: 'POST', body: generateBody(req), timeoutMs, signal})
  return {rid: req.rid, status: res.status, body: generateAnswer(service, url, res, Boolean(req.stream)), ms: res.ms}
}

function generateAnswer(service: string, url: string, res: HttpResponse, stream: boolean): unknown {
  const ok = res.status >= 200 && res.status <= 299
  if (stream && ok) return parseSse(service, url, res.text)
  try {
    return JSON.parse(res.text)
  } catch {
    // An error answer may be plain text (a proxy's 502, "Internal Server Error"); a 2xx must be JSON.
    if (!ok) return res.text
    return parseJsonBody(service, url, res)
  }
}

/** SGLang streams "data: {json}" events ending with "data: [DONE]". */
function parseSse(service: string, url: string, text: string): unknown[] {
  const events: unknown[] = []
  if (!/^data:/m.test(text)) {
    throw new PdError(`${service} at ${url} answered garbage: ${snippet(text)} is not an event stream`, {
      exit: ExitCode.unreachable,
      code: 'E_UNREACHABLE',
    })
  }
  for (const line of text.split('\n')) {
    if (!line.startsWith('data:')) continue
    const data = line.slice(5).trim()
    if (data === '[DONE]') break
    try {
      events.push(JSON.parse(data))
    } catch {
      throw new PdError(`${service} at ${url} answered garbage in its stream: ${snippet(data)} is not JSON`, {
        exit: ExitCode.unreachable,
        code: 'E_UNREACHABLE',
      })
    }
  }
  return events
}

export class SglangClient {
  readonly service: string
  readonly timeoutMs: number
  readonly generateTimeoutMs: number
  private readonly stop: {signal?: AbortSignal}

  constructor(
    readonly baseUrl: string,
    opts: ClientOptions = {},
  ) {
    this.service = opts.service ?? 'sglang server'
    this.timeoutMs = opts.timeoutMs ?? DEFAULT_PROBE_TIMEOUT_MS
    this.generateTimeoutMs = opts.generateTimeoutMs ?? 600_000
    this.stop = opts.signal ? {signal: opts.signal} : {}
  }

  private url(path: string): string {
    return joinUrl(this.baseUrl, path)
  }

  /** POST /generate. Any HTTP status is returned (a 500 is how SGLang reports a failed or aborted PD request). */
  generate(req: GenerateRequest, opts: {timeoutMs?: number; signal?: AbortSignal} = {}): Promise<GenerateResult> {
    return postGenerate(this.service, this.baseUrl, req, opts.timeoutMs ?? this.generateTimeoutMs, opts.signal)
  }

  /** POST /abort_request. SGLang answers 200 even for an unknown rid, so success means "delivered", not "aborted". */
  async abort(rid: string): Promise<{status: number; ms: number}> {
    if (!rid) throw badInput('abort needs a rid (an empty rid is silently ignored by SGLang)')
    const url = this.url('/abort_request')
    const res = await httpRequest({
      service: this.service,
      url,
      method: 'POST',
      body: JSON.stringify({rid, abort_all: false}),
      timeoutMs: this.timeoutMs,
      ...this.stop,
    })
    if (res.status < 200 || res.status > 299) throw statusError(this.service, url, res)
    return {status: res.status, ms: res.ms}
  }

  /** A probe that never throws for a service fault: not ok, with the reason, when refused, hung or not 2xx. */
  async health(path = '/health'): Promise<HealthResult> {
    const url = this.url(path)
    const started = performance.now()
    try {
      const res = await httpRequest({service: this.service, url, timeoutMs: this.timeoutMs, ...this.stop})
      const ok = res.status >= 200 && res.status <= 299
      return ok
        ? {ok, status: res.status, ms: res.ms}
        : {ok, status: res.status, ms: res.ms, error: statusError(this.service, url, res).message}
    } catch (error) {
      if (error instanceof PdError && error.code !== 'E_ABORTED')
        return {ok: false, ms: performance.now() - started, error: error.message}
      throw error
    }
  }

  /** health() that throws the reason (exit 5) when the service is not healthy. */
  async ensureHealthy(path = '/health'): Promise<HealthResult> {
    const h = await this.health(path)
    if (!h.ok)
      throw new PdError(h.error ?? `${this.service} is not healthy`, {
        exit: ExitCode.unreachable,
        code: 'E_UNREACHABLE',
        suggestion: `check the ${this.service} log`,
      })
    return h
  }

  /** GET /server_info, falling back to the deprecated /get_server_info on older servers. */
  async serverInfo(): Promise<Record<string, unknown>> {
    const url = this.url('/server_info')
    const res = await httpRequest({service: this.service, url, timeoutMs: this.timeoutMs, ...this.stop})
    if (res.status === 404) {
      const {json} = await requestJson({
        service: this.service,
        url: this.url('/get_server_info'),
        timeoutMs: this.timeoutMs,
        ...this.stop,
      })
      return asObject(this.service, this.url('/get_server_info'), json)
    }
    if (res.status < 200 || res.status > 299) throw statusError(this.service, url, res)
    return asObject(this.service, url, parseJsonBody(this.service, url, res))
  }

  /** GET /v1/loads?include=disagg: the per-DP-rank load snapshot with the PD queue lengths. */
  async loads(): Promise<unknown> {
    return (
      await requestJson({
        service: this.service,
        url: this.url('/v1/loads?include=disagg'),
        timeoutMs: this.timeoutMs,
        ...this.stop,
      })
    ).json
  }

  /** GET /metrics, parsed. A malformed page is a PdError (exit 5) naming the service and the line. */
  async metrics(): Promise<ParsedMetrics> {
    return fetchMetrics(this.service, this.url('/metrics'), this.timeoutMs, this.stop.signal)
  }

  /**
   * GET {bootstrapUrl}/route on the prefill's bootstrap server. Without a query, all -1: the PrefillServerInfo;
   * with target ranks, {rank_ip, rank_port}. It answers 503 until every rank has registered.
   */
  async bootstrapRoute(
    bootstrapUrl: string,
    query: Record<string, number | string> = {},
  ): Promise<Record<string, unknown>> {
    const q = {prefill_dp_rank: -1, prefill_cp_rank: -1, target_tp_rank: -1, target_pp_rank: -1, ...query}
    const params = new URLSearchParams(Object.entries(q).map(([k, v]) => [k, String(v)]))
    const url = joinUrl(bootstrapUrl, '/route') + '?' + params.toString()
    const res = await httpRequest({service: 'bootstrap server', url, timeoutMs: this.timeoutMs, ...this.stop})
    if (res.status === 503) {
      throw statusError(
        'bootstrap server',
        url,
        res,
        'not every prefill rank has registered yet: wait for the prefill to finish starting, or check its log',
      )
    }
    if (res.status < 200 || res.status > 299) throw statusError('bootstrap server', url, res)
    return asObject('bootstrap server', url, parseJsonBody('bootstrap server', url, res))
  }
}

/** GET a Prometheus page and parse it; the content-type tells OpenMetrics from the text format. */
export async function fetchMetrics(
  service: string,
  url: string,
  timeoutMs: number,
  signal?: AbortSignal,
): Promise<ParsedMetrics> {
  const res = await requestText({
    service,
    url,
    timeoutMs,
    headers: {accept: 'text/plain;version=0.0.4;q=1.0,*/*;q=0.1'},
    ...(signal ? {signal} : {}),
  })
  const openMetrics = (res.headers.get('content-type') ?? '').includes('application/openmetrics-text') || undefined
  return parsePromText(res.text, {openMetrics, source: `${service} at ${url}`})
}

function asObject(service: string, url: string, json: unknown): Record<string, unknown> {
  if (json === null || typeof json !== 'object' || Array.isArray(json)) {
    throw new PdError(
      `${service} at ${url} answered garbage: expected a JSON object, got ${snippet(JSON.stringify(json) ?? '')}`,
      {exit: ExitCode.unreachable, code: 'E_UNREACHABLE'},
    )
  }
  return json as Record<string, unknown>
}
