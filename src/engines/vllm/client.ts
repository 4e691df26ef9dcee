import {randomUUID} from 'node:crypto'

import {httpRequest, joinUrl, requestJson, requestText} from '../../deployment/http.js'

/**
 * A vLLM prefill instance spoken to as vLLM's toy proxy speaks to it (tests/v1/kv_connector/nixl_integration/
 * toy_proxy_server.py `send_request_to_service`): the request with `kv_transfer_params: {do_remote_decode: true,
 * do_remote_prefill: false, remote_engine_id: null, remote_block_ids: null, remote_host: null, remote_port: null}`,
 * `stream: false`, `max_tokens: 1` (and `max_completion_tokens` 1 where present) and `X-Request-Id`. P answers once
 * the prefill finished and its blocks are pinned (pull_scheduler.py `request_finished`), with the kv_transfer_params
 * a decode instance would need. Without a D leg those blocks wait for the lease.
 */

export interface PrefillGrant {
  /** The X-Request-Id sent; vLLM's own request id is `cmpl-<it>-0` (P's logs name that one). */
  xRequestId: string
  /** P's request id: kv_transfer_params.remote_request_id when P states it, else `cmpl-<X-Request-Id>-0`. */
  requestId: string
  kvTransferParams: Record<string, unknown>
  /** Epoch ms: sent, and P's answer fully read. The lease was granted in between. */
  sentMs: number
  answeredMs: number
}

export interface PrefillRequest {
  baseUrl: string
  model: string
  prompt: string
  timeoutMs: number
  xRequestId?: string
  /** The caller's stop: aborts the request (a PdError, exit 3). */
  signal?: AbortSignal
}

export async function sendPrefillOnly(r: PrefillRequest): Promise<PrefillGrant> {
  const xRequestId = r.xRequestId ?? randomUUID()
  const url = joinUrl(r.baseUrl, '/v1/completions')
  const body = {
    model: r.model,
    prompt: r.prompt,
    max_tokens: 1,
    stream: false,
    kv_transfer_params: {
      do_remote_decode: true,
      do_remote_prefill: false,
      remote_engine_id: null,
      remote_block_ids: null,
      remote_host: null,
      remote_port: null,
    },
  }
  const sentMs = Date.now()
  const {json} = await requestJson({
    service: 'prefill',
    url,
    method: 'POST',
    body: JSON.stringify(body),
    headers: {'X-Request-Id': xRequestId},
    timeoutMs: r.timeoutMs,
    ...(r.signal ? {signal: r.signal} : {}),
  })
  const answeredMs = Date.now()
  const ktp = (json as {kv_transfer_params?: unknown}).kv_transfer_params
  const params = ktp && typeof ktp === 'object' ? (ktp as Record<string, unknown>) : {}
  const rid = typeof params.remote_request_id === 'string' ? params.remote_request_id : `cmpl-${xRequestId}-0`
  return {xRequestId, requestId: rid, kvTransferParams: params, sentMs, answeredMs}
}

/** The NIXL counters P exports (vllm/v1/metrics/loggers.py; prometheus_client adds `_total` to a counter's name). */
export const NIXL_COUNTERS = [
  'vllm:nixl_num_kv_expired_reqs',
  'vllm:nixl_num_failed_transfers',
  'vllm:nixl_num_failed_notifications',
] as const

