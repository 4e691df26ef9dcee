import {describe, expect, it} from 'vitest'

import {CB_DEFAULTS, CircuitBreaker, type CircuitState} from '../../src/sim/router/circuit-breaker.js'
import {fails, json, ok, post, type RouterRig, routerRig, sample, sleep} from './router-fakes.js'

/**
 * The router's per-worker circuit breakers, as sgl-model-gateway's core/circuit_breaker.rs and the PD router use them:
 * consecutive failures open a worker's breaker, an open breaker makes the pair unavailable (503 before anything is
 * sent), it turns half-open when looked at after the open duration, and consecutive successes close it again.
 */

function clocked(settings = CB_DEFAULTS) {
  let t = 0
  const transitions: Array<[CircuitState, CircuitState]> = []
  const cb = new CircuitBreaker(settings, {transition: (from, to) => transitions.push([from, to])}, () => t)
  return {cb, transitions, advance: (ms: number) => (t += ms)}
}

describe('circuit breaker (pure, upstream defaults: 10 failures, 3 successes, 60 s)', () => {
  it('opens after 10 consecutive failures; a success in between starts the count again', () => {
    const {cb, transitions} = clocked()
    for (let i = 0; i < 9; i++) cb.record(false)
    cb.record(true)
    for (let i = 0; i < 9; i++) cb.record(false)
    expect(cb.state()).toBe('closed')
    cb.record(false)
    expect(cb.state()).toBe('open')
    expect(cb.canExecute()).toBe(false)
    expect(transitions).toEqual([['closed', 'open']])
  })

  it('turns half-open only when looked at after 60 s, lets requests through, and closes after 3 successes', () => {
    const {cb, transitions, advance} = clocked()
    for (let i = 0; i < 10; i++) cb.record(false)
    advance(59_999)
    expect(cb.canExecute()).toBe(false)
    advance(1)
    expect(transitions).toEqual([['closed', 'open']]) // lazy: nothing happens until the state is read
    expect(cb.canExecute()).toBe(true)
    expect(cb.state()).toBe('half_open')
    cb.record(true)
    cb.record(true)
    expect(cb.state()).toBe('half_open')
    cb.record(true)
    expect(cb.state()).toBe('closed')
    expect(transitions).toEqual([
      ['closed', 'open'],
      ['open', 'half_open'],
      ['half_open', 'closed'],
    ])
  })

  it('reopens on any failure while half-open, for another full open duration', () => {
    const {cb, advance} = clocked()
    for (let i = 0; i < 10; i++) cb.record(false)
    advance(60_000)
    expect(cb.state()).toBe('half_open')
    cb.record(true)
    cb.record(false)
    expect(cb.state()).toBe('open')
    advance(59_000)
    expect(cb.state()).toBe('open')
    advance(1000)
    expect(cb.state()).toBe('half_open')
  })

  it('never opens with --disable-circuit-breaker (threshold u32::MAX)', () => {
    const {cb} = clocked({...CB_DEFAULTS, disabled: true})
    for (let i = 0; i < 10_000; i++) cb.record(false)
    expect(cb.state()).toBe('closed')
    expect(cb.consecutiveFailures).toBe(10_000)
  })
})

async function withRig(extra: Parameters<typeof routerRig>[0], body: (rig: RouterRig) => Promise<void>): Promise<void> {
  const rig = await routerRig(extra)
  try {
    await body(rig)
  } finally {
    await rig.close()
  }
}

