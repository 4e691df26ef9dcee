import {describe, expect, it} from 'vitest'

import {checkKvTokens} from '../../src/checks/kv-tokens.js'
import {checkRecovery} from '../../src/checks/recovery.js'
import {freshnessOf, idleSnapshotReadings, inFlightAt, writtenSince} from '../../src/engines/sglang/freshness.js'
import {
  LOADS_PREFILL_INFLIGHT_QUEUE,
  LOADS_USED_TOKENS,
  PREFILL_INFLIGHT_QUEUE,
  TOKEN_USAGE,
  TRANSFER_FAILED_TOTAL,
} from '../../src/engines/sglang/sglang-metrics.js'
import {TimelineBuilder} from './synthetic.js'

/**
 * The KV leak check on the freshness rule (docs/freshness.md): a leak fails only where a fresh reading shows it, on any
 * KV pool size and share per request; the per-batch sglang:token_usage gauge never makes a failure.
 */

/**
 * An experiment: the fault from 100 to 3000 ms, two pins released at 2400, load every 400 ms (50 ms each) and three
 * canaries at once after the revert. Each sample of a server reads what was in flight at its last batch, as SGLang's
 * per-batch gauge does: a request's tokens from its batch on, the pins' from theirs until released, plus the leak.
 */
function experiment(o: {poolTokens: number; shareTokens: number; leakTokens: number; gauge: boolean; loads: boolean}) {
  const b = new TimelineBuilder()
    .fault(100, 3000)
    .pin('p1', 200, {ms: 2400, status: 500})
    .pin('p2', 210, {ms: 2400, status: 500})
  const load = Array.from({length: 8}, (_, i) => ({rid: `l${i}`, sent: 20 + i * 400, done: 70 + i * 400}))
  for (const l of load) b.request(l.rid, 'load', l.sent, {ms: l.done, status: 200})
  const canaries = ['c1', 'c2', 'c3'].map(rid => ({rid, sent: 3100, done: 3180}))
  for (const c of canaries) b.request(c.rid, 'canary', c.sent, {ms: c.done, status: 200})
  const held = (t: number) =>
    [...load, ...canaries].filter(r => r.sent <= t && r.done > t).length + (t >= 200 && t < 2400 ? 2 : 0)
  let lastBatch = 0
  for (let t = 0; t <= 3600; t += 60) {
    const ranBatch = [...load, ...canaries].some(r => r.sent > t - 60 && r.sent <= t)
    const leak = t >= 2400 ? o.leakTokens : 0
    if (ranBatch) lastBatch = held(t) * o.shareTokens + leak
    if (o.gauge) b.metric('prefill', TOKEN_USAGE, t, lastBatch / o.poolTokens)
    if (o.loads) {
      const busy = held(t)
      b.loads('prefill', t + 1, busy * o.shareTokens + leak, busy > 0 ? {sglang_num_running_reqs: busy} : {})
    }
  }
  return b.end(3700).build()
}

const kv = (tl: ReturnType<typeof experiment>) => checkRecovery(tl).find(v => v.subject === 'prefill KV tokens')

