import {describe, expect, it} from 'vitest'

import {checkAborts} from '../../src/checks/abort.js'
import {TimelineBuilder} from './synthetic.js'

const inflight = {queue: 'inflight' as const, kvPoll: 'Transferring' as const}
const HELD = {startMs: 46, endMs: 846}
const evictedAfter = (rid: string, s: number) =>
  `{"error":{"message":"Request ${rid} evicted by the disaggregation watchdog after ${s.toFixed(3)}s in the ` +
  `inflight queue (KVPoll.Transferring)"}}`
const transferFailed = (rid: string, why: string) =>
  `{"error":{"message":"Prefill transfer failed for request rank=0 req.rid='${rid}' req.bootstrap_room=7 with ` +
  `exception KVTransferError(bootstrap_room=7): ${why}"}}`

describe('abort trials counted from entry into prefill', () => {
  // Seen on an independent target: requests entered prefill about 1.03 s after pdchaos sent them, and their aborts
  // had been fired 0.63 s and 0.83 s after the send. Each abort arrived first and was dropped (an unknown rid); the
  // watchdog then evicted the request 2 s after its entry. Judged "abort lost" before; not landed now.
  it(
    'an abort fired before its request entered is "not landed", with the watchdog\'s count as evidence, ' +
      'never lost',
    () => {
      const rids = ['r0', 'r1']
      const b = new TimelineBuilder()
        .transferWindow(
          0,
          rids.map((rid, i) => ({rid, offsetMs: 630 + 200 * i})),
          HELD,
        )
        .filterMatched(5000, 300)
      for (const [i, rid] of rids.entries()) {
        b.pin(rid, 0, {ms: 1030 + 2050, status: 500, detail: evictedAfter(rid, 2.05)}, inflight).abort(
          rid,
          630 + 200 * i,
          'both',
        )
      }
      const {verdicts, trials} = checkAborts(b.end(6000).build())
      expect(verdicts.filter(v => v.verdict === 'fail')).toEqual([])
      const aborts = verdicts.filter(v => v.check === 'abort')
      expect(aborts.map(v => v.verdict)).toEqual(['unverified', 'unverified'])
      expect(aborts[0]!.summary).toMatch(/not landed: the abort arrived before the request entered prefill$/)
      expect(trials[0]).toMatchObject({
        outcome: 'not-landed',
        inWindow: false,
        releasedBy: {path: 'watchdog'},
        sides: ['decode', 'prefill'],
        entry: {shown: 'after', source: 'watchdog', atMs: 1030},
      })
      expect(trials[0]!.notInWindow).toMatch(
        /^not landed: it entered prefill after its abort \(the watchdog held it 2\.050 s, so it entered prefill's bootstrap queue by \+1030 ms/,
      )
    },
  )

  it('a pin nothing released, with nothing to show when it entered: unverified, naming what would show it', () => {
    const tl = new TimelineBuilder({scope: 'off', deadlineSeconds: 2, pollSeconds: 0.5})
      .pin('a1', 0, undefined, inflight)
      .abort('a1', 50)
      .end(8000)
      .build()
    const {
      verdicts: [v],
      trials: [t],
    } = checkAborts(tl)
    expect(v).toMatchObject({
      verdict: 'unverified',
      evidence: {outcome: 'entry-unknown', toVerify: expect.stringMatching(/v1\/loads/)},
    })
    expect(v!.summary).toMatch(
      /^abort not shown lost and the pin is still held .* not shown to have entered prefill before its abort$/,
    )
    expect(t!.entry).toMatchObject({shown: 'unknown', source: 'none'})
  })

  it('within the slowest entry measured at calibration, a lost abort is not counted', () => {
    const lags = {
      concurrency: 8,
      samples: 8,
      entry: {p50Ms: 400, maxMs: 1010, samples: 8},
      answer: {p50Ms: 2, maxMs: 4, includesEntry: false},
      notes: [],
    }
    const tl = new TimelineBuilder(
      {scope: 'off', deadlineSeconds: 2, pollSeconds: 0.5},
      {prefillMs: 40, prefillSpreadMs: 6, observeMs: 3, samples: 20, lags},
    )
      .pin('a1', 0, undefined, inflight)
      .abort('a1', 630)
      .end(8000)
      .build()
    expect(checkAborts(tl).trials[0]).toMatchObject({
      verdict: 'unverified',
      outcome: 'entry-unknown',
      entry: {
        shown: 'unknown',
        evidence: expect.stringMatching(/within the slowest entry measured at calibration \(1010 ms\)/),
      },
    })
  })
})

describe('abort trials judged per side', () => {
  const window = (b: TimelineBuilder) =>
    b.transferWindow(0, [{rid: 'a1', offsetMs: 100}], HELD).filterMatched(3000, 300)

  it("records which path released each trial: prefill's own abort, or decode's ABORT reaching prefill", () => {
    const own = checkAborts(
      window(new TimelineBuilder())
        .pin('a1', 0, {ms: 130, status: 500, detail: transferFailed('a1', 'Aborted by AbortReq.')}, inflight)
        .abort('a1', 100, 'both')
        .build(),
    )
    expect(own.trials[0]).toMatchObject({
      verdict: 'pass',
      outcome: 'honoured',
      releasedBy: {path: 'prefill-abort'},
      entry: {shown: 'before', source: 'answer'},
    })
    expect(own.verdicts[0]!.summary).toMatch(/by prefill's own abort/)
    const byDecode = checkAborts(
      window(new TimelineBuilder())
        .pin(
          'a1',
          0,
          {ms: 130, status: 500, detail: transferFailed('a1', 'Request 7 was aborted by decode.')},
          inflight,
        )
        .abort('a1', 100, 'both')
        .build(),
    )
    expect(byDecode.trials[0]).toMatchObject({verdict: 'pass', releasedBy: {path: 'decode-abort'}})
    expect(byDecode.verdicts[0]!.summary).toMatch(/by decode's ABORT reaching prefill over ZMQ/)
  })

  it(
    "an abort sent to prefill alone that decode's ABORT released is no proof of prefill's own path: " + 'unverified',
    () => {
      const r = checkAborts(
        window(new TimelineBuilder())
          .pin(
            'a1',
            0,
            {ms: 130, status: 500, detail: transferFailed('a1', 'Request 7 was aborted by decode.')},
            inflight,
          )
          .abort('a1', 100, 'prefill')
          .build(),
      )
      expect(r.trials[0]).toMatchObject({
        verdict: 'unverified',
        outcome: 'rescued-by-decode',
        sides: ['prefill'],
        releasedBy: {path: 'decode-abort'},
      })
    },
  )

  it(
    'a prefill that ignores its own abort while Transferring fails the prefill-only trial, the watchdog ' +
      'releasing it',
    () => {
      const r = checkAborts(
        window(new TimelineBuilder())
          .pin('a1', 0, {ms: 2110, status: 500, detail: evictedAfter('a1', 2.09)}, inflight)
          .abort('a1', 100, 'prefill')
          .build(),
      )
      expect(r.verdicts.map(v => `${v.check} ${v.verdict}`)).toEqual(['abort fail', 'eviction pass'])
      expect(r.trials[0]).toMatchObject({
        outcome: 'lost-then-evicted',
        releasedBy: {path: 'watchdog'},
        entry: {shown: 'before', source: 'watchdog'},
      })
    },
  )
})
