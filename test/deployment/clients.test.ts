import {afterAll, afterEach, beforeAll, describe, expect, it} from 'vitest'

import {DEFAULT_PROBE_TIMEOUT_MS, serviceClients} from '../../src/engines/sglang/deployment/clients.js'
import {httpRequest, jsonWithBigInts} from '../../src/deployment/http.js'
import {sampleValue} from '../../src/deployment/prom-text.js'
import {RouterClient} from '../../src/engines/sglang/deployment/router-client.js'
import {MAX_ROOM, newRid, newRoom, SglangClient, toRoom} from '../../src/engines/sglang/deployment/sglang-client.js'
import {PdError} from '../../src/errors.js'
import {closedPort, sendJson, startHttp, startRawTcp, type TestServer} from './servers.js'

const METRICS = [
  '# HELP sglang:num_prefill_inflight_queue_reqs inflight',
  '# TYPE sglang:num_prefill_inflight_queue_reqs gauge',
  'sglang:num_prefill_inflight_queue_reqs{engine_type="prefill",model_name="M",tp_rank="0"} 2.0',
  '# TYPE sglang:num_transfer_failed_reqs_total counter',
  'sglang:num_transfer_failed_reqs_total{engine_type="prefill",model_name="M",tp_rank="0"} 7.0',
  '',
].join('\n')

/** Run fn, expect a PdError, and return it with the elapsed time. */
async function failure(fn: () => Promise<unknown>): Promise<{error: PdError; ms: number}> {
  const started = performance.now()
  try {
    await fn()
  } catch (error) {
    const ms = performance.now() - started
    if (!(error instanceof PdError)) throw error
    expect(error.message).not.toContain('\n')
    return {error, ms}
  }
  throw new Error('expected a PdError')
}

const servers: TestServer[] = []
async function track<T extends TestServer>(s: Promise<T>): Promise<T> {
  const server = await s
  servers.push(server)
  return server
}
afterEach(async () => {
  await Promise.all(servers.splice(0).map(s => s.close()))
})

