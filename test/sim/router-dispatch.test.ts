import {afterAll, afterEach, beforeAll, describe, expect, it} from 'vitest'

import {injectBootstrap} from '../../src/sim/router/router.js'
import {fails, json, ok, post, roomOf, type RouterRig, routerRig, sample, until} from './router-fakes.js'

/**
 * The router against two plain HTTP workers that record what they receive: the PD dispatch contract of one attempt
 * (same room in both bodies, bootstrap fields injected, both legs polled until prefill resolves as
 * dispatch.rs does, a failed prefill dropping decode, decode failing first answered at once, mapped to the gateway's
 * error body). Retries: router-retry.test.ts; the
 * circuit breaker: router-breaker.test.ts.
 */

describe('router dispatch', () => {
  let rig: RouterRig

  beforeAll(async () => {
    rig = await routerRig({}, ok(20))
  })

  afterEach(() => {
    rig.prefill.behaviour = ok(20)
    rig.decode.behaviour = ok()
    rig.prefill.healthStatus = 200
  })

  afterAll(async () => {
    await rig?.close()
  })

  it(
    'sends one body with the same 63-bit room and the prefill bootstrap address to both workers, and answers ' +
      'decode',
    async () => {
      const before = rig.prefill.bodies.length
      const r = await post(rig.router.url, {
        rid: 'req-1',
        text: 'hi there',
        sampling_params: {max_new_tokens: 4},
        bootstrap_room: 5,
      })
      expect(r.status).toBe(200)
      expect(JSON.parse(r.text).text).toBe(' hello')
      const p = rig.prefill.bodies[before]
      const d = rig.decode.bodies.at(-1)!
      expect(p).toBe(d)
      const body = JSON.parse(p)
      expect(body.rid).toBe('req-1')
      expect(body.bootstrap_host).toBe('127.0.0.1')
      expect(body.bootstrap_port).toBe(8998)
      const room = BigInt(roomOf(p))
      expect(room).not.toBe(5n)
      expect(room >= 0n && room < 1n << 63n).toBe(true)
      const answered = rig.truth().find(t => t.event === 'answered' && t.rid === 'req-1')
      expect(answered).toMatchObject({
        room: room.toString(),
        status: 200,
        prefillStatus: 200,
        decodeStatus: 200,
        attempts: 1,
      })
      expect(rig.truth().filter(t => t.event === 'sent' && t.rid === 'req-1')).toEqual([
        expect.objectContaining({room: room.toString(), attempt: 0}),
      ])
    },
  )

  it('makes rooms above 2^53 and writes them exactly', async () => {
    const rooms = new Set<string>()
    for (let i = 0; i < 20; i++) {
      await post(rig.router.url, {rid: `big-${i}`, text: 'x'})
      rooms.add(roomOf(rig.prefill.bodies.at(-1)!))
    }
    expect(rooms.size).toBe(20)
    expect([...rooms].some(r => BigInt(r) > 2n ** 53n)).toBe(true)
    expect(injectBootstrap({}, 'h', 1, 2n ** 62n + 1n)).toBe(
      `{"bootstrap_host":"h","bootstrap_port":1,"bootstrap_room":${2n ** 62n + 1n}}`,
    )
  })

  it('holds the decode answer until prefill resolves', async () => {
    rig.prefill.behaviour = ok(400)
    const r = await post(rig.router.url, {rid: 'hold', text: 'x'})
    expect(r.status).toBe(200)
    expect(r.ms).toBeGreaterThanOrEqual(380)
  })

  it('passes a decode stream through', async () => {
    rig.decode.behaviour = (_b, _q, res) => {
      res.writeHead(200, {'content-type': 'text/event-stream'})
      res.write('data: {"text":"a"}\n\n')
      setTimeout(() => res.end('data: [DONE]\n\n'), 30)
    }
    const r = await post(rig.router.url, {rid: 's', text: 'x', stream: true})
    expect(r.status).toBe(200)
    expect(r.text).toBe('data: {"text":"a"}\n\ndata: [DONE]\n\n')
  })

  it('rejects a body that is not a JSON object with 400', async () => {
    const r = await fetch(rig.router.url + '/generate', {method: 'POST', body: 'nope'})
    expect(r.status).toBe(400)
  })

  it('drops readiness after 3 failed probes and restores it after 2 good ones; liveness stays 200', async () => {
    expect((await fetch(rig.router.url + '/readiness')).status).toBe(200)
    rig.prefill.healthStatus = 503
    let status = 200
    await until(async () => {
      status = (await fetch(rig.router.url + '/readiness')).status
      return status !== 200
    })
    expect(status).toBe(503)
    expect((await fetch(rig.router.url + '/liveness')).status).toBe(200)
    expect(sample(await rig.metrics(), 'smg_worker_health', {worker: rig.prefill.url})).toBe(0)
    rig.prefill.healthStatus = 200
    await until(async () => {
      status = (await fetch(rig.router.url + '/readiness')).status
      return status === 200
    })
    expect(status).toBe(200)
  })

  it('exports the smg_* families, with both breakers closed after successes', async () => {
    const page = await rig.metrics()
    expect(page).toMatch(/smg_router_requests_total\{route="\/generate"\} \d+/)
    expect(page).toContain(`smg_router_upstream_responses_total{status="200",worker="${rig.prefill.url}"}`)
    expect(sample(page, 'smg_worker_health', {worker: rig.decode.url})).toBe(1)
    for (const w of [rig.prefill, rig.decode]) {
      expect(sample(page, 'smg_worker_cb_state', {worker: w.url})).toBe(0)
      expect(sample(page, 'smg_worker_cb_outcomes_total', {outcome: 'success', worker: w.url})).toBeGreaterThan(20)
      expect(sample(page, 'smg_worker_cb_consecutive_failures', {worker: w.url})).toBe(0)
    }
    for (const family of [
      'smg_worker_retries_total',
      'smg_worker_retries_exhausted_total',
      'smg_worker_cb_transitions_total',
    ]) {
      expect(page).toContain(`# TYPE ${family} counter`)
    }
    expect(page).toContain('# TYPE smg_worker_retry_backoff_seconds summary')
  })
})

