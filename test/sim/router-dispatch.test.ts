import {mkdtempSync, readFileSync, rmSync} from 'node:fs'
import http from 'node:http'
import type {AddressInfo} from 'node:net'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {afterAll, afterEach, beforeAll, describe, expect, it} from 'vitest'

import {injectBootstrap, type RunningRouter, startRouter} from '../../src/sim/router/router.js'

/**
 * The router against two plain HTTP workers that record what they receive: the PD dispatch contract
 * (same room in both bodies, bootstrap fields injected, wait for prefill, 502 on prefill failure).
 */

type Behaviour = (body: string, req: http.IncomingMessage, res: http.ServerResponse) => void

interface FakeWorker {
  url: string
  bodies: string[]
  closedEarly: number
  behaviour: Behaviour
  healthStatus: number
  server: http.Server
}

async function fakeWorker(behaviour: Behaviour): Promise<FakeWorker> {
  const w = {bodies: [] as string[], closedEarly: 0, behaviour, healthStatus: 200} as FakeWorker
  w.server = http.createServer((req, res) => {
    if (req.url === '/health' || req.url === '/health_generate') {
      res.writeHead(w.healthStatus).end('OK')
      return
    }
    const chunks: Buffer[] = []
    req.on('data', (c: Buffer) => chunks.push(c))
    req.on('end', () => {
      const body = Buffer.concat(chunks).toString('utf8')
      w.bodies.push(body)
      res.on('close', () => {
        if (!res.writableFinished) w.closedEarly++
      })
      w.behaviour(body, req, res)
    })
  })
  await new Promise<void>((r) => w.server.listen(0, '127.0.0.1', r))
  w.url = `http://127.0.0.1:${(w.server.address() as AddressInfo).port}`
  return w
}

const roomOf = (body: string): string => /"bootstrap_room":(\d+)/.exec(body)![1]
const json = (res: http.ServerResponse, status: number, obj: unknown, delayMs = 0): void => {
  setTimeout(() => res.writeHead(status, {'content-type': 'application/json'}).end(JSON.stringify(obj)), delayMs)
}

async function post(url: string, body: unknown): Promise<{status: number; text: string}> {
  const r = await fetch(url + '/generate', {method: 'POST', body: JSON.stringify(body), headers: {'content-type': 'application/json'}, signal: AbortSignal.timeout(10_000)})
  return {status: r.status, text: await r.text()}
}