describe('a well-behaved SGLang server', () => {
  let sglang: TestServer
  let bootstrap: TestServer
  beforeAll(async () => {
    sglang = await startHttp((req, res) => {
      const path = (req.url ?? '').split('?')[0]
      if (path === '/generate') {
        const body = JSON.parse(req.body) as {rid: string; stream?: boolean; text?: string}
        if (body.text === 'fail') return sendJson(res, 500, {error: {message: 'Prefill transfer failed'}})
        if (body.stream) {
          res.writeHead(200, {'content-type': 'text/event-stream'})
          res.write(`data: ${JSON.stringify({text: 'a', meta_info: {id: body.rid}})}\n\n`)
          res.write(
            `data: ${JSON.stringify({text: 'ab', meta_info: {id: body.rid, finish_reason: {type: 'length'}}})}\n\n`,
          )
          return res.end('data: [DONE]\n\n')
        }
        return sendJson(res, 200, {text: 'x', meta_info: {id: body.rid, finish_reason: {type: 'length'}}})
      }
      if (path === '/abort_request') return sendJson(res, 200, {})
      if (path === '/health') return res.end('')
      if (path === '/get_server_info') return sendJson(res, 200, {version: '0.5.10', disaggregation_mode: 'prefill'})
      if (path === '/v1/loads')
        return sendJson(res, 200, {loads: [{dp_rank: 0, disagg: {prefill_inflight_queue_reqs: 1}}]})
      if (path === '/metrics') {
        res.writeHead(200, {'content-type': 'text/plain; version=0.0.4; charset=utf-8'})
        return res.end(METRICS)
      }
      res.writeHead(404).end('Not Found')
    })
    bootstrap = await startHttp((req, res) => {
      const url = new URL(req.url ?? '/', 'http://x')
      if (url.searchParams.get('target_tp_rank') === '-1')
        return sendJson(res, 200, {prefill_tp_size: 4, prefill_dp_size: 1})
      sendJson(res, 200, {rank_ip: '127.0.0.1', rank_port: 40_000 + Number(url.searchParams.get('target_tp_rank'))})
    })
  })
  afterAll(async () => {
    await sglang.close()
    await bootstrap.close()
  })

  it('generate sends pdchaos rid, the sampling params and the 63-bit room as a bare integer', async () => {
    const client = new SglangClient(sglang.url, {service: 'prefill'})
    const rid = newRid()
    const r = await client.generate({
      rid,
      text: 'hello',
      max_new_tokens: 1,
      bootstrap_host: '127.0.0.1',
      bootstrap_port: 8998,
      bootstrap_room: MAX_ROOM,
    })
    expect(r.status).toBe(200)
    expect(r.rid).toBe(rid)
    expect((r.body as {meta_info: {id: string}}).meta_info.id).toBe(rid)
    const sent = sglang.received.at(-1)!
    expect(sent.method).toBe('POST')
    expect(sent.body).toContain('"bootstrap_room":9223372036854775807}')
    expect(sent.body).toContain(`"rid":"${rid}"`)
    expect(JSON.parse(sent.body)).toMatchObject({
      text: 'hello',
      sampling_params: {max_new_tokens: 1},
      bootstrap_host: '127.0.0.1',
      bootstrap_port: 8998,
    })
    // A decimal string room is sent just the same, without passing through a lossy number.
    await client.generate({rid: newRid(), input_ids: [1, 2, 3], bootstrap_room: '9007199254740993'})
    expect(sglang.received.at(-1)!.body).toContain('"bootstrap_room":9007199254740993}')
  })

  it('generate returns a 500 as a result (that is how SGLang reports a failed PD request)', async () => {
    const r = await new SglangClient(sglang.url).generate({rid: newRid(), text: 'fail'})
    expect(r.status).toBe(500)
    expect(r.body).toEqual({error: {message: 'Prefill transfer failed'}})
  })

  it('generate reads a stream of events', async () => {
    const r = await new SglangClient(sglang.url).generate({rid: 'r-stream', text: 'x', stream: true})
    expect(r.status).toBe(200)
    expect(r.body).toEqual([
      {text: 'a', meta_info: {id: 'r-stream'}},
      {text: 'ab', meta_info: {id: 'r-stream', finish_reason: {type: 'length'}}},
    ])
  })

  it('abort posts the rid; health, server_info (with fallback), loads and metrics', async () => {
    const client = new SglangClient(sglang.url, {service: 'decode'})
    await client.abort('pdchaos-abc')
    expect(sglang.received.at(-1)).toEqual({
      method: 'POST',
      url: '/abort_request',
      body: '{"rid":"pdchaos-abc","abort_all":false}',
    })
    expect((await client.health()).ok).toBe(true)
    const missing = await client.health('/health_generate')
    expect(missing.ok).toBe(false)
    expect(missing.error).toBe(`decode at ${sglang.url}/health_generate answered HTTP 404: "Not Found"`)
    expect(await client.serverInfo()).toEqual({version: '0.5.10', disaggregation_mode: 'prefill'})
    expect(sglang.received.slice(-2).map(r => r.url)).toEqual(['/server_info', '/get_server_info'])
    expect(await client.loads()).toEqual({loads: [{dp_rank: 0, disagg: {prefill_inflight_queue_reqs: 1}}]})
    expect(sglang.received.at(-1)!.url).toBe('/v1/loads?include=disagg')
    const m = await client.metrics()
    expect(sampleValue(m.samples, 'sglang:num_prefill_inflight_queue_reqs', {tp_rank: '0'})).toBe(2)
    expect(sampleValue(m.samples, 'sglang:num_transfer_failed_reqs_total')).toBe(7)
  })

  it('bootstrapRoute asks /route with SGLang query names (all -1 by default)', async () => {
    const client = new SglangClient(sglang.url, {service: 'prefill'})
    expect(await client.bootstrapRoute(bootstrap.url)).toEqual({prefill_tp_size: 4, prefill_dp_size: 1})
    expect(bootstrap.received.at(-1)!.url).toBe(
      '/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1',
    )
    expect(
      await client.bootstrapRoute(bootstrap.url, {
        prefill_dp_rank: 0,
        prefill_cp_rank: 0,
        target_tp_rank: 3,
        target_pp_rank: 0,
      }),
    ).toEqual({rank_ip: '127.0.0.1', rank_port: 40_003})
  })
})