describe('KV leak check, on the freshness rule', () => {
  it(
    "the issue's false alarm: token_usage 0.0034 at the last batch before the fault, 0.0068 after recovery, is no " +
      'failure',
    () => {
      const tl = new TimelineBuilder()
        .fault(100, 3000)
        .pin('p1', 200, {ms: 2400, status: 500})
        .request('c1', 'canary', 3100, {ms: 3150, status: 200})
        .request('c2', 'canary', 3100, {ms: 3150, status: 200})
        .metric('prefill', TOKEN_USAGE, 50, 0.0034)
        .metric('prefill', TOKEN_USAGE, 3200, 0.0068)
        .build()
      const v = kv(tl)!
      expect(v.verdict).toBe('unverified')
      expect(v.summary).toMatch(/0\.0068 after recovery vs 0\.0034 before the fault, shown only by sglang:token_usage/)
      expect(v.evidence).toMatchObject({
        refresh: 'per-batch',
        toVerify: expect.stringMatching(/\/v1\/loads\?include=disagg.*idle refresh/),
      })
    },
  )

  for (const poolTokens of [8192, 37_648, 1_000_000, 16_000_000]) {
    for (const shareTokens of [16, 128, 4096]) {
      if (shareTokens * 8 > poolTokens) continue
      const at = `pool ${poolTokens}, ${shareTokens} tokens a request`
      it(`${at}: healthy never fails; a leak of one pin fails only on idle /v1/loads snapshots`, () => {
        const leak = shareTokens
        // Healthy, /metrics only: the per-batch gauge reads several requests' share after recovery (three canaries).
        const healthyGauge = kv(experiment({poolTokens, shareTokens, leakTokens: 0, gauge: true, loads: false}))!
        expect(healthyGauge.verdict, healthyGauge.summary).not.toBe('fail')
        // Healthy with /v1/loads: the idle snapshots read 0 before and after, exactly.
        expect(kv(experiment({poolTokens, shareTokens, leakTokens: 0, gauge: true, loads: true}))).toMatchObject({
          verdict: 'pass',
          evidence: {baseline: 0, after: 0},
        })
        // A leak: shown by the idle snapshots; the per-batch gauge alone cannot tell it from requests in flight.
        const leaked = kv(experiment({poolTokens, shareTokens, leakTokens: leak, gauge: true, loads: true}))!
        expect(leaked).toMatchObject({verdict: 'fail', evidence: {baseline: 0, after: leak}})
        expect(leaked.summary).toMatch(/read with the server idle .* a leak/)
        const gaugeOnly = kv(experiment({poolTokens, shareTokens, leakTokens: leak, gauge: true, loads: false}))!
        expect(gaugeOnly.verdict).toBe('unverified')
      })
    }
  }

  it('a per-batch pass needs a reading written after the release at or below the lowest before the fault', () => {
    // The last batch before the fault held one request; the canary's batch after recovery held one too: a leak would
    // have added to it.
    const one = new TimelineBuilder()
      .fault(100, 3000)
      .pin('p1', 200, {ms: 2400, status: 500})
      .request('c1', 'canary', 3100, {ms: 3150, status: 200})
      .metric('prefill', TOKEN_USAGE, 50, 0.0034)
      .metric('prefill', TOKEN_USAGE, 2500, 0.0068)
      .metric('prefill', TOKEN_USAGE, 3200, 0.0034)
      .build()
    expect(kv(one)).toMatchObject({
      verdict: 'pass',
      evidence: {baseline: 0.0034, after: 0.0034, readingsAfter: 1, strict: false},
    })
    // A reading taken after the release but before any request sent after it ran a batch is the pins' last batch.
    const stale = new TimelineBuilder()
      .fault(100, 3000)
      .pin('p1', 200, {ms: 2400, status: 500})
      .metric('prefill', TOKEN_USAGE, 50, 0.0034)
      .metric('prefill', TOKEN_USAGE, 3200, 0.0034)
      .build()
    expect(kv(stale)).toMatchObject({
      verdict: 'unverified',
      summary: expect.stringMatching(/no reading of sglang:token_usage was shown to be written after/),
    })
  })
})

