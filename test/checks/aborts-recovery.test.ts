import {describe, expect, it} from 'vitest'

import {checkAborts} from '../../src/checks/abort.js'
import {checkCollateral} from '../../src/checks/collateral.js'
import {checkRecovery} from '../../src/checks/recovery.js'
import {LOADS_PREFILL_INFLIGHT_QUEUE} from '../../src/engines/sglang/sglang-metrics.js'
import type {MeasuredLags} from '../../src/model/lags.js'
import {TimelineBuilder} from './synthetic.js'

const inflight = {queue: 'inflight' as const, kvPoll: 'Transferring' as const}
/**
 * SGLang prefill's answer for a request aborted in its inflight queue (prefill.py handle_inflight_transfer_failure).
 */
const abortedInTransfer = (rid: string) =>
  `{"error":{"message":"Prefill transfer failed for request rank=0 req.rid='${rid}' req.bootstrap_room=7 with ` +
  `exception KVTransferError(bootstrap_room=7): Aborted by AbortReq."}}`
/**
 * The default builder's contract and calibration, widened: the sweep runs from 46 ms (prefill 40 + spread 6) for 800
 * ms.
 */
const HELD = {startMs: 46, endMs: 846}
/**
 * The builder's default calibration; with lags, as measured on a host serving /v1/loads?include=disagg (entry up to
 * maxMs).
 */
const CAL = {prefillMs: 40, prefillSpreadMs: 6, observeMs: 3, samples: 20}
const LAGS = (entryMaxMs: number): MeasuredLags => ({
  concurrency: 8,
  samples: 8,
  entry: {p50Ms: entryMaxMs / 2, maxMs: entryMaxMs, samples: 8},
  answer: {p50Ms: 2, maxMs: 4, includesEntry: false},
  notes: [],
})

/**
 * n trials sent 100 ms apart, each aborted at its planned offset across the held window and answered `answer(i)` ms
 * after its abort (undefined: never), with the window recorded and the filter's count read before the revert.
 */
function trials(
  n: number,
  o: {
    packets?: number
    answerAfterMs: (i: number) => number | undefined
    detail?: (rid: string) => string
    lateMs?: (i: number) => number
    widening?: 'packet-filter' | 'twin-failpoint' | 'none'
    lags?: MeasuredLags
  },
) {
  const offsets = Array.from(
    {length: n},
    (_, i) => HELD.startMs + ((HELD.endMs - HELD.startMs) * i) / Math.max(1, n - 1),
  )
  const rids = offsets.map((_, i) => `pdchaos-abort:L1:${String(i).padStart(3, '0')}`)
  const b = new TimelineBuilder(undefined, o.lags ? {...CAL, lags: o.lags} : undefined).transferWindow(
    0,
    rids.map((rid, i) => ({rid, offsetMs: offsets[i]!})),
    {...HELD, widening: o.widening ?? 'packet-filter'},
  )
  rids.forEach((rid, i) => {
    const sentMs = 10 + i * 100
    const abortMs = sentMs + offsets[i]! + (o.lateMs?.(i) ?? 0)
    const after = o.answerAfterMs(i)
    b.pin(
      rid,
      sentMs,
      after === undefined
        ? undefined
        : {ms: abortMs + after, status: 500, detail: (o.detail ?? abortedInTransfer)(rid)},
      inflight,
    ).abort(rid, abortMs)
  })
  if (o.packets !== undefined) b.filterMatched(3000, o.packets)
  return b.end(4000).build()
}

