import type {Calibration} from '../model/timeline.js'
import type {Deployment} from '../deployment/config.js'
import type {RouterClient} from '../deployment/router-client.js'
import {newRid, newRoom, type SglangClient} from '../deployment/sglang-client.js'
import {PdError} from '../errors.js'
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

export async function calibrate(deployment: Deployment, c: CalibrateClients, opts: {requests?: number; promptTokens?: number; routerToo?: boolean} = {}): Promise<Calibration & {routerMs: number}> {
  const n = opts.requests ?? 8
  const prefillMs: number[] = []
  const routerMs: number[] = []
  const text = 'chaos '.repeat(Math.round(((opts.promptTokens ?? 128) * 4) / 6))
  const bootstrapHost = new URL(deployment.services.prefill.url).hostname
  for (let i = -1; i < n; i++) {
    // As the router does it: the same rid and room to both servers; prefill answers once its KV transfer is done.
    const rid = newRid('pdchaos-cal')
    const room = newRoom()
    const req = {rid, text, max_new_tokens: 1, bootstrap_host: bootstrapHost, bootstrap_port: deployment.services.prefill.bootstrapPort, bootstrap_room: room}
    const [p, d] = await Promise.all([c.prefill.generate(req, {timeoutMs: 30_000}), c.decode.generate(req, {timeoutMs: 30_000})])
    if (p.status !== 200 || d.status !== 200) {
      throw new PdError(`calibration request ${rid} failed before any fault (prefill ${p.status}, decode ${d.status}): the deployment is not healthy`, {
        exit: ExitCode.unreachable, suggestion: 'run `pdchaos status` and fix the deployment before injecting faults',
      })
    }
    // Round -1 warms connections and caches up and is not counted.
    if (i >= 0) prefillMs.push(p.ms)
    if (opts.routerToo === false) continue
    const r = await c.router.generate({rid: newRid('pdchaos-cal'), text, max_new_tokens: 1}, {timeoutMs: 30_000})
    if (r.status !== 200) {
      throw new PdError(`calibration request through the router failed before any fault (${r.status})`, {exit: ExitCode.unreachable, suggestion: 'run `pdchaos status`'})
    }
    if (i >= 0) routerMs.push(r.ms)
  }
  // One observation hop each way: router and prefill round trips on cheap endpoints.
  const hops: number[] = []
  for (let i = 0; i < 20; i++) {
    const a = await c.router.liveness()
    // /v1/loads is answered from a shared snapshot, not by the scheduler: a pure network hop.
    const b = await c.prefill.health('/v1/loads')
    hops.push(a.ms + b.ms)
  }
  return {
    prefillMs: quantile(prefillMs, 0.5),
    prefillSpreadMs: quantile(prefillMs, 0.99) - quantile(prefillMs, 0.01),
    observeMs: quantile(hops, 0.99),
    samples: n,
    routerMs: routerMs.length > 0 ? quantile(routerMs, 0.5) : Number.NaN,
  }
}