describe('the freshness rule', () => {
  it('names each source: counters live, the /metrics gauges per batch, the /v1/loads snapshot fresh once idle', () => {
    expect(freshnessOf(TRANSFER_FAILED_TOTAL).refresh).toBe('live')
    for (const n of [TOKEN_USAGE, PREFILL_INFLIGHT_QUEUE, 'sglang:num_running_reqs'])
      expect(freshnessOf(n).refresh).toBe('per-batch')
    for (const n of [LOADS_USED_TOKENS, LOADS_PREFILL_INFLIGHT_QUEUE])
      expect(freshnessOf(n).refresh).toBe('idle-snapshot')
    expect(freshnessOf('sglang:something_new').refresh).toBe('per-batch')
    expect(freshnessOf(TOKEN_USAGE).upstream).toMatch(/report_prefill_stats/)
  })

  it(
    'an idle /v1/loads reading: nothing of pdchaos in flight, and the snapshot itself shows nothing running or ' +
      'queued',
    () => {
      const tl = new TimelineBuilder()
        .request('l1', 'load', 100, {ms: 200, status: 200})
        .request('l2', 'load', 400, {ms: 500, status: 200})
        .loads('prefill', 50, 0)
        .loads('prefill', 150, 128)
        .loads('prefill', 300, 128, {sglang_num_running_reqs: 1})
        .loads('prefill', 350, 0)
        .request('l3', 'load', 600)
        .build()
      const t0 = new TimelineBuilder().t0
      expect([inFlightAt(tl, t0 + 150), inFlightAt(tl, t0 + 350), inFlightAt(tl, t0 + 700)]).toEqual([1, 0, 1])
      expect(idleSnapshotReadings(tl, 'prefill', LOADS_USED_TOKENS).map(r => r.t - t0)).toEqual([50, 350])
      // A /metrics gauge is never an idle snapshot, whatever it reads.
      expect(idleSnapshotReadings(tl, 'prefill', TOKEN_USAGE)).toEqual([])
    },
  )

  it(
    'a per-batch write after a moment: on prefill, a request sent after it succeeded; on decode, the series ' +
      'changed',
    () => {
      const tl = new TimelineBuilder()
        .request('c1', 'canary', 3100, {ms: 3150, status: 200})
        .request('c0', 'canary', 2900, {ms: 3000, status: 200})
        .metric('decode', TOKEN_USAGE, 2900, 0.01)
        .metric('decode', TOKEN_USAGE, 3300, 0.01)
        .metric('decode', TOKEN_USAGE, 3500, 0)
        .build()
      const t0 = new TimelineBuilder().t0
      expect(writtenSince(tl, 'prefill', TOKEN_USAGE, t0 + 3050)).toMatchObject({at: t0 + 3150})
      expect(writtenSince(tl, 'prefill', TOKEN_USAGE, t0 + 3200)).toBeUndefined()
      expect(writtenSince(tl, 'decode', TOKEN_USAGE, t0 + 3050)).toMatchObject({at: t0 + 3500})
    },
  )

  it("a drain read from gauges: a 0 counts only when written after the fault's last request ended", () => {
    const gauges = (b: TimelineBuilder, ms: number, prefill: number, decode: number) =>
      b
        .metric('prefill', PREFILL_INFLIGHT_QUEUE, ms, prefill)
        .metric('prefill', 'sglang:num_prefill_bootstrap_queue_reqs', ms, prefill)
        .metric('decode', 'sglang:num_decode_prealloc_queue_reqs', ms, decode)
        .metric('decode', 'sglang:num_decode_transfer_queue_reqs', ms, decode)
    const queuesOf = (b: TimelineBuilder) => checkRecovery(b.build()).find(v => v.subject === 'queues')!
    const run = () =>
      new TimelineBuilder()
        .fault(100, 3000)
        .pin('p1', 200, {ms: 2400, status: 500})
        .request('c1', 'canary', 3100, {ms: 3150, status: 200})
    // Decode's 0 never changed after the release: no write shows it, so a request held there could hide behind it.
    const frozen = gauges(gauges(run(), 50, 0, 0), 3200, 0, 0)
    expect(queuesOf(frozen)).toMatchObject({
      verdict: 'unverified',
      summary: expect.stringMatching(/not shown written since .*decode_prealloc/),
    })
    // A decode write after the release (its token usage moved): every gauge of that write is fresh.
    const moved = gauges(gauges(run(), 50, 0, 0), 3200, 0, 0)
      .metric('decode', TOKEN_USAGE, 2900, 0.0034)
      .metric('decode', TOKEN_USAGE, 3300, 0)
    gauges(moved, 3300, 0, 0)
    expect(queuesOf(moved)).toMatchObject({
      verdict: 'pass',
      summary: expect.stringMatching(/written after the fault's last request ended/),
    })
    // Prefill's 0 read before any request sent after the release succeeded: its last batch may predate a held one.
    const early = gauges(new TimelineBuilder().fault(100, 3000).pin('p1', 200, {ms: 2400, status: 500}), 3200, 0, 0)
      .metric('decode', TOKEN_USAGE, 2900, 1)
      .metric('decode', TOKEN_USAGE, 3100, 0)
    expect(queuesOf(early)).toMatchObject({verdict: 'unverified', summary: expect.stringMatching(/prefill_inflight/)})
  })

  it('checkKvTokens gives no verdict on a server whose tokens were never sampled before the fault', () => {
    const tl = new TimelineBuilder().fault(100, 3000).metric('prefill', TOKEN_USAGE, 3200, 0.5).build()
    expect(
      checkKvTokens(tl, 'prefill', undefined, {
        injectedAt: tl.observations[0]!.t,
        revertedAt: tl.observations[1]!.t,
        end: tl.observations.at(-1)!.t,
      }),
    ).toBeUndefined()
  })
})