describe('a service that misbehaves gives one clear line naming it, within the timeout', () => {
  it('refused', async () => {
    const port = await closedPort()
    const url = `http://127.0.0.1:${port}`
    const client = new SglangClient(url, {service: 'prefill', timeoutMs: 2000})
    const {error, ms} = await failure(() => client.serverInfo())
    expect(error.exitCode).toBe(5)
    expect(error.message).toBe(`prefill at ${url}/server_info refused the connection`)
    expect(error.suggestion).toMatch(/running/)
    expect(ms).toBeLessThan(2000)
    const h = await client.health()
    expect(h).toMatchObject({ok: false, error: `prefill at ${url}/health refused the connection`})
  })

  it('hangs before answering, or in the middle of the body', async () => {
    const hang = await track(
      startHttp((req, res) => {
        if (req.url === '/metrics') {
          res.writeHead(200, {'content-type': 'text/plain'})
          res.write('# TYPE a gauge\na 1\n') // ...and never ends
        }
        // anything else: never answered
      }),
    )
    const client = new SglangClient(hang.url, {service: 'decode', timeoutMs: 300})
    for (const call of [
      () => client.serverInfo(),
      () => client.metrics(),
      () => client.abort('r1'),
      () => client.ensureHealthy(),
    ]) {
      const {error, ms} = await failure(call)
      expect(error.exitCode).toBe(5)
      expect(error.message).toMatch(new RegExp(`^decode at ${hang.url}/\\S+ did not answer within 0\\.3 s$`))
      expect(ms).toBeGreaterThanOrEqual(250)
      expect(ms).toBeLessThan(300 + 2000)
    }
    // A generation request has its own deadline.
    const gen = await failure(() => client.generate({rid: 'g', text: 'x'}, {timeoutMs: 200}))
    expect(gen.error.message).toBe(`decode at ${hang.url}/generate did not answer within 0.2 s`)
  })

  it('a cancelled generation stops at once, told apart from a timeout', async () => {
    const hang = await track(startHttp(() => {}))
    const controller = new AbortController()
    setTimeout(() => controller.abort(), 100)
    const {error, ms} = await failure(() =>
      new SglangClient(hang.url, {service: 'prefill'}).generate({rid: 'c', text: 'x'}, {signal: controller.signal}),
    )
    expect(error.code).toBe('E_ABORTED')
    expect(error.exitCode).toBe(3)
    expect(error.message).toMatch(/^request to prefill at .*\/generate was cancelled after \d+ ms$/)
    expect(ms).toBeLessThan(2000)
  })

  it('answers garbage: not JSON, not an object, not HTTP', async () => {
    const garbage = await track(
      startHttp((req, res) => {
        if (req.url === '/server_info') return res.end('<html><body>proxy error</body></html>')
        if (req.url === '/v1/loads?include=disagg') return res.end('{"truncated": ')
        if (req.url === '/generate') return res.end('OK')
        if (req.url?.startsWith('/route')) return res.end('Bad Gateway')
        sendJson(res, 200, [1, 2])
      }),
    )
    const client = new SglangClient(garbage.url, {service: 'prefill', timeoutMs: 2000})
    const info = await failure(() => client.serverInfo())
    expect(info.error.exitCode).toBe(5)
    expect(info.error.message).toBe(
      `prefill at ${garbage.url}/server_info answered garbage: "<html><body>proxy error</body></html>" is not JSON`,
    )
    expect((await failure(() => client.loads())).error.message).toMatch(
      /\/v1\/loads\?include=disagg answered garbage: "\{\\"truncated\\":" is not JSON$/,
    )
    expect((await failure(() => client.generate({rid: 'x', text: 'y'}))).error.message).toMatch(
      /\/generate answered garbage: "OK" is not JSON$/,
    )
    expect((await failure(() => client.generate({rid: 'x', text: 'y', stream: true}))).error.message).toMatch(
      /\/generate answered garbage: "OK" is not an event stream$/,
    )
    const bootstrap = await failure(() => client.bootstrapRoute(garbage.url))
    expect(bootstrap.error.message).toBe(
      `bootstrap server ` +
        `at ${garbage.url}/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1 ` +
        `answered garbage: "Bad Gateway" is not JSON`,
    )
    // JSON, but not the object server_info is.
    expect(
      (await failure(() => new SglangClient(garbage.url + '/x', {service: 'prefill'}).serverInfo())).error.message,
    ).toMatch(/answered garbage: expected a JSON object, got "\[1,2\]"$/)
    const raw = await track(startRawTcp('SSH-2.0-OpenSSH_9.2p1 Debian\r\n'))
    const notHttp = await failure(() => new SglangClient(raw.url, {service: 'router', timeoutMs: 2000}).serverInfo())
    expect(notHttp.error.exitCode).toBe(5)
    expect(notHttp.error.message).toMatch(
      new RegExp(`^router at ${raw.url}/server_info answered garbage: not an HTTP response \\(HPE_`),
    )
    const cut = await track(startRawTcp('HTTP/1.1 200 OK\r\ncontent-length: 50\r\n\r\n{"short'))
    expect((await failure(() => new SglangClient(cut.url, {service: 'router'}).serverInfo())).error.message).toBe(
      `router at ${cut.url}/server_info closed the connection before its answer was complete (ECONNRESET)`,
    )
  })

  it('answers 503: health is not ok, ensureHealthy and the bootstrap route say why', async () => {
    const busy = await track(
      startHttp((_req, res) => {
        res.writeHead(503, {'content-type': 'text/plain'})
        res.end('Service Unavailable\n')
      }),
    )
    const client = new SglangClient(busy.url, {service: 'prefill', timeoutMs: 2000})
    const h = await client.health()
    expect(h).toMatchObject({
      ok: false,
      status: 503,
      error: `prefill at ${busy.url}/health answered HTTP 503: "Service Unavailable"`,
    })
    const e = await failure(() => client.ensureHealthy())
    expect(e.error.exitCode).toBe(5)
    expect(e.error.message).toBe(`prefill at ${busy.url}/health answered HTTP 503: "Service Unavailable"`)
    const route = await failure(() => client.bootstrapRoute(busy.url))
    expect(route.error.message).toMatch(/^bootstrap server at .*\/route\?.* answered HTTP 503/)
    expect(route.error.suggestion).toMatch(/registered/)
    expect((await failure(() => client.metrics())).error.message).toBe(
      `prefill at ${busy.url}/metrics answered HTTP 503: "Service Unavailable"`,
    )
  })

  it('serves a malformed metrics page: the error names the service and the line', async () => {
    const bad = await track(
      startHttp((_req, res) => {
        res.writeHead(200, {'content-type': 'text/plain'})
        res.end('# TYPE a gauge\na{x="1"} 1\na{x="2" 2\n')
      }),
    )
    const {error} = await failure(() => new SglangClient(bad.url, {service: 'decode'}).metrics())
    expect(error.exitCode).toBe(5)
    expect(error.message).toBe(
      `malformed metrics from decode at ${bad.url}/metrics at line 3: expected "," or "}" after label x: ` +
        `"a{x=\\"2\\" 2"`,
    )
  })
})

