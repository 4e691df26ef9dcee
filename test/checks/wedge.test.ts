import {describe, expect, it} from 'vitest'

import type {WedgeExpectation} from '../../src/checks/expectation.js'
import {checkWedge, WATCHDOG_NOT_JUDGED} from '../../src/checks/wedge.js'
import {TimelineBuilder} from './synthetic.js'

/** The twin-like bound: a 3 s health-check timeout -> red within 3 + 2 × 1 + 0.25 = 5.25 s. */
const SHORT: WedgeExpectation = {
  kind: 'wedge',
  service: 'prefill',
  healthTimeoutSeconds: 3,
  healthTimeoutSource: 'SGLANG_HEALTH_CHECK_TIMEOUT=3',
  detectWithinSeconds: 5.25,
  resumeWithinSeconds: 5.25,
  probePath: '/health',
  sampleIntervalMs: 250,
  holdSeconds: 9,
  why: 'test',
}

/** Wedged at 1 s, SIGCONT at `revertMs`; the prefill's health as a sampler one probe at a time would see it. */
function timeline(revertMs: number) {
  return new TimelineBuilder().fault(1000, revertMs).health('prefill', 500, true).health('decode', 500, true)
}

describe('checkWedge: detection and resumption of a wedged instance, never the watchdog', () => {
  it("SGLang's default bound (20 s health check): red after 21 s passes; ok again 2 s after SIGCONT passes", () => {
    const tl = timeline(31_000)
      .health('prefill', 2100, true, 200, 1000) // the probe in flight at the wedge saw an output from before it
      .health('prefill', 22_000, false, 503, 19_900) // the next one waited out the 20 s health-check timeout
      .health('decode', 10_000, true)
      .health('decode', 20_000, true)
      .health('prefill', 32_100, true, 200, 10_000) // in flight at SIGCONT: the resumed scheduler answered it
      .health('prefill', 33_200, true, 200, 1000)
      .end(34_000)
      .build()
    const v = checkWedge(tl)
    expect(v.map(x => [x.check, x.subject, x.verdict])).toEqual([
      ['fault-effect', 'prefill health: detection', 'pass'],
      ['recovery', 'prefill health: resumption', 'pass'],
    ])
    expect(v[0]!.summary).toMatch(
      /detected: prefill \/health went red 21\.000s after the wedge \(503 after 19900 ms; bound 22\.25 s\); the watchdog is not judged/,
    )
    expect(v[0]!.evidence).toMatchObject({
      watchdog: WATCHDOG_NOT_JUDGED,
      detectedAfterSeconds: 21,
      boundSeconds: 22.25,
      otherService: 'decode',
      otherSamples: 2,
      otherRed: 0,
    })
    expect(v[1]!.summary).toMatch(/resumed: prefill \/health ok 1\.100s after SIGCONT and stayed ok/)
    expect(WATCHDOG_NOT_JUDGED).toBe(
      'a wedged instance cannot run its watchdog: this experiment judges detection and recovery only',
    )
  })

  it(
    "the bound comes from the plan's expectation (a 3 s health check): red after 4 s passes, after 7 s " + 'is late',
    () => {
      const ok = checkWedge(
        timeline(12_000)
          .health('prefill', 5000, false, 503, 3000)
          .health('prefill', 13_100, true, 200, 1000)
          .end(14_000)
          .build(),
        SHORT,
      )
      expect(ok.map(x => x.verdict)).toEqual(['pass', 'pass'])
      expect(ok[0]!.evidence).toMatchObject({
        healthTimeoutSeconds: 3,
        healthTimeoutSource: 'SGLANG_HEALTH_CHECK_TIMEOUT=3',
        boundSeconds: 5.25,
      })
      const late = checkWedge(
        timeline(12_000)
          .health('prefill', 4000, true)
          .health('prefill', 8000, false, 503, 3000)
          .health('prefill', 13_100, true)
          .end(14_000)
          .build(),
        SHORT,
      )
      expect(late[0]).toMatchObject({
        verdict: 'fail',
        summary: expect.stringMatching(
          /detected late: prefill \/health went red only 7\.000s after the wedge \(bound 5\.25 s\)/,
        ),
      })
    },
  )

  it('never detected: health stayed ok for the whole hold, longer than the bound', () => {
    const tl = timeline(12_000)
      .health('prefill', 3000, true)
      .health('prefill', 6000, true)
      .health('prefill', 9000, true)
      .health('prefill', 11_900, true)
      .health('prefill', 13_000, true)
      .end(14_000)
      .build()
    const v = checkWedge(tl, SHORT)
    expect(v[0]).toMatchObject({check: 'fault-effect', subject: 'prefill health: detection', verdict: 'fail'})
    expect(v[0]!.summary).toMatch(
      /never detected: prefill \/health stayed ok for the 11\.000s the wedge was held \(bound 5\.25 s\)/,
    )
    // Without the plan's expectation nothing went red, so the wedged side is unknown: still a failure.
    expect(checkWedge(tl)[0]!.summary).toMatch(
      /^never detected: prefill \/health stayed ok for the 11\.000s the wedge was held$/,
    )
  })

  it('never resumed: still red long after SIGCONT', () => {
    const tl = timeline(9000)
      .health('prefill', 5000, false, 503, 3000)
      .health('prefill', 12_100, false, 503, 3000)
      .health('prefill', 15_200, false, null, 3000)
      .end(16_000)
      .build()
    const v = checkWedge(tl, SHORT)
    expect(v[0]!.verdict).toBe('pass')
    expect(v[1]).toMatchObject({check: 'recovery', subject: 'prefill health: resumption', verdict: 'fail'})
    expect(v[1]!.summary).toMatch(
      /never resumed: prefill \/health still red 7\.000s after SIGCONT \(bound 5\.25 s; last: no answer after 3000 ms\)/,
    )
  })

  it('red again after a first ok: resumption counts from the last recovery', () => {
    const tl = timeline(9000)
      .health('prefill', 5000, false)
      .health('prefill', 9500, true)
      .health('prefill', 10_000, false)
      .health('prefill', 13_500, true)
      .health('prefill', 14_000, true)
      .end(14_500)
      .build()
    const v = checkWedge(tl, SHORT)
    expect(v[1]).toMatchObject({
      verdict: 'pass',
      evidence: expect.objectContaining({resumedAfterSeconds: 4.5, redAfterRevert: 1}),
    })
  })

  it(
    'unverified, saying why: no sample while held, a hold shorter than the bound, already unhealthy, sampling ' +
      'stopped too soon, no revert, no wedge',
    () => {
      expect(checkWedge(new TimelineBuilder().fault(1000, 9000).end(10_000).build(), SHORT)[0]).toMatchObject({
        verdict: 'unverified',
        evidence: expect.objectContaining({toVerify: expect.stringContaining('every 250 ms')}),
      })
      const short = checkWedge(
        timeline(4000)
          .health('prefill', 2000, true)
          .health('prefill', 3900, true)
          .health('prefill', 4100, true)
          .end(5000)
          .build(),
        SHORT,
      )
      expect(short[0]).toMatchObject({
        verdict: 'unverified',
        summary: expect.stringMatching(/the wedge was held only 3\.000s, less than the detection bound 5\.25 s/),
        evidence: expect.objectContaining({toVerify: 'hold the wedge at least 9 s'}),
      })
      const sick = new TimelineBuilder()
        .fault(1000, 9000)
        .health('prefill', 800, false)
        .health('prefill', 5000, false)
        .health('prefill', 10_000, true)
        .end(10_500)
        .build()
      expect(checkWedge(sick, SHORT)[0]).toMatchObject({
        verdict: 'unverified',
        summary: expect.stringMatching(/already unhealthy before the wedge/),
      })
      const stopped = checkWedge(
        timeline(9000).health('prefill', 5000, false).health('prefill', 10_000, false).end(11_000).build(),
        SHORT,
      )
      expect(stopped[1]).toMatchObject({
        verdict: 'unverified',
        summary: expect.stringMatching(/still red when sampling stopped 2\.000s after SIGCONT/),
      })
      const b = new TimelineBuilder()
      b.observations.push({
        kind: 'fault-injected',
        t: b.at(1000),
        fault: 'wedge-rank',
        leaseId: 'W',
        verified: true,
        evidence: 'state T',
      })
      const unreverted = checkWedge(b.health('prefill', 5000, false).end(8000).build(), SHORT)
      expect(unreverted[1]).toMatchObject({
        verdict: 'unverified',
        summary: 'the wedge was not reverted: resumption unverified',
      })
      expect(checkWedge(new TimelineBuilder().health('prefill', 10, true).build())[0]).toMatchObject({
        verdict: 'unverified',
        summary: 'no wedge was injected: nothing to judge',
      })
    },
  )

  it("a decode wedge judges decode; prefill's health is reported beside it, not judged", () => {
    const tl = new TimelineBuilder()
      .fault(1000, 9000)
      .health('decode', 5000, false, 503, 3000)
      .health('prefill', 5000, true)
      .health('decode', 10_100, true)
      .end(11_000)
      .build()
    const v = checkWedge(tl, {...SHORT, service: 'decode'})
    expect(v.map(x => [x.subject, x.verdict])).toEqual([
      ['decode health: detection', 'pass'],
      ['decode health: resumption', 'pass'],
    ])
    expect(v[0]!.evidence).toMatchObject({otherService: 'prefill', otherRed: 0})
    // Without the expectation the red side is found from the samples.
    expect(checkWedge(tl).map(x => x.subject)).toEqual(['decode health: detection', 'decode health: resumption'])
  })
})