describe('abort check', () => {
  it(
    'passes an honoured abort released within one poll, and records the trial: times, targeted state, bounds, ' +
      'landing',
    () => {
      const tl = new TimelineBuilder()
        .transferWindow(0, [{rid: 'a1', offsetMs: 50}], HELD)
        .pin('a1', 0, {ms: 60, status: 500, detail: abortedInTransfer('a1')}, inflight)
        .abort('a1', 50)
        .filterMatched(3000, 312)
        .build()
      const {
        verdicts: v,
        trials: [t],
        coverage,
      } = checkAborts(tl)
      expect(v[0]).toMatchObject({verdict: 'pass'})
      expect(v[0]!.summary).toMatch(/abort honoured/)
      const t0 = new TimelineBuilder().t0
      expect(t).toMatchObject({
        rid: 'a1',
        sentAt: t0,
        abortedAt: t0 + 50,
        offsetMs: 50,
        plannedOffsetMs: 50,
        releasedAt: t0 + 60,
        releaseStatus: 500,
        targeted: inflight,
        releasedFrom: 'inflight',
        inWindow: true,
        verdict: 'pass',
        outcome: 'honoured',
      })
      // One poll (0.5 s) + ε to honour it; the watchdog's window [deadline - ε, deadline + poll + ε] for a lost one.
      expect(t!.bounds.honourBySeconds).toBeGreaterThan(0.5)
      expect(t!.bounds.watchdog[0]).toBeLessThan(2)
      expect(t!.bounds.watchdog[1]).toBeGreaterThan(2.5)
      expect(coverage).toMatchObject({
        trials: 1,
        inWindow: 1,
        required: 1,
        verified: true,
        filterMatchedPackets: 312,
        offsets: {plannedMs: [50], firedMs: [50]},
      })
      expect(coverage!.summary).toMatch(/^aborts in window: 1\/1, filter matched 312 packets/)
    },
  )

  it(
    'fails a lost abort even when the watchdog then evicts in its window (the abort race), and passes the ' +
      'watchdog on its own',
    () => {
      // The watchdog held it 2.280 s (scope all: from its entry into prefill's bootstrap queue), so it entered 20 ms
      // after the send, before the abort at 50 ms: the abort is shown lost.
      const evicted =
        '{"error":{"message":"Request a1 evicted by the disaggregation watchdog after 2.280s in the inflight queue ' +
        '(KVPoll.Transferring)"}}'
      const {
        verdicts: v,
        trials: [t],
      } = checkAborts(
        new TimelineBuilder().pin('a1', 0, {ms: 2300, status: 500, detail: evicted}, inflight).abort('a1', 50).build(),
      )
      expect(v.map(x => [x.check, x.verdict])).toEqual([
        ['abort', 'fail'],
        ['eviction', 'pass'],
      ])
      expect(v[0]!.summary).toMatch(/^abort lost; released by the watchdog after 2\.300s \(2\.250s after the abort/)
      expect(v[0]!.evidence).toMatchObject({outcome: 'lost-then-evicted', releasedBy: 'watchdog'})
      expect(v[1]!.summary).toMatch(/after its abort was lost/)
      expect(t).toMatchObject({
        verdict: 'fail',
        outcome: 'lost-then-evicted',
        releasedFrom: 'inflight',
        releasedBy: {path: 'watchdog'},
        entry: {shown: 'before', source: 'watchdog', atMs: 20},
      })
    },
  )

  it('fails a lost abort with nothing to release the pin (abort-race with the watchdog off)', () => {
    // Entry shown by the lags measured at calibration (/v1/loads counts): the slowest of 8 entered 30 ms after its
    // send.
    const {
      verdicts: v,
      trials: [t],
    } = checkAborts(
      new TimelineBuilder({scope: 'off', deadlineSeconds: 2, pollSeconds: 0.5}, {...CAL, lags: LAGS(30)})
        .pin('a1', 0, undefined, inflight)
        .abort('a1', 50)
        .end(8000)
        .build(),
    )
    expect(v[0]).toMatchObject({verdict: 'fail'})
    expect(v[0]!.summary).toMatch(/still held after 8\.000s/)
    expect(t).toMatchObject({
      releasedAt: null,
      releaseStatus: null,
      outcome: 'pinned',
      releasedBy: {path: 'not-released'},
      entry: {shown: 'before', source: 'calibration'},
    })
  })

  // Seen against an independent target that ignores an abort of a Transferring request: the widening filter held
  // nothing (0 packets matched), so no abort ever met a request in Transferring, and six fast releases read as six
  // honoured aborts.
  it(
    'six "honoured" aborts while the widening filter matched 0 packets: unverified with why and how to verify, ' +
      'never a pass',
    () => {
      const {
        verdicts,
        trials: ts,
        coverage,
      } = checkAborts(
        trials(6, {packets: 0, answerAfterMs: () => 12, detail: rid => `{"error":{"message":"Abort request ${rid}"}}`}),
      )
      const aborts = verdicts.filter(v => v.check === 'abort')
      expect(aborts).toHaveLength(6)
      expect(aborts.map(v => v.verdict)).toEqual(Array(6).fill('unverified'))
      expect(aborts[0]!.summary).toMatch(
        /^abort honoured: released 0\.012s after the abort .* not counted: the widening filter matched 0 packets \(it held no KV transfer\)$/,
      )
      expect(aborts[0]!.evidence).toMatchObject({
        why: expect.stringMatching(/filter matched 0 packets/),
        toVerify: expect.stringMatching(/ss -tnp/),
      })
      expect(coverage).toMatchObject({
        trials: 6,
        inWindow: 0,
        required: 3,
        verified: false,
        filterMatchedPackets: 0,
        why: expect.stringMatching(/matched 0 packets while in place/),
      })
      expect(coverage!.summary).toMatch(
        /^aborts in window: 0\/6, filter matched 0 packets; aborts fired 46\.\.846 ms after send \(window 46\.\.846 ms, held open by the widening\)$/,
      )
      expect(ts.every(t => !t.inWindow && t.verdict === 'unverified' && /0 packets/.test(t.notInWindow ?? ''))).toBe(
        true,
      )
      // A release before the abort was fired is no honoured abort either.
      const early = checkAborts(trials(1, {packets: 312, answerAfterMs: () => -20})).verdicts[0]!
      expect(early).toMatchObject({
        verdict: 'unverified',
        summary: 'released with 500 0.020s before its abort was fired',
      })
    },
  )

  it('the same six with the filter holding the transfer pass, and the coverage says so', () => {
    const {verdicts, coverage} = checkAborts(trials(6, {packets: 312, answerAfterMs: () => 12}))
    expect(verdicts.map(v => v.verdict)).toEqual(Array(6).fill('pass'))
    expect(coverage!.summary).toMatch(/^aborts in window: 6\/6, filter matched 312 packets/)
  })

  it(
    'a trial outside the window (answered first, or released from the bootstrap queue) is unverified alone while ' +
      'enough others landed',
    () => {
      const bootstrapFailed = (rid: string) =>
        `{"error":{"message":"Prefill bootstrap failed for request rid=${rid} bootstrap_room=9 with exception ` +
        `KVTransferError(bootstrap_room=9): Aborted by AbortReq."}}`
      const tl = trials(6, {
        packets: 312,
        answerAfterMs: i => (i === 0 ? -5 : 12),
        detail: rid => (rid.endsWith('1') ? bootstrapFailed(rid) : abortedInTransfer(rid)),
      })
      const {verdicts, trials: ts, coverage} = checkAborts(tl)
      expect(verdicts.map(v => v.verdict)).toEqual(['unverified', 'unverified', 'pass', 'pass', 'pass', 'pass'])
      expect(ts[0]!.notInWindow).toBe('the request was answered before its abort was fired')
      expect(ts[1]!.notInWindow).toBe('its answer says it was released from the bootstrap queue, not from Transferring')
      expect(coverage).toMatchObject({inWindow: 4, required: 3, verified: true})
      expect(coverage!.summary).toMatch(/^aborts in window: 4\/6, filter matched 312 packets/)
    },
  )

  it('aborts a busy host fired past the window: too few landed, so no abort passes', () => {
    // Four of six timers fired 2.1 s late: past the deadline, where the watchdog, not the abort, owns the request.
    const {verdicts, coverage} = checkAborts(
      trials(6, {packets: 312, answerAfterMs: () => 12, lateMs: i => (i < 4 ? 2100 : 0)}),
    )
    expect(verdicts.filter(v => v.verdict === 'pass')).toEqual([])
    // The two that landed say why they are not passes either.
    expect(verdicts.find(v => v.subject.endsWith(':005'))!.summary).toMatch(
      /not counted: too few aborts landed in the transfer window \(2\/6, at least 3 needed\)$/,
    )
    expect(coverage).toMatchObject({
      inWindow: 2,
      required: 3,
      verified: false,
      why: expect.stringMatching(
        /^only 2 of 6 aborts landed in the transfer window \(at least 3 needed\): 4× fired N ms after the send, after the window closes/,
      ),
    })
  })

  it(
    "a release inside both one poll of the abort and the watchdog's window: the watchdog's words make it a lost " +
      'abort; no words, unverified',
    () => {
      // Deadline 2 s, poll 0.5 s: an abort at 1.8 s is honoured by 2.3 s, and the watchdog may evict from 2.0 s.
      const late = (detail: string) =>
        new TimelineBuilder()
          .transferWindow(0, [{rid: 'a1', offsetMs: 1800}], HELD)
          .filterMatched(3000, 40)
          .pin('a1', 0, {ms: 2100, status: 500, detail}, inflight)
          .abort('a1', 1800)
          .end(4000)
          .build()
      const evicted = checkAborts(
        late(
          '{"error":{"message":"Request a1 evicted by the disaggregation watchdog after 2.080s in the inflight queue ' +
            '(KVPoll.Transferring)"}}',
        ),
      ).verdicts
      expect(evicted.map(v => `${v.check} ${v.verdict}`)).toEqual(['abort fail', 'eviction pass'])
      expect(evicted[0]!.summary).toMatch(/^abort lost; released by the watchdog/)
      const silent = checkAborts(late('{"error":{"message":"Request aborted"}}')).verdicts
      expect(silent).toMatchObject([
        {
          check: 'abort',
          verdict: 'unverified',
          summary: expect.stringMatching(
            /inside both one poll of it and the watchdog's window; nothing names the abort$/,
          ),
        },
      ])
      // The watchdog's words within ε of the abort (fired at 2.095 s, seen at 2.100 s): the abort may have arrived
      // after
      // it.
      const raced = checkAborts(
        new TimelineBuilder()
          .transferWindow(0, [{rid: 'a1', offsetMs: 1800}], HELD)
          .filterMatched(3000, 40)
          .pin(
            'a1',
            0,
            {
              ms: 2100,
              status: 500,
              detail:
                '{"error":{"message":"Request a1 evicted by the disaggregation watchdog after 2.095s in the inflight ' +
                'queue (KVPoll.Transferring)"}}',
            },
            inflight,
          )
          .abort('a1', 2095)
          .end(4000)
          .build(),
      )
      expect(raced.verdicts.map(v => `${v.check} ${v.verdict}`)).toEqual(['abort unverified', 'eviction pass'])
      expect(raced.trials[0]).toMatchObject({
        outcome: 'raced',
        evidence: {why: expect.stringMatching(/whether the abort reached the server first is unknown/)},
      })
      // SGLang's own words for an abort in the inflight queue settle it.
      expect(checkAborts(late(abortedInTransfer('a1'))).verdicts).toMatchObject([
        {verdict: 'pass', summary: expect.stringMatching(/^abort honoured/)},
      ])
    },
  )

  it('a lost abort fails even without coverage: the failure is evidence, coverage only guards passes', () => {
    const {verdicts} = checkAborts(trials(2, {packets: 0, answerAfterMs: () => undefined, lags: LAGS(30)}))
    expect(verdicts.map(v => v.verdict)).toEqual(['fail', 'fail'])
  })

  it('without the recorded window nothing can be shown to have landed', () => {
    const {verdicts, coverage} = checkAborts(
      new TimelineBuilder()
        .pin('a1', 0, {ms: 60, status: 500, detail: abortedInTransfer('a1')}, inflight)
        .abort('a1', 50)
        .build(),
    )
    expect(verdicts[0]).toMatchObject({
      verdict: 'unverified',
      summary: expect.stringMatching(/not counted: the run recorded no transfer window for this trial$/),
      evidence: {why: 'the run recorded no transfer window'},
    })
    expect(coverage).toMatchObject({window: null, verified: false})
  })
})

describe('recovery check', () => {
  const base = () =>
    new TimelineBuilder()
      .fault(100, 3000)
      .metric('prefill', 'sglang:token_usage', 50, 0.0)
      .metric('decode', 'sglang:token_usage', 50, 0.0)
      .metric('prefill', 'sglang:num_watchdog_evicted_reqs_total', 50, 4)
      .pin('p1', 200, {ms: 2400, status: 500})
      .pin('p2', 210, {ms: 2410, status: 500})
      .request('c1', 'canary', 3100, {ms: 3150, status: 200})

  it('passes when requests succeed, queues drain, tokens return and counters moved by the pins', () => {
    const tl = base()
      .metric('prefill', 'sglang:num_prefill_bootstrap_queue_reqs', 3200, 0)
      .metric('prefill', 'sglang:num_prefill_inflight_queue_reqs', 3200, 0)
      .metric('prefill', 'sglang:token_usage', 3200, 0)
      .metric('decode', 'sglang:token_usage', 3200, 0)
      .metric('prefill', 'sglang:num_watchdog_evicted_reqs_total', 3200, 6)
      .build()
    const v = checkRecovery(tl)
    expect(v.filter(x => x.verdict === 'fail')).toEqual([])
    expect(v.map(x => x.subject)).toEqual(['requests', 'queues', 'prefill KV tokens', 'decode KV tokens', 'counters'])
  })

  it(
    'fails a KV token leak (leak-on-evict) shown by idle /v1/loads snapshots, and a counter that moved by the ' +
      'wrong amount',
    () => {
      const tl = base()
        .loads('prefill', 60, 0)
        .loads('prefill', 3200, 2048)
        .metric('prefill', 'sglang:num_prefill_bootstrap_queue_reqs', 3200, 0)
        .metric('prefill', 'sglang:token_usage', 3200, 0.02)
        .metric('decode', 'sglang:token_usage', 3200, 0)
        .metric('prefill', 'sglang:num_watchdog_evicted_reqs_total', 3200, 5)
        .build()
      const failed = checkRecovery(tl).filter(x => x.verdict === 'fail')
      expect(failed.map(f => f.subject)).toEqual(['prefill KV tokens', 'counters'])
      expect(failed[0].summary).toMatch(/a leak/)
      expect(failed[1].summary).toMatch(/moved by 1, expected 2/)
    },
  )

  it(
    'load the gateway refused itself (no worker available: breaker open or unhealthy) may or may not have moved ' +
      'the counters',
    () => {
      const refused =
        '{"error":{"message":"No available servers: No available prefill workers (all circuits open or ' +
        'unhealthy)","type":"service_unavailable","code":"server_selection_failed"}}'
      let b = base()
        .metric('prefill', 'sglang:num_prefill_bootstrap_queue_reqs', 3200, 0)
        .metric('prefill', 'sglang:token_usage', 3200, 0)
        .metric('decode', 'sglang:token_usage', 3200, 0)
        .metric('prefill', 'sglang:num_watchdog_evicted_reqs_total', 3200, 7)
      for (let i = 0; i < 10; i++)
        b = b.request(`l${i}`, 'load', 300 + i * 100, {ms: 320 + i * 100, status: 503, detail: refused})
      const counters = checkRecovery(b.build()).find(x => x.subject === 'counters')!
      // 2 pins certain, 10 refusals uncertain: 3 moves is inside [2, 12].
      expect(counters).toMatchObject({
        verdict: 'pass',
        summary: expect.stringMatching(/moved by 3, as expected \(2 to 12\)/),
      })
      expect(counters.evidence).toMatchObject({failedRequests: 2, releasedByPdchaos: 0, refusedByGateway: 10})
    },
  )

  it(
    'a canary held past the deadline after the revert (a path still in its retransmission backoff) may have been ' +
      'evicted and retried by the gateway',
    () => {
      const countersAfter = (canaryMs: number, evicted: number) => {
        const tl = new TimelineBuilder()
          .fault(100, 3000)
          .metric('prefill', 'sglang:num_watchdog_evicted_reqs_total', 50, 4)
          .pin('p1', 200, {ms: 2400, status: 500})
          .pin('p2', 210, {ms: 2410, status: 500})
          .request('c1', 'canary', 3100, {ms: 3100 + canaryMs, status: 200})
          .metric('prefill', 'sglang:num_watchdog_evicted_reqs_total', 9000, 4 + evicted)
          .build()
        // Pins go to the servers directly, as pdchaos sends them by default (no gateway retries them).
        for (const o of tl.observations) if (o.kind === 'request-sent' && o.role === 'pin') o.path = 'direct'
        return checkRecovery(tl).find(x => x.subject === 'counters')!
      }
      // Held 2.5 s (past the 2 s deadline) and answered 200: one more eviction than pdchaos saw fail is not a watchdog
      // fault.
      expect(countersAfter(2500, 3)).toMatchObject({
        verdict: 'unverified',
        summary: expect.stringMatching(/moved by 3, 1 more than the 2 pdchaos can attribute/),
      })
      expect(countersAfter(2500, 3).evidence).toMatchObject({
        routedInReach: 1,
        why: expect.stringMatching(/took at least the deadline/),
      })
      // Answered in 50 ms: it never held an attempt long enough to be evicted, so the extra move is a failure.
      expect(countersAfter(50, 3)).toMatchObject({
        verdict: 'fail',
        summary: expect.stringMatching(/moved by 3, expected 2/),
      })
    },
  )

  it('fails undrained queues (by the fresh /v1/loads snapshot) and failing canaries', () => {
    const tl = new TimelineBuilder()
      .fault(100, 3000)
      .request('c1', 'canary', 3100, {ms: 3150, status: 502})
      .metric('prefill', LOADS_PREFILL_INFLIGHT_QUEUE, 3200, 3)
      .build()
    const failed = checkRecovery(tl)
      .filter(x => x.verdict === 'fail')
      .map(f => f.summary)
    expect(failed[0]).toMatch(/1 of 1 requests after the revert failed: c1 \(502\)/)
    expect(failed[1]).toMatch(new RegExp(`queues not drained: ${LOADS_PREFILL_INFLIGHT_QUEUE}=3`))
  })

  it(
    'never fails a drain on /metrics gauges, which SGLang leaves stale on an idle server: unverified, with how to ' +
      'verify',
    () => {
      const gaugeOnly = new TimelineBuilder()
        .fault(100, 3000)
        .request('c1', 'canary', 3100, {ms: 3150, status: 200})
        .metric('prefill', 'sglang:num_prefill_inflight_queue_reqs', 3200, 3)
        .build()
      const queues = checkRecovery(gaugeOnly).find(x => x.subject === 'queues')!
      expect(queues).toMatchObject({
        verdict: 'unverified',
        summary: expect.stringMatching(/only by gauges that may be stale: sglang:num_prefill_inflight_queue_reqs=3/),
      })
      expect(queues.evidence).toMatchObject({
        why: expect.stringMatching(/lag by up to about 30 s/),
        toVerify: expect.stringMatching(/include=disagg/),
      })
      // Nothing sampled at all: unproven, not failed.
      const none = checkRecovery(
        new TimelineBuilder().fault(100, 3000).request('c1', 'canary', 3100, {ms: 3150, status: 200}).build(),
      )
      expect(none.find(x => x.subject === 'queues')).toMatchObject({
        verdict: 'unverified',
        summary: expect.stringMatching(/drain unproven/),
      })
    },
  )

  it('a prefill that does not export the watchdog counter leaves the counter balance unverified, not skipped', () => {
    const tl = new TimelineBuilder()
      .fault(100, 3000)
      .pin('p1', 200, {ms: 2400, status: 500})
      .request('c1', 'canary', 3100, {ms: 3150, status: 200})
      .metric('prefill', LOADS_PREFILL_INFLIGHT_QUEUE, 3200, 0)
      .build()
    const counters = checkRecovery(tl).find(x => x.subject === 'counters')!
    expect(counters).toMatchObject({
      verdict: 'unverified',
      summary: expect.stringMatching(/prefill does not export sglang:num_watchdog_evicted_reqs_total/),
    })
    expect(counters.evidence).toMatchObject({toVerify: expect.stringMatching(/count its evictions/)})
  })
})

describe('collateral check', () => {
  it('judges only load requests outside the fault window and names the lost ones', () => {
    const tl = new TimelineBuilder()
      .fault(1000, 2000)
      .request('l1', 'load', 0, {ms: 50, status: 200})
      .request('l2', 'load', 1500, {ms: 2600, status: 500})
      .request('l3', 'load', 2500, {ms: 2550, status: 502})
      .request('l4', 'load', 2600, {ms: 2650, status: 200})
      .build()
    const v = checkCollateral(tl)
    expect(v.verdict).toBe('fail')
    expect(v.summary).toMatch(/1 of 3 requests outside the fault's reach failed: l3 \(502\)/)
    expect(v.evidence).toMatchObject({inFaultReach: 1})
  })

  it('passes when every request outside the fault succeeded', () => {
    const v = checkCollateral(
      new TimelineBuilder().fault(1000, 2000).request('l1', 'load', 0, {ms: 50, status: 200}).build(),
    )
    expect(v).toMatchObject({verdict: 'pass'})
  })
})
