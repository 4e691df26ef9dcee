import type {PinState, RequestRole} from '../model/timeline.js'
import {oneLine} from '../errors.js'
import type {RouterClient} from '../deployment/router-client.js'
import {newRid} from '../deployment/sglang-client.js'
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
  rec.add({kind: 'request-sent', t: sentAt, rid, role: opts.role, fault: opts.fault, scenario: opts.scenario, expectedState: opts.expectedState})
  const done = router.generate({rid, text, max_new_tokens: opts.maxNewTokens ?? 4}, {timeoutMs: opts.timeoutMs, signal: opts.signal}).then(
    (res) => {
      const at = now()
      rec.add({kind: 'request-answered', t: at, rid, status: res.status, detail: res.status >= 300 ? detailOf(res.body) : undefined})
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

function detailOf(body: unknown): string {
  const text = typeof body === 'string' ? body : JSON.stringify(body)
  return (text ?? '').slice(0, 200)
}
