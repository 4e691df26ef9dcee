import {describe, expect, it} from 'vitest'

import {checkAborts} from '../../src/checks/abort.js'
import {checkCollateral} from '../../src/checks/collateral.js'
import {checkRecovery} from '../../src/checks/recovery.js'
import {LOADS_PREFILL_INFLIGHT_QUEUE} from '../../src/deployment/sglang-metrics.js'
import {TimelineBuilder} from './synthetic.js'

const inflight = {queue: 'inflight' as const, kvPoll: 'Transferring' as const}

describe('abort check', () => {
  it('passes an honoured abort released within one poll', () => {
    const v = checkAborts(new TimelineBuilder().pin('a1', 0, {ms: 60, status: 500}, inflight).abort('a1', 50).build())
    expect(v[0]).toMatchObject({verdict: 'pass'})
    expect(v[0].summary).toMatch(/abort honoured/)
  })

  it('fails a lost abort even when the watchdog then evicts in its window (the abort race), and passes the watchdog on its own', () => {
    const evicted = '{"error":{"message":"Request a1 evicted by the disaggregation watchdog after 2.201s in the inflight queue (KVPoll.Transferring)"}}'
    const v = checkAborts(new TimelineBuilder().pin('a1', 0, {ms: 2300, status: 500, detail: evicted}, inflight).abort('a1', 50).build())
    expect(v.map((x) => [x.check, x.verdict])).toEqual([['abort', 'fail'], ['eviction', 'pass']])
    expect(v[0].summary).toMatch(/^abort lost; released by the watchdog after 2\.300s \(2\.250s after the abort/)
    expect(v[0].evidence).toMatchObject({outcome: 'lost-then-evicted', releasedBy: 'watchdog'})
    expect(v[1].summary).toMatch(/after its abort was lost/)
  })

  it('fails a lost abort with nothing to release the pin (abort-race with the watchdog off)', () => {
    const v = checkAborts(new TimelineBuilder({scope: 'off', deadlineSeconds: 2, pollSeconds: 0.5}).pin('a1', 0, undefined, inflight).abort('a1', 50).end(8000).build())
    expect(v[0]).toMatchObject({verdict: 'fail'})
    expect(v[0].summary).toMatch(/still held after 8\.000s/)
  })
})

describe('recovery check', () => {
  const base = () => new TimelineBuilder().fault(100, 3000)
    .metric('prefill', 'sglang:token_usage', 50, 0.0).metric('decode', 'sglang:token_usage', 50, 0.0)
    .metric('prefill', 'sglang:num_watchdog_evicted_reqs_total', 50, 4)
    .pin('p1', 200, {ms: 2400, status: 500}).pin('p2', 210, {ms: 2410, status: 500})
    .request('c1', 'canary', 3100, {ms: 3150, status: 200})

  it('passes when requests succeed, queues drain, tokens return and counters moved by the pins', () => {
    const tl = base()
      .metric('prefill', 'sglang:num_prefill_bootstrap_queue_reqs', 3200, 0).metric('prefill', 'sglang:num_prefill_inflight_queue_reqs', 3200, 0)
      .metric('prefill', 'sglang:token_usage', 3200, 0).metric('decode', 'sglang:token_usage', 3200, 0)
      .metric('prefill', 'sglang:num_watchdog_evicted_reqs_total', 3200, 6).build()
    const v = checkRecovery(tl)
    expect(v.filter((x) => x.verdict === 'fail')).toEqual([])
    expect(v.map((x) => x.subject)).toEqual(['requests', 'queues', 'prefill KV tokens', 'decode KV tokens', 'counters'])
  })

  it('fails a KV token leak (leak-on-evict) and a counter that moved by the wrong amount', () => {
    const tl = base()
      .metric('prefill', 'sglang:num_prefill_bootstrap_queue_reqs', 3200, 0).metric('prefill', 'sglang:token_usage', 3200, 0.02)
      .metric('decode', 'sglang:token_usage', 3200, 0).metric('prefill', 'sglang:num_watchdog_evicted_reqs_total', 3200, 5).build()
    const failed = checkRecovery(tl).filter((x) => x.verdict === 'fail')
    expect(failed.map((f) => f.subject)).toEqual(['prefill KV tokens', 'counters'])
    expect(failed[0].summary).toMatch(/a leak/)
    expect(failed[1].summary).toMatch(/moved by 1, expected 2/)
  })

  it('load the gateway refused itself (no worker available: breaker open or unhealthy) may or may not have moved the counters', () => {
    const refused = '{"error":{"message":"No available servers: No available prefill workers (all circuits open or unhealthy)","type":"service_unavailable","code":"server_selection_failed"}}'
    let b = base().metric('prefill', 'sglang:num_prefill_bootstrap_queue_reqs', 3200, 0).metric('prefill', 'sglang:token_usage', 3200, 0)
      .metric('decode', 'sglang:token_usage', 3200, 0).metric('prefill', 'sglang:num_watchdog_evicted_reqs_total', 3200, 7)
    for (let i = 0; i < 10; i++) b = b.request(`l${i}`, 'load', 300 + i * 100, {ms: 320 + i * 100, status: 503, detail: refused})
    const counters = checkRecovery(b.build()).find((x) => x.subject === 'counters')!
    // 2 pins certain, 10 refusals uncertain: 3 moves is inside [2, 12].
    expect(counters).toMatchObject({verdict: 'pass', summary: expect.stringMatching(/moved by 3, as expected \(2 to 12\)/)})
    expect(counters.evidence).toMatchObject({failedRequests: 2, releasedByPdchaos: 0, refusedByGateway: 10})
  })

  it('fails undrained queues (by the fresh /v1/loads snapshot) and failing canaries', () => {
    const tl = new TimelineBuilder().fault(100, 3000).request('c1', 'canary', 3100, {ms: 3150, status: 502})
      .metric('prefill', LOADS_PREFILL_INFLIGHT_QUEUE, 3200, 3).build()
    const failed = checkRecovery(tl).filter((x) => x.verdict === 'fail').map((f) => f.summary)
    expect(failed[0]).toMatch(/1 of 1 requests after the revert failed: c1 \(502\)/)
    expect(failed[1]).toMatch(new RegExp(`queues not drained: ${LOADS_PREFILL_INFLIGHT_QUEUE}=3`))
  })

  it('never fails a drain on /metrics gauges, which SGLang leaves stale on an idle server: unverified, with how to verify', () => {
    const gaugeOnly = new TimelineBuilder().fault(100, 3000).request('c1', 'canary', 3100, {ms: 3150, status: 200})
      .metric('prefill', 'sglang:num_prefill_inflight_queue_reqs', 3200, 3).build()
    const queues = checkRecovery(gaugeOnly).find((x) => x.subject === 'queues')!
    expect(queues).toMatchObject({verdict: 'unverified', summary: expect.stringMatching(/only by gauges that may be stale: sglang:num_prefill_inflight_queue_reqs=3/)})
    expect(queues.evidence).toMatchObject({why: expect.stringMatching(/lag by up to about 30 s/), toVerify: expect.stringMatching(/include=disagg/)})
    // Nothing sampled at all: unproven, not failed.
    const none = checkRecovery(new TimelineBuilder().fault(100, 3000).request('c1', 'canary', 3100, {ms: 3150, status: 200}).build())
    expect(none.find((x) => x.subject === 'queues')).toMatchObject({verdict: 'unverified', summary: expect.stringMatching(/drain unproven/)})
  })

  it('a prefill that does not export the watchdog counter leaves the counter balance unverified, not skipped', () => {
    const tl = new TimelineBuilder().fault(100, 3000).pin('p1', 200, {ms: 2400, status: 500})
      .request('c1', 'canary', 3100, {ms: 3150, status: 200}).metric('prefill', LOADS_PREFILL_INFLIGHT_QUEUE, 3200, 0).build()
    const counters = checkRecovery(tl).find((x) => x.subject === 'counters')!
    expect(counters).toMatchObject({verdict: 'unverified', summary: expect.stringMatching(/prefill does not export sglang:num_watchdog_evicted_reqs_total/)})
    expect(counters.evidence).toMatchObject({toVerify: expect.stringMatching(/count its evictions/)})
  })
})

describe('collateral check', () => {
  it('judges only load requests outside the fault window and names the lost ones', () => {
    const tl = new TimelineBuilder().fault(1000, 2000)
      .request('l1', 'load', 0, {ms: 50, status: 200})
      .request('l2', 'load', 1500, {ms: 2600, status: 500})
      .request('l3', 'load', 2500, {ms: 2550, status: 502})
      .request('l4', 'load', 2600, {ms: 2650, status: 200}).build()
    const v = checkCollateral(tl)
    expect(v.verdict).toBe('fail')
    expect(v.summary).toMatch(/1 of 3 requests outside the fault's reach failed: l3 \(502\)/)
    expect(v.evidence).toMatchObject({inFaultReach: 1})
  })

  it('passes when every request outside the fault succeeded', () => {
    const v = checkCollateral(new TimelineBuilder().fault(1000, 2000).request('l1', 'load', 0, {ms: 50, status: 200}).build())
    expect(v).toMatchObject({verdict: 'pass'})
  })
})