/** A counter's value from a Prometheus text page, summed over label sets; undefined when absent. */
export function counterValue(text: string, name: string): number | undefined {
  let sum: number | undefined
  for (const line of text.split('\n')) {
    if (line.startsWith('#')) continue
    for (const n of [`${name}_total`, name]) {
      if (!line.startsWith(n) || !/[{\s]/.test(line.charAt(n.length))) continue
      const v = Number(line.trim().split(/\s+/).at(-1))
      if (Number.isFinite(v)) sum = (sum ?? 0) + v
      break
    }
  }
  return sum
}

export async function readNixlCounters(
  baseUrl: string,
  timeoutMs: number,
): Promise<{t: number; values: Partial<Record<(typeof NIXL_COUNTERS)[number], number>>}> {
  const res = await requestText({service: 'prefill', url: joinUrl(baseUrl, '/metrics'), timeoutMs})
  const values: Partial<Record<(typeof NIXL_COUNTERS)[number], number>> = {}
  for (const n of NIXL_COUNTERS) {
    const v = counterValue(res.text, n)
    if (v !== undefined) values[n] = v
  }
  return {t: Date.now(), values}
}

/** One scrape of P's /metrics for the lease check: the expiry counter and what shows P otherwise idle. */
export interface LeaseScrape {
  /** Sent and answered (epoch ms): the values were read in [fromT, t]. */
  fromT: number
  t: number
  expired?: number
  /** vllm:request_success summed over finished_reason. */
  finished?: number
  kvUsage?: number
}

export async function readLeaseScrape(baseUrl: string, timeoutMs: number, signal?: AbortSignal): Promise<LeaseScrape> {
  const fromT = Date.now()
  const res = await requestText({
    service: 'prefill',
    url: joinUrl(baseUrl, '/metrics'),
    timeoutMs,
    ...(signal ? {signal} : {}),
  })
  const t = Date.now()
  const pick = (n: string) => counterValue(res.text, n)
  const [expired, finished, kvUsage] = [
    pick('vllm:nixl_num_kv_expired_reqs'),
    pick('vllm:request_success'),
    pick('vllm:kv_cache_usage_perc'),
  ]
  return {
    fromT,
    t,
    ...(expired === undefined ? {} : {expired}),
    ...(finished === undefined ? {} : {finished}),
    ...(kvUsage === undefined ? {} : {kvUsage}),
  }
}

/** D's leg of a request, started and not awaited: its answer (or transport error) settles `done`; `abort()` cuts it. */
export interface DecodeLeg {
  xRequestId: string
  /** D's request id: the same `cmpl-<X-Request-Id>-0` as P's (the twin and vLLM's serving layer both use it). */
  requestId: string
  sentMs: number
  /** The client abort's epoch ms, once `abort()` was called. */
  abortedMs?: number
  done: Promise<{status: number; text: string; answeredMs: number} | {error: string; answeredMs: number}>
  abort: () => void
}

/**
 * Send D the request with P's kv_transfer_params, as the toy proxy's second leg does (`do_remote_prefill: true` and
 * the remote_* fields P returned; the same X-Request-Id). D then handshakes with P, READs the blocks and heartbeats
 * P's lease while the request waits in its scheduler. `abort()` closes the connection: the client abort vLLM's
 * serving layer turns into an engine abort (D's `request_finished`).
 */
export function sendDecodeLeg(r: PrefillRequest & {grant: PrefillGrant; maxTokens?: number}): DecodeLeg {
  const cut = new AbortController()
  const signal = r.signal ? AbortSignal.any([cut.signal, r.signal]) : cut.signal
  const body = {
    model: r.model,
    prompt: r.prompt,
    max_tokens: r.maxTokens ?? 4,
    stream: false,
    kv_transfer_params: r.grant.kvTransferParams,
  }
  const sentMs = Date.now()
  const done = httpRequest({
    service: 'decode',
    url: joinUrl(r.baseUrl, '/v1/completions'),
    method: 'POST',
    body: JSON.stringify(body),
    headers: {'X-Request-Id': r.grant.xRequestId},
    timeoutMs: r.timeoutMs,
    signal,
  }).then(
    res => ({status: res.status, text: res.text, answeredMs: Date.now()}),
    (error: unknown) => ({error: (error as Error).message.split('\n')[0]!, answeredMs: Date.now()}),
  )
  const leg: DecodeLeg = {
    xRequestId: r.grant.xRequestId,
    requestId: r.grant.requestId,
    sentMs,
    done,
    abort: () => {
      if (leg.abortedMs === undefined) leg.abortedMs = Date.now()
      cut.abort()
    },
  }
  return leg
}