describe('router dispatch', () => {
  let prefill: FakeWorker
  let decode: FakeWorker
  let router: RunningRouter
  let dir: string

  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), 'pdc-router-'))
    prefill = await fakeWorker((_b, _q, res) => json(res, 200, {text: '', meta_info: {}}, 20))
    decode = await fakeWorker((_b, _q, res) => json(res, 200, {text: ' hello', meta_info: {finish_reason: {type: 'length'}}}))
    router = await startRouter({
      host: '127.0.0.1', port: 0, metricsPort: 0, prefillUrl: prefill.url, decodeUrl: decode.url, bootstrapPort: 8998,
      health: {intervalS: 0.1, timeoutS: 0.5}, truthFile: join(dir, 'truth', 'router.jsonl'),
    })
    const until = Date.now() + 5000
    while (!router.ready() && Date.now() < until) await new Promise((r) => setTimeout(r, 20))
  })

  afterEach(() => {
    prefill.behaviour = (_b, _q, res) => json(res, 200, {text: '', meta_info: {}}, 20)
    prefill.healthStatus = 200
  })

  afterAll(async () => {
    await router?.close()
    for (const w of [prefill, decode]) {
      w?.server.closeAllConnections()
      w?.server.close()
    }
    rmSync(dir, {recursive: true, force: true})
  })

  it('sends one body with the same 63-bit room and the prefill bootstrap address to both workers, and answers decode', async () => {
    const before = prefill.bodies.length
    const r = await post(router.url, {rid: 'req-1', text: 'hi there', sampling_params: {max_new_tokens: 4}, bootstrap_room: 5})
    expect(r.status).toBe(200)
    expect(JSON.parse(r.text).text).toBe(' hello')
    const p = prefill.bodies[before]
    const d = decode.bodies.at(-1)!
    expect(p).toBe(d)
    const body = JSON.parse(p)
    expect(body.rid).toBe('req-1')
    expect(body.bootstrap_host).toBe('127.0.0.1')
    expect(body.bootstrap_port).toBe(8998)
    const room = BigInt(roomOf(p))
    expect(room).not.toBe(5n)
    expect(room >= 0n && room < 1n << 63n).toBe(true)
    const truth = readFileSync(join(dir, 'truth', 'router.jsonl'), 'utf8').trim().split('\n').map((l) => JSON.parse(l))
    const answered = truth.find((t) => t.event === 'answered' && t.rid === 'req-1')
    expect(answered).toMatchObject({room: room.toString(), status: 200, prefillStatus: 200})
  })

  it('makes rooms above 2^53 and writes them exactly', async () => {
    const rooms = new Set<string>()
    for (let i = 0; i < 20; i++) {
      await post(router.url, {rid: `big-${i}`, text: 'x'})
      rooms.add(roomOf(prefill.bodies.at(-1)!))
    }
    expect(rooms.size).toBe(20)
    expect([...rooms].some((r) => BigInt(r) > 2n ** 53n)).toBe(true)
    expect(injectBootstrap({}, 'h', 1, 2n ** 62n + 1n)).toBe(`{"bootstrap_host":"h","bootstrap_port":1,"bootstrap_room":${2n ** 62n + 1n}}`)
  })

  it('answers 502 when prefill fails and drops the decode request it had sent', async () => {
    const slowDecode = decode.behaviour
    decode.behaviour = (_b, _q, res) => json(res, 200, {text: 'late'}, 3000)
    prefill.behaviour = (_b, _q, res) => json(res, 500, {error: {message: 'Prefill transfer failed'}}, 50)
    const closedBefore = decode.closedEarly
    try {
      const r = await post(router.url, {rid: 'fails', text: 'x'})
      expect(r.status).toBe(502)
      expect(r.text).toContain('Prefill')
      const until = Date.now() + 2000
      while (decode.closedEarly === closedBefore && Date.now() < until) await new Promise((res) => setTimeout(res, 20))
      expect(decode.closedEarly).toBe(closedBefore + 1)
    } finally {
      decode.behaviour = slowDecode
    }
  })

  it('holds the decode answer until prefill resolves', async () => {
    prefill.behaviour = (_b, _q, res) => json(res, 200, {text: ''}, 400)
    const t0 = Date.now()
    const r = await post(router.url, {rid: 'hold', text: 'x'})
    expect(r.status).toBe(200)
    expect(Date.now() - t0).toBeGreaterThanOrEqual(380)
  })

  it('passes a decode stream through', async () => {
    const plain = decode.behaviour
    decode.behaviour = (_b, _q, res) => {
      res.writeHead(200, {'content-type': 'text/event-stream'})
      res.write('data: {"text":"a"}\n\n')
      setTimeout(() => res.end('data: [DONE]\n\n'), 30)
    }
    try {
      const r = await post(router.url, {rid: 's', text: 'x', stream: true})
      expect(r.status).toBe(200)
      expect(r.text).toBe('data: {"text":"a"}\n\ndata: [DONE]\n\n')
    } finally {
      decode.behaviour = plain
    }
  })

  it('rejects a body that is not a JSON object with 400', async () => {
    const r = await fetch(router.url + '/generate', {method: 'POST', body: 'nope'})
    expect(r.status).toBe(400)
  })

  it('drops readiness after 3 failed probes and restores it after 2 good ones; liveness stays 200', async () => {
    expect((await fetch(router.url + '/readiness')).status).toBe(200)
    prefill.healthStatus = 503
    const until = Date.now() + 5000
    let status = 200
    while (status === 200 && Date.now() < until) {
      await new Promise((r) => setTimeout(r, 50))
      status = (await fetch(router.url + '/readiness')).status
    }
    expect(status).toBe(503)
    expect((await fetch(router.url + '/liveness')).status).toBe(200)
    expect((await fetch(router.url.replace(/:\d+$/, ':' + new URL(router.metricsUrl).port) + '/metrics').then((r) => r.text()))).toContain(`smg_worker_health{worker="${prefill.url}"} 0`)
    prefill.healthStatus = 200
    const until2 = Date.now() + 5000
    while (status !== 200 && Date.now() < until2) {
      await new Promise((r) => setTimeout(r, 50))
      status = (await fetch(router.url + '/readiness')).status
    }
    expect(status).toBe(200)
  })

  it('exports smg_* counters', async () => {
    const text = await fetch(router.metricsUrl).then((r) => r.text())
    expect(text).toMatch(/smg_router_requests_total\{route="\/generate"\} \d+/)
    expect(text).toMatch(/smg_router_request_errors_total\{error_type="upstream",route="\/generate"\} 1/)
    expect(text).toContain(`smg_router_upstream_responses_total{status="500",worker="${prefill.url}"} 1`)
    expect(text).toContain(`smg_worker_health{worker="${decode.url}"} 1`)
  })
})