describe('router circuit breakers', () => {
  it(
    "opens prefill's breaker alone after the threshold, answers 503 without contacting a worker, then " + 'recovers',
    async () => {
      await withRig(
        {retry: {disabled: true}, circuitBreaker: {failureThreshold: 3, successThreshold: 2, timeoutDurationS: 1.5}},
        async rig => {
          rig.prefill.behaviour = fails(500)
          for (let i = 0; i < 3; i++) expect((await post(rig.router.url, {rid: `f-${i}`, text: 'x'})).status).toBe(500)
          let page = await rig.metrics()
          expect(sample(page, 'smg_worker_cb_state', {worker: rig.prefill.url})).toBe(1)
          expect(
            sample(page, 'smg_worker_cb_transitions_total', {from: 'closed', to: 'open', worker: rig.prefill.url}),
          ).toBe(1)
          expect(sample(page, 'smg_worker_cb_outcomes_total', {outcome: 'failure', worker: rig.prefill.url})).toBe(3)
          expect(sample(page, 'smg_worker_cb_consecutive_failures', {worker: rig.prefill.url})).toBe(3)
          // dispatch.rs: decode was dropped for prefill's fault and ticks nothing, so a prefill error storm leaves it
          // closed.
          expect(sample(page, 'smg_worker_cb_state', {worker: rig.decode.url})).toBe(0)
          expect(sample(page, 'smg_worker_cb_outcomes_total', {outcome: 'failure', worker: rig.decode.url}) ?? 0).toBe(
            0,
          )

          rig.prefill.behaviour = ok()
          const sentBefore = [rig.prefill.bodies.length, rig.decode.bodies.length]
          const rejected = await post(rig.router.url, {rid: 'while-open', text: 'x'})
          expect(rejected.status).toBe(503)
          expect(JSON.parse(rejected.text)).toEqual({
            error: {
              type: 'service_unavailable',
              code: 'server_selection_failed',
              message: 'No available servers: No available prefill workers (all circuits open or unhealthy)',
            },
          })
          expect([rig.prefill.bodies.length, rig.decode.bodies.length]).toEqual(sentBefore)
          expect(rig.truth().find(t => t.rid === 'while-open' && t.event === 'answered')).toMatchObject({
            status: 503,
            room: null,
          })

          await sleep(1600) // past --cb-timeout-duration-secs: the next selection finds prefill's half-open
          expect((await post(rig.router.url, {rid: 'probe-1', text: 'x'})).status).toBe(200)
          page = await rig.metrics()
          expect(sample(page, 'smg_worker_cb_state', {worker: rig.prefill.url})).toBe(2)
          expect((await post(rig.router.url, {rid: 'probe-2', text: 'x'})).status).toBe(200)
          page = await rig.metrics()
          expect(sample(page, 'smg_worker_cb_state', {worker: rig.prefill.url})).toBe(0)
          expect(
            sample(page, 'smg_worker_cb_transitions_total', {from: 'open', to: 'half_open', worker: rig.prefill.url}),
          ).toBe(1)
          expect(
            sample(page, 'smg_worker_cb_transitions_total', {from: 'half_open', to: 'closed', worker: rig.prefill.url}),
          ).toBe(1)
          const breaker = rig
            .truth()
            .filter(t => t.event === 'breaker' && t.workerType === 'prefill')
            .map(t => `${t.from}>${t.to}`)
          expect(breaker).toEqual(['closed>open', 'open>half_open', 'half_open>closed'])
        },
      )
    },
  )

  it("--bug half-dispatch: with prefill's breaker open, the request goes to decode alone and waits there", async () => {
    await withRig(
      {retry: {disabled: true}, circuitBreaker: {failureThreshold: 2, timeoutDurationS: 60}, halfDispatch: true},
      async rig => {
        rig.prefill.behaviour = fails(500)
        for (let i = 0; i < 2; i++) expect((await post(rig.router.url, {rid: `f-${i}`, text: 'x'})).status).toBe(500)
        rig.decode.behaviour = (_b, _q, res) => json(res, 500, {error: {message: 'waited for KV'}}, 300)
        const prefillBefore = rig.prefill.bodies.length
        const decodeBefore = rig.decode.bodies.length
        const r = await post(rig.router.url, {rid: 'half', text: 'x'})
        expect(r.status).toBe(500)
        expect(r.ms).toBeGreaterThanOrEqual(280)
        expect(rig.prefill.bodies.length).toBe(prefillBefore)
        expect(rig.decode.bodies.length).toBe(decodeBefore + 1)
        expect(rig.truth().find(t => t.rid === 'half' && t.event === 'half-dispatch')).toBeDefined()
      },
    )
  })

  it(
    'with the defaults, two pinned requests (5 attempts each) open the breakers and the next healthy request ' +
      'gets 503',
    async () => {
      await withRig({}, async rig => {
        rig.prefill.behaviour = fails(500)
        for (const rid of ['pin-a', 'pin-b']) expect((await post(rig.router.url, {rid, text: 'x'})).status).toBe(500)
        expect(rig.prefill.bodies).toHaveLength(10)
        rig.prefill.behaviour = ok()
        const r = await post(rig.router.url, {rid: 'healthy', text: 'x'})
        expect(r.status).toBe(503)
        expect(JSON.parse(r.text).error.code).toBe('server_selection_failed')
        expect(rig.prefill.bodies).toHaveLength(10) // retried 5 times by selection, nothing sent
        const attempts = rig.truth().filter(t => t.rid === 'healthy' && t.event === 'attempt')
        expect(attempts.map(t => t.status)).toEqual([503, 503, 503, 503, 503])
      })
    },
  )

  it('reopens when the half-open probe fails', async () => {
    await withRig({retry: {disabled: true}, circuitBreaker: {failureThreshold: 2, timeoutDurationS: 1}}, async rig => {
      rig.prefill.behaviour = fails(500)
      for (let i = 0; i < 2; i++) await post(rig.router.url, {rid: `f-${i}`, text: 'x'})
      await sleep(1100)
      expect((await post(rig.router.url, {rid: 'probe', text: 'x'})).status).toBe(500)
      expect((await post(rig.router.url, {rid: 'after', text: 'x'})).status).toBe(503)
      const page = await rig.metrics()
      expect(
        sample(page, 'smg_worker_cb_transitions_total', {from: 'half_open', to: 'open', worker: rig.prefill.url}),
      ).toBe(1)
    })
  })

  it('--disable-circuit-breaker: failures never make a worker unavailable', async () => {
    await withRig({retry: {disabled: true}, circuitBreaker: {disabled: true}}, async rig => {
      rig.prefill.behaviour = fails(500)
      for (let i = 0; i < 15; i++) await post(rig.router.url, {rid: `f-${i}`, text: 'x'})
      rig.prefill.behaviour = ok()
      expect((await post(rig.router.url, {rid: 'still-served', text: 'x'})).status).toBe(200)
      const page = await rig.metrics()
      expect(sample(page, 'smg_worker_cb_state', {worker: rig.prefill.url})).toBe(0)
      expect(sample(page, 'smg_worker_cb_outcomes_total', {outcome: 'failure', worker: rig.prefill.url})).toBe(15)
    })
  })

  it('an unhealthy worker is unavailable too (503), as is_available() is health and breaker together', async () => {
    await withRig({retry: {disabled: true}}, async rig => {
      rig.decode.healthStatus = 503
      const until = Date.now() + 5000
      while (rig.router.ready() && Date.now() < until) await sleep(20)
      const r = await post(rig.router.url, {rid: 'no-decode', text: 'x'})
      expect(r.status).toBe(503)
      expect(JSON.parse(r.text).error.message).toBe(
        'No available servers: No available decode workers (all circuits open or unhealthy)',
      )
    })
  })
})