describe('RouterClient', () => {
  it('generates with its own rid, probes readiness and liveness, reads metrics from the Prometheus port', async () => {
    const router = await track(
      startHttp((req, res) => {
        if (req.url === '/generate')
          return sendJson(res, 200, {text: 'ok', meta_info: {id: (JSON.parse(req.body) as {rid: string}).rid}})
        if (req.url === '/readiness') return sendJson(res, 503, {status: 'not ready', reason: 'no decode worker'})
        if (req.url === '/liveness' || req.url === '/health') return res.end('OK')
        res.writeHead(404).end()
      }),
    )
    const prom = await track(
      startHttp((_req, res) => {
        res.writeHead(200, {'content-type': 'text/plain'})
        res.end('# TYPE smg_router_requests_total counter\nsmg_router_requests_total{route="/generate"} 12\n')
      }),
    )
    const client = new RouterClient(router.url, {metricsUrl: prom.url, timeoutMs: 2000})
    const rid = newRid()
    const r = await client.generate({rid, text: 'hi', max_new_tokens: 4})
    expect(r).toMatchObject({rid, status: 200, body: {meta_info: {id: rid}}})
    expect(JSON.parse(router.received.at(-1)!.body)).toEqual({rid, text: 'hi', sampling_params: {max_new_tokens: 4}})
    expect((await client.liveness()).ok).toBe(true)
    expect((await client.health()).ok).toBe(true)
    const ready = await client.readiness()
    expect(ready.ok).toBe(false)
    expect(ready.error).toMatch(/^router at .*\/readiness answered HTTP 503: .*no decode worker/)
    const m = await client.metrics()
    expect(prom.received.at(-1)!.url).toBe('/metrics')
    expect(sampleValue(m.samples, 'smg_router_requests_total', {route: '/generate'})).toBe(12)
  })
})