describe('router dispatch, one attempt (--disable-retries)', () => {
  let rig: RouterRig

  beforeAll(async () => {
    rig = await routerRig({retry: {disabled: true}, circuitBreaker: {disabled: true}})
  })

  afterEach(() => {
    rig.prefill.behaviour = ok()
    rig.decode.behaviour = ok()
  })

  afterAll(async () => {
    await rig?.close()
  })

  it('answers a prefill 500 as 500 with the gateway error body at once, dropping decode (dispatch.rs)', async () => {
    rig.prefill.behaviour = fails(500, 30)
    rig.decode.behaviour = (_b, _q, res) => json(res, 200, {text: 'late'}, 400)
    const closedBefore = rig.decode.closedEarly
    const r = await post(rig.router.url, {rid: 'p500', text: 'x'})
    expect(r.status).toBe(500)
    expect(r.ms).toBeLessThan(380) // decode is not awaited: it would wait for KV that never comes
    expect(JSON.parse(r.text)).toEqual({
      error: {
        type: 'internal_server_error',
        code: 'prefill_internal_error',
        message:
          'Prefill server error (500 Internal Server Error): {"error":{"message":"Prefill transfer ' +
          'failed","code":500}}',
      },
    })
    await until(() => rig.decode.closedEarly > closedBefore, 2000)
    const answered = rig.truth().find(t => t.event === 'answered' && t.rid === 'p500')
    expect(answered).toMatchObject({status: 500, prefillStatus: 500, decodeStatus: null, attempts: 1})
  })

  it(
    "answers decode's error when decode fails before prefill resolves, mapping its status as " + 'pd_router.rs does',
    async () => {
      rig.prefill.behaviour = fails(500, 300)
      rig.decode.behaviour = (_b, _q, res) => json(res, 503, {error: {message: 'decode is full'}})
      let r = await post(rig.router.url, {rid: 'd503', text: 'x'})
      expect(r.status).toBe(503)
      expect(JSON.parse(r.text)).toEqual({
        error: {type: 'service_unavailable', code: 'decode_unavailable', message: 'decode is full'},
      })
      rig.decode.behaviour = (_b, _q, res) => json(res, 504, {message: 'slow'})
      r = await post(rig.router.url, {rid: 'd504', text: 'x'})
      expect(r.status).toBe(500) // any other status becomes internal_error
      expect(JSON.parse(r.text).error).toMatchObject({code: 'decode_error', message: 'slow'})
    },
  )

  it('answers 502 prefill_server_error when prefill cannot be reached and decode answered', async () => {
    rig.prefill.behaviour = (_b, req) => req.socket.destroy()
    const r = await post(rig.router.url, {rid: 'p-gone', text: 'x'})
    expect(r.status).toBe(502)
    expect(JSON.parse(r.text).error).toMatchObject({type: 'bad_gateway', code: 'prefill_server_error'})
    expect(JSON.parse(r.text).error.message).toMatch(/^Prefill server error: .*\. This will cause decode timeout\.$/)
  })

  it('answers 502 decode_server_error when decode cannot be reached', async () => {
    rig.decode.behaviour = (_b, req) => req.socket.destroy()
    const r = await post(rig.router.url, {rid: 'd-gone', text: 'x'})
    expect(r.status).toBe(502)
    expect(JSON.parse(r.text).error).toMatchObject({type: 'bad_gateway', code: 'decode_server_error'})
  })

  it('sends a streaming decode error as one SSE line with the decode status', async () => {
    rig.decode.behaviour = (_b, _q, res) => json(res, 500, {error: {message: 'boom'}})
    const r = await post(rig.router.url, {rid: 'd-sse', text: 'x', stream: true})
    expect(r.status).toBe(500)
    expect(r.text).toBe(`data: {'error': {"message":{"error":{"message":"boom"}},"status":500}}`)
  })
})
