import {afterAll, afterEach, beforeAll, describe, expect, it} from 'vitest'

import {attemptsAllowed, backoffDelayMs, isRetryableStatus, RETRY_DEFAULTS} from '../../src/sim/router/retry.js'
import {
  type Behaviour,
  fails,
  json,
  ok,
  post,
  ridOf,
  roomOf,
  type RouterRig,
  routerRig,
  sample,
  sleep,
  until,
} from './router-fakes.js'

/**
 * The router's retries, as sgl-model-gateway's RetryExecutor runs the PD dual dispatch (core/retry.rs,
 * routers/http/pd_router.rs): 408/429/500/502/503/504 and transport errors are retried, each attempt with the same
 * body and rid and a fresh bootstrap room, after 50 ms × 1.5^n ± 20 %, for max(--retry-max-retries, 1) attempts in all.
 */

/** Fails the first `n` requests with `first`, then behaves as `then`. */
function failFirst(n: number, first: Behaviour, then: Behaviour = ok()): Behaviour & {seen: number} {
  const b = ((body, req, res) => {
    b.seen++
    ;(b.seen <= n ? first : then)(body, req, res)
  }) as Behaviour & {seen: number}
  b.seen = 0
  return b
}

describe('backoff and retryable statuses (pure)', () => {
  it('retries exactly 408, 429, 500, 502, 503 and 504', () => {
    const retried = [...Array.from({length: 500}, (_, i) => i + 100)].filter(isRetryableStatus)
    expect(retried).toEqual([408, 429, 500, 502, 503, 504])
  })

  it('waits 50 ms × 1.5^n, truncated to whole ms and capped at 30 s, without jitter', () => {
    const s = {...RETRY_DEFAULTS, jitterFactor: 0}
    expect([0, 1, 2, 3, 4, 5].map(n => backoffDelayMs(s, n))).toEqual([50, 75, 112, 168, 253, 379])
    expect(backoffDelayMs(s, 40)).toBe(30_000)
  })

  it('adds a jitter of at most ±20 % (uniform), rounded to whole ms', () => {
    expect(backoffDelayMs(RETRY_DEFAULTS, 0, () => 0)).toBe(40)
    expect(backoffDelayMs(RETRY_DEFAULTS, 0, () => 0.5)).toBe(50)
    expect(backoffDelayMs(RETRY_DEFAULTS, 0, () => 0.999_999)).toBe(60)
    for (const n of [0, 1, 2, 3, 10]) {
      const base = backoffDelayMs({...RETRY_DEFAULTS, jitterFactor: 0}, n)
      for (let i = 0; i < 200; i++) {
        const d = backoffDelayMs(RETRY_DEFAULTS, n)
        expect(d).toBeGreaterThanOrEqual(Math.floor(base * 0.8) - 1)
        expect(d).toBeLessThanOrEqual(Math.ceil(base * 1.2) + 1)
      }
    }
  })

  it('counts attempts as upstream does: max(max_retries, 1), or 1 with --disable-retries', () => {
    expect(attemptsAllowed(RETRY_DEFAULTS)).toBe(5)
    expect(attemptsAllowed({...RETRY_DEFAULTS, maxRetries: 0})).toBe(1)
    expect(attemptsAllowed({...RETRY_DEFAULTS, disabled: true})).toBe(1)
  })
})

