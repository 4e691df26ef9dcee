import {describe, expect, it} from 'vitest'

import {EPSILON_FLOOR_MS, edgeOf, epsilonFor} from '../../src/checks/epsilon.js'
import {checkEvictions} from '../../src/checks/eviction.js'
import {bootstrapQueued} from '../../src/experiment/lag-probes.js'
import type {MeasuredLags} from '../../src/model/lags.js'
import {TimelineBuilder, TIMEOUTS_READ} from './synthetic.js'

// deadline 2 s, poll 1 s: a window [2000, 3000] ms after the send, widened by ε.
const CONTRACT = {scope: 'all' as const, deadlineSeconds: 2, pollSeconds: 1}
const LAGS: MeasuredLags = {
  concurrency: 20,
  samples: 20,
  entry: {p50Ms: 50, maxMs: 100, samples: 20},
  answer: {p50Ms: 150, maxMs: 250, includesEntry: false},
  notes: [],
}
const calibration = (lags?: MeasuredLags) => ({
  prefillMs: 40,
  prefillSpreadMs: 6,
  observeMs: 3,
  samples: 8,
  ...(lags ? {lags} : {}),
})

describe('ε widened by the measured lags', () => {
  it('the late side allows the slowest entry plus the slowest answer lag, and says so', () => {
    const tl = new TimelineBuilder(CONTRACT, calibration(LAGS)).build()
    const e = epsilonFor(tl, 'bootstrap')
    expect(e.lowMs).toBe(EPSILON_FLOOR_MS)
    expect(e.highMs).toBe(EPSILON_FLOOR_MS + 100 + 250)
    expect(e.why).toMatch(/widened by the measured lags, 350\.0 ms/)
    expect(e.why).toMatch(
      /entry lag .* max 100\.0 ms; answer lag .* max 250\.0 ms; over 20 held request\(s\), 20 out at once/,
    )
  })

  it('without measured lags: the observation delay twice, as before', () => {
    const e = epsilonFor(new TimelineBuilder(CONTRACT, calibration()).build(), 'bootstrap')
    expect(e.highMs).toBe(EPSILON_FLOOR_MS + 2 * 3)
    expect(e.why).not.toMatch(/lag/)
  })

  it('lags smaller than the observation delay twice: the larger wins', () => {
    const small: MeasuredLags = {
      ...LAGS,
      entry: {p50Ms: 0.5, maxMs: 1, samples: 20},
      answer: {p50Ms: 1, maxMs: 2, includesEntry: false},
    }
    const e = epsilonFor(new TimelineBuilder(CONTRACT, calibration(small)).build(), 'bootstrap')
    expect(e.highMs).toBe(EPSILON_FLOOR_MS + 6)
    expect(e.why).toMatch(/counted twice \(more than the measured lags, 3\.0 ms/)
  })

  it('a moment busier than calibration (probes near the pin) adds its excess (a probe is two round trips)', () => {
    const b = new TimelineBuilder(CONTRACT, calibration(LAGS)).pin('p1', 0)
    b.observations.push({kind: 'hop', t: b.at(40), ms: 23})
    const e = epsilonFor(b.build(), 'bootstrap', {sentAt: b.at(0)})
    expect(e.highMs).toBe(EPSILON_FLOOR_MS + 350 + 20)
    expect(e.why).toMatch(/plus the 20\.0 ms by which the observation delay around this pin exceeded idle/)
  })

  it('scope inflight: the early side allows the median lags the calibrated prefill time carries', () => {
    const tl = new TimelineBuilder({...CONTRACT, scope: 'inflight'}, calibration(LAGS)).build()
    const e = epsilonFor(tl, 'inflight')
    expect(e.lowMs).toBe(EPSILON_FLOOR_MS + 3 + 50 + 150)
    expect(e.highMs).toBe(EPSILON_FLOOR_MS + 350 + 3)
  })
})

describe('evictions judged with measured lags, and at the edge', () => {
  const judge = (answerMs: number, lags?: MeasuredLags) => {
    const tl = new TimelineBuilder(CONTRACT, calibration(lags))
      .pin('p1', 0, {ms: answerMs, status: 500, detail: 'evicted by the disaggregation watchdog'})
      .build()
    return checkEvictions(tl, TIMEOUTS_READ)
  }

  it('a punctual eviction answered 300 ms late passes with the lags (at the edge), and fails late without them', () => {
    const withLags = judge(3300, LAGS)
    expect(withLags.verdicts[0]).toMatchObject({
      verdict: 'pass',
      summary: expect.stringMatching(/inside .*\(at the edge\)$/),
    })
    expect(withLags.pins[0]!.atEdge).toEqual({bound: 'high', marginMs: 55})
    expect(withLags.verdicts[0]!.evidence.atEdge).toMatchObject({
      bound: 'high',
      note: expect.stringMatching(/55 ms inside the window's close, within ε \(355 ms\)/),
    })
    expect(withLags.verdicts[0]!.evidence.epsilonWhy).toMatch(/measured lags/)
    const without = judge(3300)
    expect(without.verdicts[0]).toMatchObject({verdict: 'fail', summary: expect.stringMatching(/^evicted late/)})
  })

  it('just after the window opens: an early eviction could hide behind the lags, so it is at the edge', () => {
    const r = judge(2100, LAGS)
    expect(r.verdicts[0]!.verdict).toBe('pass')
    expect(r.pins[0]!.atEdge).toEqual({bound: 'low', marginMs: 105})
  })

  it('well inside the window: no edge, no mark', () => {
    const r = judge(2600, LAGS)
    expect(r.verdicts[0]!.verdict).toBe('pass')
    expect(r.pins[0]!.atEdge).toBeUndefined()
    expect(r.verdicts[0]!.summary).not.toMatch(/edge/)
  })

  it('late by less than ε past the bound: still a failure, marked at the edge; far past it: no mark', () => {
    const near = judge(3500, LAGS)
    expect(near.verdicts[0]!.verdict).toBe('fail')
    expect(near.pins[0]!.atEdge).toEqual({bound: 'high', marginMs: -145})
    const far = judge(4000, LAGS)
    expect(far.verdicts[0]!.verdict).toBe('fail')
    expect(far.pins[0]!.atEdge).toBeUndefined()
  })

  it('edgeOf picks the nearer bound when the window is narrower than ε', () => {
    const eps = {lowMs: 5, highMs: 400, entryOffsetMs: 0, why: ''}
    expect(edgeOf(1100, 1000, 1300, eps)?.bound).toBe('low')
    expect(edgeOf(1250, 1000, 1300, eps)?.bound).toBe('high')
  })
})

describe('lag probes: the queue count they read', () => {
  it('sums prefill_bootstrap_queue_reqs over DP ranks; undefined without a disagg section', () => {
    expect(
      bootstrapQueued({
        loads: [
          {dp_rank: 0, disagg: {prefill_bootstrap_queue_reqs: 3}},
          {dp_rank: 1, disagg: {prefill_bootstrap_queue_reqs: 2}},
        ],
      }),
    ).toBe(5)
    expect(bootstrapQueued({loads: [{dp_rank: 0, num_running_reqs: 0}]})).toBeUndefined()
    expect(bootstrapQueued('not json')).toBeUndefined()
  })
})
