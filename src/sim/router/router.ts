import {closeSync, mkdirSync, openSync, writeSync} from 'node:fs'
import http from 'node:http'
import type {AddressInfo} from 'node:net'
import {dirname} from 'node:path'
import {performance} from 'node:perf_hooks'

import {parseRoomJson, stringifyRoomJson} from '../server/json-room.js'
import {type HealthCheckSettings, ROUTER_HEALTH_DEFAULTS, WorkerHealth, probe} from './health.js'
import {PromRegistry} from './prom-text.js'
import {randomRoom} from './room.js'

/**
 * The twin's PD router, modelled on sgl-model-gateway's PD mode (sgl-model-gateway/src/routers/http/pd_router.rs; docs/twin.md): one prefill
 * and one decode worker, a random 63-bit bootstrap room per request injected into both bodies, both sent
 * at once, and the answer held until prefill resolves (prefill failure -> decode dropped, 502).
 */

export interface RouterOptions {
  host: string
  port: number
  metricsPort: number
  prefillUrl: string
  decodeUrl: string
  /** The prefill's --disaggregation-bootstrap-port, injected as bootstrap_port. */
  bootstrapPort: number
  health?: Partial<HealthCheckSettings>
  /** --request-timeout-secs (1800 in the real router). */
  requestTimeoutS?: number
  /** Ground truth JSON lines; none when undefined. */
  truthFile?: string
  log?: (line: string) => void
}

export interface RunningRouter {
  url: string
  metricsUrl: string
  metrics: PromRegistry
  ready(): boolean
  close(): Promise<void>
}

const MAX_BODY = 64 * 1024 * 1024
const now = (): number => performance.timeOrigin + performance.now()

/** A request body with the bootstrap fields set; the room is written as a bare integer (it exceeds 2^53). */
export function injectBootstrap(body: Record<string, unknown>, host: string, port: number, room: bigint): string {
  const rest: Record<string, unknown> = {}
  for (const [k, v] of Object.entries(body)) {
    if (k !== 'bootstrap_host' && k !== 'bootstrap_port' && k !== 'bootstrap_room') rest[k] = v
  }
  return stringifyRoomJson({...rest, bootstrap_host: host, bootstrap_port: port, bootstrap_room: room})
}

