import {setMaxListeners} from 'node:events'

import type {RouterClient} from '../engines/sglang/deployment/router-client.js'
import {sleep} from '../util/time.js'
import type {Recorder} from './recorder.js'
import {sendRequest, type Sent} from './send.js'

/**
 * The light steady load beside every experiment: one request every intervalMs through the router, recorded as
 * role `load`, from before the fault to after recovery. Bounded twice: a count cap derived from maxDurationMs, and
 * each request's own deadline.
 */
export class SteadyLoad {
  readonly sent: Sent[] = []
  private stopping = false
  private readonly controller = new AbortController()
  /** Wakes the loop's pacing sleep: a stop never waits out an interval (500 ms by default). */
  private readonly wake = new AbortController()
  private readonly loop: Promise<void>

  constructor(
    router: RouterClient,
    rec: Recorder,
    opts: {intervalMs: number; promptTokens: number; requestTimeoutMs: number; maxDurationMs: number},
  ) {
    // Every load request in flight listens on the one signal: many listeners are the design, not a leak.
    setMaxListeners(0, this.controller.signal)
    const max = opts.intervalMs > 0 ? Math.ceil(opts.maxDurationMs / opts.intervalMs) : 0
    this.loop = (async () => {
      for (let i = 0; i < max && !this.stopping; i++) {
        this.sent.push(
          sendRequest(router, rec, {
            role: 'load',
            timeoutMs: opts.requestTimeoutMs,
            signal: this.controller.signal,
            promptTokens: opts.promptTokens,
          }),
        )
        await sleep(opts.intervalMs, this.wake.signal)
      }
    })()
  }

  /** Send nothing more; requests in flight go on. */
  async stopSending(): Promise<void> {
    this.stopping = true
    this.wake.abort()
    await this.loop
  }

  /** Send nothing more and stop waiting for what is still in flight (recorded as abandoned). */
  async abandon(): Promise<void> {
    await this.stopSending()
    this.controller.abort()
    await Promise.all(this.sent.map(s => s.done))
  }
}