describe('rooms, rids and exact JSON', () => {
  it('keeps 63-bit rooms exact and refuses rooms out of range (exit 2)', () => {
    for (let i = 0; i < 200; i++) {
      const room = newRoom()
      expect(room >= 0n && room <= MAX_ROOM).toBe(true)
      expect(jsonWithBigInts({bootstrap_room: room})).toBe(`{"bootstrap_room":${room}}`)
    }
    expect(toRoom('9223372036854775807')).toBe(MAX_ROOM)
    for (const bad of ['9223372036854775808', '-1', '1e3', '', ' 1', '0x10']) {
      let caught: unknown
      try {
        toRoom(bad)
      } catch (error) {
        caught = error
      }
      expect(caught, bad).toBeInstanceOf(PdError)
      expect((caught as PdError).exitCode).toBe(2)
    }
    expect(() => toRoom(-1n)).toThrow(/outside/)
  })

  it('rids are distinct and never a prefix of one another (SGLang aborts by prefix)', () => {
    const rids = Array.from({length: 500}, () => newRid())
    expect(new Set(rids).size).toBe(rids.length)
    expect(new Set(rids.map(r => r.length)).size).toBe(1)
  })

  it('jsonWithBigInts matches JSON.stringify on plain values', () => {
    const value = {a: 1, b: 'x"\\\n', c: [1, null, undefined, {d: true}], e: undefined, f: {g: 1.5e-7}}
    expect(jsonWithBigInts(value)).toBe(JSON.stringify(value))
  })

  it('httpRequest refuses to run without a deadline', async () => {
    await expect(httpRequest({service: 's', url: 'http://127.0.0.1:1/', timeoutMs: 0})).rejects.toThrow(
      /timeoutMs must be positive/,
    )
  })
})

describe('serviceClients', () => {
  const services = {
    prefill: {url: 'http://10.0.0.5:30000'},
    decode: {url: 'http://10.0.0.5:30001'},
    router: {url: 'http://10.0.0.5:8000', metricsUrl: 'http://10.0.0.5:29000'},
  } as never

  it('builds the three clients from the deployment, named, with one probe deadline', () => {
    const c = serviceClients({services})
    expect(c.prefill).toBeInstanceOf(SglangClient)
    expect(c.router).toBeInstanceOf(RouterClient)
    expect([c.prefill.service, c.decode.service, c.router.service]).toEqual(['prefill', 'decode', 'router'])
    expect([c.prefill.baseUrl, c.decode.baseUrl, c.router.baseUrl]).toEqual([
      'http://10.0.0.5:30000',
      'http://10.0.0.5:30001',
      'http://10.0.0.5:8000',
    ])
    expect(c.router.metricsUrl).toBe('http://10.0.0.5:29000/metrics')
    expect(DEFAULT_PROBE_TIMEOUT_MS).toBe(5000)
    expect([c.prefill.timeoutMs, c.decode.timeoutMs, c.router.timeoutMs]).toEqual([5000, 5000, 5000])
    const quick = serviceClients({services}, {timeoutMs: 1000})
    expect([quick.prefill.timeoutMs, quick.decode.timeoutMs, quick.router.timeoutMs]).toEqual([1000, 1000, 1000])
  })
})
