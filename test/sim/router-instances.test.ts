import {mkdtempSync, readFileSync, rmSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {afterEach, describe, expect, it} from 'vitest'

import {type RouterOptions, type RunningRouter, startRouter} from '../../src/sim/router/router.js'
import {makePolicy} from '../../src/sim/router/policy.js'
import {closeWorker, fails, fakeWorker, type FakeWorker, ok, post, sample, until} from './router-fakes.js'

/**
 * The twin's gateway in front of several prefill and decode instances (sgl-model-gateway's PD mode with repeated
 * --prefill and --decode): each role picked by its policy among its available workers, the chosen prefill's own
 * bootstrap address in the body, the outcome on the chosen pair's breakers only.
 */

interface Rig {
  prefill: FakeWorker[]
  decode: FakeWorker[]
  router: RunningRouter
  truth(): Array<Record<string, unknown>>
}
const open: Array<() => Promise<void>> = []
afterEach(async () => {
  for (const close of open.splice(0)) await close()
})

async function rig(prefills: number, decodes: number, extra: Partial<RouterOptions> = {}): Promise<Rig> {
  const dir = mkdtempSync(join(tmpdir(), 'pdc-router-n-'))
  const prefill = await Promise.all(Array.from({length: prefills}, () => fakeWorker(ok())))
  const decode = await Promise.all(Array.from({length: decodes}, () => fakeWorker(ok())))
  const truthFile = join(dir, 'truth.jsonl')
  const router = await startRouter({
    host: '127.0.0.1',
    port: 0,
    metricsPort: 0,
    prefill: prefill.map((w, i) => ({url: w.url, bootstrapPort: 9000 + i})),
    decode: decode.map(w => w.url),
    health: {intervalS: 0.1, timeoutS: 0.5},
    truthFile,
    ...extra,
  })
  open.push(async () => {
    await router.close()
    for (const w of [...prefill, ...decode]) closeWorker(w)
    rmSync(dir, {recursive: true, force: true})
  })
  await until(() => router.ready())
  const truth = () =>
    readFileSync(truthFile, 'utf8')
      .trim()
      .split('\n')
      .filter(Boolean)
      .map(l => JSON.parse(l) as Record<string, unknown>)
  return {prefill, decode, router, truth}
}

const body = (rid: string, text = 'the same prompt every time') => ({rid, text, sampling_params: {max_new_tokens: 1}})

describe('the twin router with several instances of a role', () => {
  it(
    "round_robin: spreads prefill and decode independently, each body carrying its own prefill's " + 'bootstrap port',
    async () => {
      const r = await rig(2, 2, {policy: {prefill: 'round_robin', decode: 'round_robin'}})
      for (let i = 0; i < 4; i++) expect((await post(r.router.url, body(`rr-${i}`))).status).toBe(200)
      expect(r.prefill.map(w => w.bodies.length)).toEqual([2, 2])
      expect(r.decode.map(w => w.bodies.length)).toEqual([2, 2])
      // Each prefill instance's body names that instance's bootstrap port; decode gets the same body as its prefill.
      for (const [i, w] of r.prefill.entries())
        for (const b of w.bodies) expect(JSON.parse(b).bootstrap_port).toBe(9000 + i)
      const sent = r.truth().filter(e => e.event === 'sent')
      expect(new Set(sent.map(e => e.prefill))).toEqual(new Set(r.prefill.map(w => w.url)))
    },
  )

  it(
    'cache_aware (the default): one prompt keeps to the instance that served it; the readiness needs one worker ' +
      'of each role',
    async () => {
      const r = await rig(2, 1)
      for (let i = 0; i < 5; i++) expect((await post(r.router.url, body(`ca-${i}`))).status).toBe(200)
      expect(r.prefill.map(w => w.bodies.length).sort()).toEqual([0, 5])
      // One prefill instance down: still ready (pd_router.rs readiness), and its requests go to the other.
      const served = r.prefill.find(w => w.bodies.length === 5)!
      served.healthStatus = 503
      await until(
        async () =>
          sample(await fetch(r.router.metricsUrl).then(x => x.text()), 'smg_worker_health', {worker: served.url}) === 0,
      )
      expect(r.router.ready()).toBe(true)
      expect((await post(r.router.url, body('ca-after'))).status).toBe(200)
      expect(r.prefill.find(w => w !== served)!.bodies.length).toBe(1)
    },
  )

  it(
    "a failing prefill opens only its own breaker: the pair's outcome is not charged to the other " + 'instance',
    async () => {
      const r = await rig(2, 1, {
        policy: {prefill: 'round_robin', decode: 'round_robin'},
        retry: {disabled: true},
        circuitBreaker: {failureThreshold: 2, timeoutDurationS: 60},
      })
      r.prefill[0]!.behaviour = fails(500)
      const statuses = []
      for (let i = 0; i < 6; i++) statuses.push((await post(r.router.url, body(`cb-${i}`))).status)
      const page = await fetch(r.router.metricsUrl).then(x => x.text())
      expect(sample(page, 'smg_worker_cb_state', {worker: r.prefill[0]!.url})).toBe(1)
      expect(sample(page, 'smg_worker_cb_state', {worker: r.prefill[1]!.url})).toBe(0)
      // Once the failing instance's breaker is open, every request goes to the other and succeeds.
      expect(statuses.slice(-2)).toEqual([200, 200])
      expect(r.prefill[0]!.bodies.length).toBe(2)
    },
  )
})

describe('policies', () => {
  it('round_robin cycles over the workers available at each call; random stays in range', () => {
    const rr = makePolicy('round_robin')
    const w = [
      {url: 'a', load: 0},
      {url: 'b', load: 0},
      {url: 'c', load: 0},
    ]
    expect([0, 1, 2, 3].map(() => rr.select(w, ''))).toEqual([0, 1, 2, 0])
    const random = makePolicy('random', () => 0.999)
    expect(random.select(w, '')).toBe(2)
  })

  it(
    'cache_aware: the longest shared prefix above the threshold, else the least loaded; the shortest queue when ' +
      'imbalanced',
    () => {
      const ca = makePolicy('cache_aware')
      const w = [
        {url: 'a', load: 0},
        {url: 'b', load: 0},
      ]
      expect(ca.select(w, 'system prompt one: question 1')).toBe(0)
      // Nothing shared and b less loaded: b.
      expect(
        ca.select(
          [
            {url: 'a', load: 3},
            {url: 'b', load: 0},
          ],
          'another conversation entirely',
        ),
      ).toBe(1)
      // Shares most of a's text: a, though a is busier (balanced by the thresholds: 3 - 0 is not over 64).
      expect(
        ca.select(
          [
            {url: 'a', load: 3},
            {url: 'b', load: 0},
          ],
          'system prompt one: question 2',
        ),
      ).toBe(0)
      // Imbalanced (over 64 apart and over 1.5x): the shortest queue, whatever the match.
      expect(
        ca.select(
          [
            {url: 'a', load: 200},
            {url: 'b', load: 10},
          ],
          'system prompt one: question 3',
        ),
      ).toBe(1)
    },
  )
})
