import http from 'node:http'
import type {AddressInfo} from 'node:net'

import {sendJson} from './answers.js'
import {buildRouterContext, isReady, ofRole, type RouterCtx, type RouterOptions} from './context.js'
import {generate} from './generate.js'
import {probe} from './health.js'
import type {PromRegistry} from './prom-text.js'
import {attemptsAllowed} from './retry.js'

export {gatewayError, injectBootstrap} from './answers.js'
export type {RouterOptions} from './context.js'

/**
 * The twin's PD router, modelled on sgl-model-gateway's PD mode (sgl-model-gateway/src/routers/http/pd_router.rs,
 * core/retry.rs, core/circuit_breaker.rs; docs/twin.md, "Router"). One or more prefill and decode workers. Each
 * request is run by a retry loop: every attempt picks the pair (each role by its policy among its workers that are
 * healthy and whose breaker lets requests through; none available is a 503), injects the chosen prefill's bootstrap
 * address and a fresh random 63-bit bootstrap room into the same body (same rid), sends it to both workers at once
 * and waits for both to answer (tokio::join!), then decode's error wins, then prefill's, else decode's answer passes
 * through. The pair's two breakers record the attempt's outcome; 408/429/500/502/503/504 are retried after a jittered
 * backoff, and the retry picks its pair again.
 */

export interface RunningRouter {
  url: string
  metricsUrl: string
  metrics: PromRegistry
  ready(): boolean
  close(): Promise<void>
}

const MAX_BODY = 64 * 1024 * 1024

async function healthGenerate(ctx: RouterCtx, res: http.ServerResponse): Promise<void> {
  const {workers} = ctx
  const probes = workers.map(w => probe(w.url + '/health_generate', ctx.health.timeoutS * 1000, ctx.agent))
  const codes = await Promise.all(probes)
  const ok = codes.every(c => c >= 200 && c < 300)
  sendJson(res, ok ? 200 : 503, {
    status: ok ? 'healthy' : 'unhealthy',
    workers: workers.map((w, i) => ({url: w.url, status: codes[i]})),
  })
}

/** The router's HTTP API: POST /generate (its body bounded), the health and readiness endpoints. */
function route(ctx: RouterCtx, req: http.IncomingMessage, res: http.ServerResponse): void {
  const path = (req.url ?? '/').split('?')[0]
  if (req.method === 'POST' && path === '/generate') {
    const chunks: Buffer[] = []
    let size = 0
    req.on('data', (c: Buffer) => {
      size += c.length
      if (size > MAX_BODY) {
        sendJson(res, 413, {error: {message: 'request body too large'}})
        req.destroy()
        return
      }
      chunks.push(c)
    })
    req.on('end', () => generate(ctx, res, Buffer.concat(chunks).toString('utf8')))
    return
  }
  if (req.method !== 'GET') {
    sendJson(res, 405, {error: {message: `method ${req.method} not allowed on ${path}`}})
    return
  }
  switch (path) {
    case '/health':
    case '/liveness':
      res.writeHead(200, {'content-type': 'text/plain'}).end('OK')
      return
    case '/readiness': {
      const ok = isReady(ctx)
      sendJson(res, ok ? 200 : 503, {
        status: ok ? 'ready' : 'not ready',
        workers: ctx.workers.map(w => ({role: w.role, url: w.url, healthy: w.h.healthy})),
      })
      return
    }
    case '/health_generate':
      void healthGenerate(ctx, res)
      return
    default:
      sendJson(res, 404, {error: {message: `no route ${path}`}})
  }
}

const listen = (s: http.Server, port: number, host: string): Promise<number> =>
  new Promise((resolve, reject) => {
    s.once('error', reject)
    s.listen(port, host, () => {
      s.off('error', reject)
      resolve((s.address() as AddressInfo).port)
    })
  })

/** The router's one startup line: where it listens, its workers and policies, its retries and breaker. */
function startupLine(ctx: RouterCtx, hostForUrl: string, port: number, metricsPort: number): string {
  const {retry, cbSettings, policies} = ctx
  const shown = (role: 'prefill' | 'decode') =>
    ofRole(ctx, role)
      .map(w => (role === 'prefill' ? `${w.url} bootstrap ${ctx.bootstrapOf.get(w.url)}` : w.url))
      .join(', ')
  return (
    `sgl-model-gateway (twin) PD router listening on ${hostForUrl}:${port}, prefill ${shown('prefill')} ` +
    `(${policies.prefill.name}), decode ${shown('decode')} (${policies.decode.name}), metrics on :${metricsPort}; ` +
    `${attemptsAllowed(retry)} attempt(s) per request${retry.disabled ? ' (retries disabled)' : ''}, circuit ` +
    `breaker ${cbSettings.disabled ? 'disabled' : `opens after ${cbSettings.failureThreshold} consecutive failures`}`
  )
}

export async function startRouter(opts: RouterOptions): Promise<RunningRouter> {
  const ctx = buildRouterContext(opts)
  const server = http.createServer((req, res) => route(ctx, req, res))
  server.keepAliveTimeout = 65_000
  const metricsServer = http.createServer((req, res) => {
    if ((req.url ?? '').split('?')[0] === '/metrics') {
      res.writeHead(200, {'content-type': 'text/plain; version=0.0.4'}).end(ctx.metrics.render())
    } else {
      res.writeHead(404).end()
    }
  })

  const port = await listen(server, opts.port, opts.host)
  let metricsPort: number
  try {
    metricsPort = await listen(metricsServer, opts.metricsPort, opts.host)
  } catch (error) {
    server.close()
    throw error
  }
  for (const w of ctx.workers) w.h.start()
  const hostForUrl = opts.host.includes(':') ? `[${opts.host}]` : opts.host
  ctx.log(startupLine(ctx, hostForUrl, port, metricsPort))

  return {
    url: `http://${hostForUrl}:${port}`,
    metricsUrl: `http://${hostForUrl}:${metricsPort}/metrics`,
    metrics: ctx.metrics,
    ready: () => isReady(ctx),
    async close() {
      for (const w of ctx.workers) w.h.stop()
      server.closeAllConnections()
      metricsServer.closeAllConnections()
      await Promise.all([new Promise(r => server.close(r)), new Promise(r => metricsServer.close(r))])
      ctx.agent.destroy()
      ctx.closeTruth()
    },
  }
}
