import type {PinState, RequestRole} from '../model/timeline.js'
import {oneLine} from '../errors.js'
import type {RouterClient} from '../engines/sglang/deployment/router-client.js'
import {newRid, newRoom, type SglangClient} from '../engines/sglang/deployment/sglang-client.js'
import {now, type Recorder} from './recorder.js'

/** One request through the router with pdchaos's own rid, recorded as sent and as answered (or abandoned). */

export interface SendOptions {
  role: RequestRole
  fault?: string
  scenario?: string
  expectedState?: PinState
  /** Prompt length in tokens (~4 characters each). */
  promptTokens?: number
  maxNewTokens?: number
  /** Our own client deadline: past it the request is recorded as abandoned, never waited on forever. */
  timeoutMs: number
  signal?: AbortSignal
  rid?: string
}

export interface Sent {
  rid: string
  sentAt: number
  done: Promise<{status: number | null; at: number}>
}

export function sendRequest(router: RouterClient, rec: Recorder, opts: SendOptions): Sent {
  const rid = opts.rid ?? newRid(`pdchaos-${opts.role}`)
  const text = 'chaos '.repeat(Math.max(1, Math.round(((opts.promptTokens ?? 128) * 4) / 6)))
  const sentAt = now()
  rec.add({
    kind: 'request-sent',
    t: sentAt,
    rid,
    role: opts.role,
    fault: opts.fault,
    scenario: opts.scenario,
    expectedState: opts.expectedState,
  })
  const done = router
    .generate({rid, text, max_new_tokens: opts.maxNewTokens ?? 4}, {timeoutMs: opts.timeoutMs, signal: opts.signal})
    .then(
      res => {
        const at = now()
        rec.add({
          kind: 'request-answered',
          t: at,
          rid,
          status: res.status,
          detail: res.status >= 300 ? detailOf(res.body) : undefined,
        })
        return {status: res.status, at}
      },
      (error: unknown) => {
        const at = now()
        rec.add({kind: 'request-abandoned', t: at, rid, detail: oneLine(error)})
        return {status: null, at}
      },
    )
  return {rid, sentAt, done}
}

/** The error answer, long enough to keep SGLang's own reason (it follows a long transfer-failure prefix). */
function detailOf(body: unknown): string {
  const text = typeof body === 'string' ? body : JSON.stringify(body)
  return (text ?? '').slice(0, 1000)
}

/** Where prefill's bootstrap server is, as the gateway injects it into both /generate bodies. */
export interface Bootstrap {
  host: string
  port: number
}

/**
 * One request sent the way the PD gateway sends it, but once: the same rid, bootstrap host, port and a fresh room to
 * prefill and to decode, no retry. Its answer is prefill's (prefill answers once its KV transfer has reached Success
 * or Failed: the clock of a pin). When prefill fails the request, decode's half is dropped and aborted, as the
 * gateway drops it. So a pin is exactly one prefill request: a retrying router would send an evicted pin again,
 * pinned again, and blur every verdict.
 */
export function sendDirect(
  servers: {prefill: SglangClient; decode: SglangClient},
  bootstrap: Bootstrap,
  rec: Recorder,
  opts: SendOptions,
): Sent {
  const rid = opts.rid ?? newRid(`pdchaos-${opts.role}`)
  const text = 'chaos '.repeat(Math.max(1, Math.round(((opts.promptTokens ?? 128) * 4) / 6)))
  const body = {
    rid,
    text,
    max_new_tokens: opts.maxNewTokens ?? 4,
    bootstrap_host: bootstrap.host,
    bootstrap_port: bootstrap.port,
    bootstrap_room: newRoom(),
  }
  const decodeHalf = new AbortController()
  const stopDecode = () => decodeHalf.abort()
  opts.signal?.addEventListener('abort', stopDecode, {once: true})
  const sentAt = now()
  rec.add({
    kind: 'request-sent',
    t: sentAt,
    rid,
    role: opts.role,
    fault: opts.fault,
    scenario: opts.scenario,
    expectedState: opts.expectedState,
    path: 'direct',
  })
  const decoded = servers.decode
    .generate(body, {timeoutMs: opts.timeoutMs, signal: decodeHalf.signal})
    .catch(() => undefined)
  const done = servers.prefill
    .generate(body, {timeoutMs: opts.timeoutMs, signal: opts.signal})
    .then(
      async res => {
        const at = now()
        rec.add({
          kind: 'request-answered',
          t: at,
          rid,
          status: res.status,
          detail: res.status >= 300 ? detailOf(res.body) : undefined,
        })
        if (res.status >= 300) {
          // As the gateway does: drop decode's half and tell decode to let go of it.
          decodeHalf.abort()
          await servers.decode.abort(rid).catch(() => undefined)
        }
        await decoded
        return {status: res.status, at}
      },
      async (error: unknown) => {
        const at = now()
        rec.add({kind: 'request-abandoned', t: at, rid, detail: oneLine(error)})
        decodeHalf.abort()
        await decoded
        return {status: null, at}
      },
    )
    .finally(() => opts.signal?.removeEventListener('abort', stopDecode))
  return {rid, sentAt, done}
}