export async function startRouter(opts: RouterOptions): Promise<RunningRouter> {
  // Unset (undefined) settings keep the real router's defaults.
  const given = Object.fromEntries(Object.entries(opts.health ?? {}).filter(([, v]) => v !== undefined))
  const health: HealthCheckSettings = {...ROUTER_HEALTH_DEFAULTS, ...given}
  const requestTimeoutMs = (opts.requestTimeoutS ?? 1800) * 1000
  const log = opts.log ?? (() => {})
  const bootstrapHost = new URL(opts.prefillUrl).hostname
  const agent = new http.Agent({keepAlive: true, maxSockets: Infinity, maxFreeSockets: 256})

  const metrics = new PromRegistry()
  metrics.define('smg_router_requests_total', 'counter', 'Total requests received by the router')
  metrics.define('smg_router_request_errors_total', 'counter', 'Requests the router answered with an error')
  metrics.define('smg_router_upstream_responses_total', 'counter', 'Responses from workers by status')
  metrics.define('smg_worker_health', 'gauge', 'Worker health as seen by the router (1 healthy, 0 unhealthy)')

  // Synchronous appends: a reader never misses a line for a request that was already answered.
  let truthFd: number | undefined
  if (opts.truthFile) {
    mkdirSync(dirname(opts.truthFile), {recursive: true})
    truthFd = openSync(opts.truthFile, 'a')
  }
  const record = (o: Record<string, unknown>): void => {
    if (truthFd !== undefined) writeSync(truthFd, JSON.stringify({t: now(), role: 'router', ...o}) + '\n')
  }

  const workers = [
    {role: 'prefill', url: opts.prefillUrl},
    {role: 'decode', url: opts.decodeUrl},
  ].map(({role, url}) => {
    metrics.set('smg_worker_health', {worker: url}, 0)
    const h = new WorkerHealth(url, health, (ok) => {
      metrics.set('smg_worker_health', {worker: url}, ok ? 1 : 0)
      log(`Worker ${role} ${url} is now ${ok ? 'healthy' : 'unhealthy'}`)
    })
    return {role, url, h}
  })
  const ready = (): boolean => workers.every((w) => w.h.healthy)

  const upstream = (url: string, body: string, onRes: (res: http.IncomingMessage) => void, onErr: (e: Error) => void): http.ClientRequest => {
    const req = http.request(url + '/generate', {
      method: 'POST',
      agent,
      headers: {'content-type': 'application/json', 'content-length': Buffer.byteLength(body)},
      timeout: requestTimeoutMs,
    }, onRes)
    req.on('timeout', () => req.destroy(new Error(`upstream timed out after ${requestTimeoutMs / 1000}s`)))
    req.on('error', onErr)
    req.end(body)
    return req
  }

  const sendJson = (res: http.ServerResponse, status: number, obj: unknown): void => {
    const text = JSON.stringify(obj)
    res.writeHead(status, {'content-type': 'application/json', 'content-length': Buffer.byteLength(text)})
    res.end(text)
  }

  const generate = (res: http.ServerResponse, raw: string): void => {
    metrics.inc('smg_router_requests_total', {route: '/generate'})
    let body: unknown
    try {
      body = parseRoomJson(raw)
    } catch {
      body = undefined
    }
    if (body === null || typeof body !== 'object' || Array.isArray(body)) {
      metrics.inc('smg_router_request_errors_total', {route: '/generate', error_type: 'bad_request'})
      sendJson(res, 400, {error: {message: 'request body must be a JSON object', type: 'bad_request'}})
      return
    }
    const rid = typeof (body as {rid?: unknown}).rid === 'string' ? (body as {rid: string}).rid : null
    const room = randomRoom()
    const sentAt = now()
    const text = injectBootstrap(body as Record<string, unknown>, bootstrapHost, opts.bootstrapPort, room)
    record({event: 'sent', rid, room: room.toString()})

    let prefill: {ok: boolean; status: number; error?: string} | undefined
    let decodeRes: http.IncomingMessage | undefined
    let decodeErr: string | undefined
    let done = false

    const finish = (status: number, detail: Record<string, unknown> = {}): void => {
      done = true
      if (status >= 400) metrics.inc('smg_router_request_errors_total', {route: '/generate', error_type: status === 502 ? 'upstream' : String(status)})
      record({event: 'answered', rid, room: room.toString(), status, sentAt, ms: now() - sentAt, prefillStatus: prefill?.status ?? null, ...detail})
    }

    const settle = (): void => {
      if (done || prefill === undefined) return
      if (!prefill.ok) {
        // As pd_router.rs: a failed prefill drops the decode request (its server aborts it) and answers 502.
        decodeReq.destroy()
        decodeRes?.destroy()
        finish(502, {error: prefill.error})
        sendJson(res, 502, {error: {message: `Prefill server error: ${prefill.error}`, type: 'bad_gateway'}})
        return
      }
      if (decodeErr !== undefined) {
        finish(502, {error: decodeErr})
        sendJson(res, 502, {error: {message: `Decode server error: ${decodeErr}`, type: 'bad_gateway'}})
        return
      }
      if (!decodeRes) return
      const d = decodeRes
      const status = d.statusCode ?? 502
      const headers: http.OutgoingHttpHeaders = {'content-type': d.headers['content-type'] ?? 'application/json'}
      if (d.headers['content-length']) headers['content-length'] = d.headers['content-length']
      res.writeHead(status, headers)
      // Recorded before pipe() ends the response, so the truth line exists once the client has its answer.
      d.on('end', () => finish(status, {decodeStatus: status}))
      d.pipe(res)
      d.on('error', () => {
        if (!done) finish(502, {error: 'decode stream broke'})
        res.destroy()
      })
    }

    const prefillReq = upstream(opts.prefillUrl, text, (r) => {
      metrics.inc('smg_router_upstream_responses_total', {worker: opts.prefillUrl, status: String(r.statusCode)})
      const chunks: Buffer[] = []
      r.on('data', (c: Buffer) => {
        if (chunks.length < 16) chunks.push(c)
      })
      r.on('end', () => {
        const status = r.statusCode ?? 0
        const ok = status >= 200 && status < 300
        prefill = {ok, status, error: ok ? undefined : `status ${status}: ${Buffer.concat(chunks).toString('utf8').slice(0, 300)}`}
        settle()
      })
      r.on('error', (e) => {
        prefill ??= {ok: false, status: 0, error: e.message}
        settle()
      })
    }, (e) => {
      metrics.inc('smg_router_upstream_responses_total', {worker: opts.prefillUrl, status: 'error'})
      prefill ??= {ok: false, status: 0, error: e.message}
      settle()
    })

    const decodeReq = upstream(opts.decodeUrl, text, (r) => {
      metrics.inc('smg_router_upstream_responses_total', {worker: opts.decodeUrl, status: String(r.statusCode)})
      decodeRes = r
      settle()
    }, (e) => {
      if (done) return
      metrics.inc('smg_router_upstream_responses_total', {worker: opts.decodeUrl, status: 'error'})
      decodeErr = e.message
      settle()
    })

    // A client that goes away takes both upstream requests with it; the servers abort them on disconnect.
    res.on('close', () => {
      if (res.writableFinished) return
      prefillReq.destroy()
      decodeReq.destroy()
      if (!done) finish(499, {error: 'client disconnected'})
    })
  }

  const healthGenerate = async (res: http.ServerResponse): Promise<void> => {
    const codes = await Promise.all(workers.map((w) => probe(w.url + '/health_generate', health.timeoutS * 1000, agent)))
    const ok = codes.every((c) => c >= 200 && c < 300)
    sendJson(res, ok ? 200 : 503, {status: ok ? 'healthy' : 'unhealthy', workers: workers.map((w, i) => ({url: w.url, status: codes[i]}))})
  }

  const server = http.createServer((req, res) => {
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
      req.on('end', () => generate(res, Buffer.concat(chunks).toString('utf8')))
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
        const ok = ready()
        sendJson(res, ok ? 200 : 503, {
          status: ok ? 'ready' : 'not ready',
          workers: workers.map((w) => ({role: w.role, url: w.url, healthy: w.h.healthy})),
        })
        return
      }
      case '/health_generate':
        void healthGenerate(res)
        return
      default:
        sendJson(res, 404, {error: {message: `no route ${path}`}})
    }
  })
  server.keepAliveTimeout = 65_000

  const metricsServer = http.createServer((req, res) => {
    if ((req.url ?? '').split('?')[0] === '/metrics') {
      res.writeHead(200, {'content-type': 'text/plain; version=0.0.4'}).end(metrics.render())
    } else {
      res.writeHead(404).end()
    }
  })

  const listen = (s: http.Server, port: number): Promise<number> =>
    new Promise((resolve, reject) => {
      s.once('error', reject)
      s.listen(port, opts.host, () => {
        s.off('error', reject)
        resolve((s.address() as AddressInfo).port)
      })
    })

  const port = await listen(server, opts.port)
  let metricsPort: number
  try {
    metricsPort = await listen(metricsServer, opts.metricsPort)
  } catch (error) {
    server.close()
    throw error
  }
  for (const w of workers) w.h.start()
  const hostForUrl = opts.host.includes(':') ? `[${opts.host}]` : opts.host
  log(`sgl-model-gateway (twin) PD router listening on ${hostForUrl}:${port}, prefill ${opts.prefillUrl} bootstrap ${opts.bootstrapPort}, decode ${opts.decodeUrl}, metrics on :${metricsPort}`)

  return {
    url: `http://${hostForUrl}:${port}`,
    metricsUrl: `http://${hostForUrl}:${metricsPort}/metrics`,
    metrics,
    ready,
    async close() {
      for (const w of workers) w.h.stop()
      server.closeAllConnections()
      metricsServer.closeAllConnections()
      await Promise.all([new Promise((r) => server.close(r)), new Promise((r) => metricsServer.close(r))])
      agent.destroy()
      if (truthFd !== undefined) closeSync(truthFd)
      truthFd = undefined
    },
  }
}