describe('router retries (upstream defaults, breaker off)', () => {
  let rig: RouterRig

  beforeAll(async () => {
    rig = await routerRig({circuitBreaker: {disabled: true}})
  })

  afterEach(() => {
    rig.prefill.behaviour = ok()
    rig.decode.behaviour = ok()
  })

  afterAll(async () => {
    await rig?.close()
  })

  it('retries a prefill 500 five times in all, same rid, a new room each time, and answers the last 500', async () => {
    rig.prefill.behaviour = fails(500)
    const p0 = rig.prefill.bodies.length
    const d0 = rig.decode.bodies.length
    const r = await post(rig.router.url, {rid: 'pin-1', text: 'x', sampling_params: {max_new_tokens: 1}})
    expect(r.status).toBe(500)
    expect(JSON.parse(r.text).error).toMatchObject({type: 'internal_server_error', code: 'prefill_internal_error'})
    const pBodies = rig.prefill.bodies.slice(p0)
    const dBodies = rig.decode.bodies.slice(d0)
    expect(pBodies).toHaveLength(5)
    expect(dBodies).toHaveLength(5)
    expect(pBodies.map(ridOf)).toEqual(Array(5).fill('pin-1'))
    const rooms = pBodies.map(roomOf)
    expect(new Set(rooms).size).toBe(5)
    expect(dBodies.map(roomOf).sort()).toEqual([...rooms].sort())

    const truth = rig.truth().filter(t => t.rid === 'pin-1')
    const sent = truth.filter(t => t.event === 'sent')
    expect(sent.map(t => t.attempt)).toEqual([0, 1, 2, 3, 4])
    expect(sent.map(t => t.room)).toEqual(rooms)
    const attempts = truth.filter(t => t.event === 'attempt')
    expect(attempts.map(t => [t.attempt, t.room, t.status, t.prefillStatus])).toEqual(
      rooms.map((room, i) => [i, room, 500, 500]),
    )
    expect(truth.filter(t => t.event === 'retry').map(t => t.attempt)).toEqual([1, 2, 3, 4])
    expect(truth.find(t => t.event === 'answered')).toMatchObject({
      status: 500,
      attempts: 5,
      room: rooms[4],
      prefillStatus: 500,
    })
  })

  it('waits the jittered backoff between attempts (wide bounds)', async () => {
    rig.prefill.behaviour = fails(500)
    const r = await post(rig.router.url, {rid: 'pin-2', text: 'x'})
    expect(r.status).toBe(500)
    const retries = rig.truth().filter(t => t.rid === 'pin-2' && t.event === 'retry')
    const base = [50, 75, 112, 168]
    expect(
      retries.map(t => t.backoffMs as number).every((ms, i) => ms >= base[i] * 0.8 - 1 && ms <= base[i] * 1.2 + 1),
    ).toBe(true)
    // The four waits add up to at least 0.8 × 405 ms; the bound above is loose on purpose (timers, a busy machine).
    expect(r.ms).toBeGreaterThanOrEqual(300)
    expect(r.ms).toBeLessThan(8000)
    const sentAt = rig
      .truth()
      .filter(t => t.rid === 'pin-2' && t.event === 'sent')
      .map(t => t.t as number)
    for (let i = 1; i < sentAt.length; i++)
      expect(sentAt[i] - sentAt[i - 1]).toBeGreaterThanOrEqual(base[i - 1] * 0.8 - 2)
  })

  it('succeeds on a later attempt, and a transport error (502) is retried like a status', async () => {
    rig.prefill.behaviour = failFirst(2, (_b, req) => req.socket.destroy())
    const r = await post(rig.router.url, {rid: 'flaky', text: 'x'})
    expect(r.status).toBe(200)
    const truth = rig.truth().filter(t => t.rid === 'flaky')
    expect(truth.filter(t => t.event === 'attempt').map(t => t.status)).toEqual([502, 502, 200])
    expect(truth.find(t => t.event === 'answered')).toMatchObject({status: 200, attempts: 3})
  })

  it("retries decode's error too (decode answered 503)", async () => {
    rig.decode.behaviour = failFirst(1, (_b, _q, res) => json(res, 503, {error: {message: 'busy'}}))
    const r = await post(rig.router.url, {rid: 'd-busy', text: 'x'})
    expect(r.status).toBe(200)
    expect(rig.truth().find(t => t.rid === 'd-busy' && t.event === 'answered')).toMatchObject({attempts: 2})
  })

  it('does not retry a status that is not retryable (400)', async () => {
    rig.decode.behaviour = (_b, _q, res) => json(res, 400, {error: {message: 'bad sampling params'}})
    const before = rig.prefill.bodies.length
    const r = await post(rig.router.url, {rid: 'bad', text: 'x'})
    expect(r.status).toBe(400)
    expect(JSON.parse(r.text).error).toMatchObject({code: 'decode_bad_request', message: 'bad sampling params'})
    expect(rig.prefill.bodies.length - before).toBe(1)
  })

  it('stops retrying when the client goes away during the backoff', async () => {
    rig.prefill.behaviour = fails(500)
    const before = rig.prefill.bodies.length
    const aborted = post(rig.router.url, {rid: 'gone', text: 'x'}, 30).catch(() => 'aborted')
    expect(await aborted).toBe('aborted')
    await sleep(600) // longer than every backoff of 5 attempts
    expect(rig.prefill.bodies.length - before).toBeLessThanOrEqual(1)
    await until(() => rig.truth().some(t => t.rid === 'gone' && t.event === 'answered'))
    expect(rig.truth().find(t => t.rid === 'gone' && t.event === 'answered')).toMatchObject({status: 499})
  })

  it(
    'moves the retry metrics: smg_worker_retries_total, smg_worker_retries_exhausted_total, ' +
      'smg_worker_retry_backoff_seconds',
    async () => {
      const labels = (worker_type: string) => ({endpoint: 'generate', worker_type})
      const before = await rig.metrics()
      rig.prefill.behaviour = fails(500)
      await post(rig.router.url, {rid: 'm-1', text: 'x'})
      const after = await rig.metrics()
      for (const t of ['prefill', 'decode']) {
        expect(
          sample(after, 'smg_worker_retries_total', labels(t)) - sample(before, 'smg_worker_retries_total', labels(t)),
        ).toBe(4)
        expect(
          sample(after, 'smg_worker_retries_exhausted_total', labels(t)) -
            sample(before, 'smg_worker_retries_exhausted_total', labels(t)),
        ).toBe(1)
      }
      for (const a of ['1', '2', '3', '4']) {
        expect(
          sample(after, 'smg_worker_retry_backoff_seconds_count', {attempt: a}) -
            sample(before, 'smg_worker_retry_backoff_seconds_count', {attempt: a}),
        ).toBe(1)
      }
      expect(sample(after, 'smg_worker_retry_backoff_seconds_count', {attempt: '5'})).toBe(0)
      expect(
        sample(after, 'smg_worker_errors_total', {
          connection_mode: 'http',
          error_type: 'internal_error',
          worker_type: 'prefill',
        }),
      ).toBeGreaterThanOrEqual(5)
    },
  )
})

