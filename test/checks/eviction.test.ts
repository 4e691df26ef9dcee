import {describe, expect, it} from 'vitest'

import {checkEvictions} from '../../src/checks/eviction.js'
import {checkScope} from '../../src/checks/scope.js'
import {TimelineBuilder, TIMEOUTS_READ} from './synthetic.js'

// Deadline 2 s, poll 0.5 s, observation p99 3 ms: the window for a bootstrap-queue pin is [1.995 s, 2.511 s] after
// send.
describe('eviction oracle', () => {
  it('passes a pin evicted inside [deadline - ε, deadline + poll + ε], and prints its bounds and ε', () => {
    const {pins, verdicts} = checkEvictions(
      new TimelineBuilder()
        .fault(0, 3000)
        .pin('p1', 100, {ms: 100 + 2300, status: 500})
        .build(),
      TIMEOUTS_READ,
    )
    expect(verdicts[0].verdict).toBe('pass')
    expect(pins[0]).toMatchObject({rid: 'p1', evictionSeconds: 2.3, verdict: 'pass'})
    expect(pins[0].bounds[0]).toBeCloseTo(1.995, 3)
    expect(pins[0].bounds[1]).toBeCloseTo(2.511, 3)
    expect(pins[0].evidence).toMatchObject({clock: "the request's own answer", epsilonMs: {low: 5, high: 11}})
    expect(String(pins[0].evidence.epsilonWhy)).toMatch(/observation delay p99 3\.0 ms/)
  })

  it('fails an eviction before the deadline as a false timeout (the early-evict defect)', () => {
    const {verdicts} = checkEvictions(
      new TimelineBuilder().fault(0, 3000).pin('p1', 0, {ms: 1000, status: 500}).build(),
      TIMEOUTS_READ,
    )
    expect(verdicts[0]).toMatchObject({verdict: 'fail', check: 'eviction'})
    expect(verdicts[0].summary).toMatch(/evicted early: after 1\.000s/)
  })

  it('fails an eviction two polls late (the late-evict defect) but not one just inside the bound', () => {
    const late = checkEvictions(
      new TimelineBuilder().fault(0, 4000).pin('p1', 0, {ms: 3000, status: 500}).build(),
      TIMEOUTS_READ,
    )
    expect(late.verdicts[0].summary).toMatch(/evicted late: after 3\.000s/)
    const edge = checkEvictions(
      new TimelineBuilder().fault(0, 4000).pin('p2', 0, {ms: 2509, status: 500}).build(),
      TIMEOUTS_READ,
    )
    expect(edge.verdicts[0].verdict).toBe('pass')
  })

  it(
    'a busy host widens ε by the delay measured while the pins were out; an ε a whole poll wide leaves the window ' +
      'unresolved (unverified), not passed',
    () => {
      const busy = (loadedObserveMs: number, ms: number) => {
        const tl = new TimelineBuilder().fault(0, 4000).pin('p1', 0, {ms, status: 500}).build()
        return checkEvictions({...tl, calibration: {...tl.calibration, loadedObserveMs}}, TIMEOUTS_READ)
      }
      // 60 ms under load: ε high = 5 + 2 × 60 = 125 ms; 2.6 s is inside, and a pass (ε is well under the 500 ms poll).
      const loaded = busy(60, 2600)
      expect(loaded.verdicts[0]).toMatchObject({verdict: 'pass'})
      expect(loaded.pins[0]!.evidence).toMatchObject({epsilonMs: {low: 5, high: 125}})
      expect(String(loaded.pins[0]!.evidence.epsilonWhy)).toMatch(/60\.0 ms while the pins were out \(3\.0 ms idle/)
      // 250 ms: ε high = 505 ms, a whole poll: the window cannot be resolved, so what lands inside it is unverified.
      for (const ms of [2600, 2100]) {
        const starved = busy(250, ms)
        expect(starved.verdicts[0]).toMatchObject({
          verdict: 'unverified',
          summary: expect.stringMatching(/only because ε is a whole poll wide \(505 ms\)/),
        })
        expect(starved.verdicts[0]!.evidence).toMatchObject({
          why: expect.stringMatching(/one poll late cannot be told/),
          toVerify: expect.stringMatching(/less loaded/),
        })
      }
      // Clearly early is still early.
      expect(busy(250, 1000).verdicts[0]).toMatchObject({
        verdict: 'fail',
        summary: expect.stringMatching(/evicted early/),
      })
      // And past ε it is late.
      expect(busy(250, 3100).verdicts[0]).toMatchObject({
        verdict: 'fail',
        summary: expect.stringMatching(/evicted late/),
      })
    },
  )

  it(
    "a pin's ε uses the probes around its own send and answer: a hiccup elsewhere in the window widens " + "nobody's",
    () => {
      const tl = new TimelineBuilder()
        .fault(0, 6000)
        .pin('p1', 0, {ms: 2600, status: 500})
        .pin('p2', 3000, {ms: 5400, status: 500})
        .build()
      const t0 = tl.observations[0]!.t
      // Probes every 100 ms, 4 ms each, except a 300 ms stall that ended at 2550 ms, just before p1's answer.
      for (let at = 100; at < 6000; at += 100)
        tl.observations.push({kind: 'hop', t: t0 + at, ms: at === 2500 ? 300 : 4})
      const {pins} = checkEvictions(tl, TIMEOUTS_READ)
      // p1: slowest probe near it 300 ms → ε high = 5 + 2 × 300 = 605 ms, a whole poll: unverified, not late.
      expect(pins[0]).toMatchObject({rid: 'p1', verdict: 'unverified', evidence: {epsilonMs: {high: 605}}})
      expect(String(pins[0]!.evidence.epsilonWhy)).toMatch(
        /300\.0 ms, the slowest of \d+ probe\(s\) around this request's send and answer/,
      )
      // p2 (sent 3 s, answered 5.4 s): its probes took 4 ms → ε high = 5 + 2 × 4 = 13 ms, and it passes.
      expect(pins[1]).toMatchObject({rid: 'p2', verdict: 'pass', evidence: {epsilonMs: {high: 13}}})
    },
  )

  it('fails a pin never evicted, naming the queue and KVPoll state it was left in and the deployment signals', () => {
    const {verdicts, pins} = checkEvictions(
      new TimelineBuilder()
        .fault(0, 6000)
        .pin('p1', 0, undefined, {queue: 'inflight', kvPoll: 'Transferring'})
        .metric('prefill', 'sglang:num_prefill_inflight_queue_reqs', 5000, 1)
        .end(6000)
        .build(),
      TIMEOUTS_READ,
    )
    expect(verdicts[0].summary).toMatch(
      /never evicted: still held after 6\.000s .* in the inflight queue \(Transferring\)/,
    )
    expect(pins[0]).toMatchObject({evictedAt: null, evictionSeconds: null, verdict: 'fail'})
    expect(pins[0].evidence.deploymentSignals).toEqual({'sglang:num_prefill_inflight_queue_reqs': 1})
  })

  it('fails a pin that completed: the fault did not hold it', () => {
    const {verdicts} = checkEvictions(
      new TimelineBuilder().fault(0, 3000).pin('p1', 0, {ms: 80, status: 200}).build(),
      TIMEOUTS_READ,
    )
    expect(verdicts[0]).toMatchObject({check: 'fault-effect', verdict: 'fail'})
  })

  it('counts an inflight-scope window from send + the calibrated prefill time, with its spread in ε', () => {
    const b = new TimelineBuilder({scope: 'inflight', deadlineSeconds: 2, pollSeconds: 0.5})
    const inflight = {queue: 'inflight' as const, kvPoll: 'Transferring' as const}
    // Entry = send + 40 ms; an eviction at 2.030 s after send is 10 ms before the deadline, beyond ε on that side.
    const early = checkEvictions(
      b.fault(0, 5000).pin('p1', 0, {ms: 2030, status: 500}, inflight).build(),
      TIMEOUTS_READ,
    )
    expect(early.verdicts[0].summary).toMatch(/evicted early/)
    const ok = checkEvictions(
      new TimelineBuilder({scope: 'inflight', deadlineSeconds: 2, pollSeconds: 0.5})
        .fault(0, 5000)
        .pin('p1', 0, {ms: 2300, status: 500}, inflight)
        .build(),
      TIMEOUTS_READ,
    )
    expect(ok.verdicts[0].verdict).toBe('pass')
    expect(String(ok.pins[0].evidence.entry)).toMatch(/send \+ 40 ms/)
  })
})

describe('scope check', () => {
  it('reports a bootstrap-queue pin under an inflight-only watchdog as out of scope', () => {
    const v = checkScope(
      new TimelineBuilder({scope: 'inflight', deadlineSeconds: 2, pollSeconds: 0.5}).pin('p1', 0).build(),
    )
    expect(v).toHaveLength(1)
    expect(v[0].summary).toMatch(/outside the watchdog's scope: held in the bootstrap queue \(Bootstrapping\)/)
  })

  it(
    'says nothing for an inflight pin under an inflight watchdog, and fails every pin when the watchdog ' + 'is off',
    () => {
      expect(
        checkScope(
          new TimelineBuilder({scope: 'inflight', deadlineSeconds: 2, pollSeconds: 0.5})
            .pin('p1', 0, undefined, {queue: 'inflight', kvPoll: 'Transferring'})
            .build(),
        ),
      ).toEqual([])
      const off = checkScope(
        new TimelineBuilder({scope: 'off', deadlineSeconds: 2, pollSeconds: 0.5}).pin('p1', 0).pin('p2', 5).build(),
      )
      expect(off.map(v => v.verdict)).toEqual(['fail', 'fail'])
    },
  )
})