describe('router retries switched off or reduced', () => {
  it('--disable-retries: one attempt, counted as exhausted', async () => {
    const rig = await routerRig({retry: {disabled: true}, circuitBreaker: {disabled: true}}, fails(500))
    try {
      const r = await post(rig.router.url, {rid: 'once', text: 'x'})
      expect(r.status).toBe(500)
      expect(rig.prefill.bodies).toHaveLength(1)
      const page = await rig.metrics()
      expect(sample(page, 'smg_worker_retries_total', {endpoint: 'generate', worker_type: 'prefill'})).toBe(0)
      expect(sample(page, 'smg_worker_retries_exhausted_total', {endpoint: 'generate', worker_type: 'prefill'})).toBe(1)
    } finally {
      await rig.close()
    }
  })

  it('--retry-max-retries 2 gives two attempts; 0 gives one', async () => {
    for (const [maxRetries, attempts] of [
      [2, 2],
      [0, 1],
    ]) {
      const rig = await routerRig(
        {retry: {maxRetries, initialBackoffMs: 1}, circuitBreaker: {disabled: true}},
        fails(503),
      )
      try {
        const r = await post(rig.router.url, {rid: 'n', text: 'x'})
        expect(r.status).toBe(503)
        expect(JSON.parse(r.text).error.code).toBe('prefill_unavailable')
        expect(rig.prefill.bodies).toHaveLength(attempts)
      } finally {
        await rig.close()
      }
    }
  })
})
