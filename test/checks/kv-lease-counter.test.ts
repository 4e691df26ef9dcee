import {describe, expect, it} from 'vitest'

import {judgeKvLeases, type KvLeaseInput, type LogRelease, sampledReleases} from '../../src/checks/kv-lease.js'

/**
 * A counter-only pass (vllm:nixl_num_kv_expired_reqs names no request) needs P shown otherwise idle over the windows:
 * no blocks held when the batch was sent and no request finished but the batch's; else unverified, naming P's log.
 */
const T0 = Date.UTC(2026, 11, 4, 12, 0, 0, 0)
const S = 1000
const settings: KvLeaseInput['settings'] = {
  mode: 'lease',
  duration: {seconds: 6, source: 'kv_transfer_config'},
  stepMs: 20,
  reaperMs: 20,
}
const reqs = [
  {requestId: 'cmpl-a-0', sentMs: T0, answeredMs: T0 + 50, decodeSent: false},
  {requestId: 'cmpl-b-0', sentMs: T0 + 60, answeredMs: T0 + 110, decodeSent: false},
]
/** Rose by 2 (the batch) after every window opened and before the last one closed. */
const counter = [
  {t: T0 - 100, value: 3},
  {t: T0 + 5 * S, value: 3},
  {t: T0 + 6 * S + 100, value: 5},
]
const idle = [
  {t: T0 - 100, finished: 10, kvUsage: 0},
  {t: T0 + 6 * S + 100, finished: 12, kvUsage: 0},
]
const judge = (over: Partial<KvLeaseInput>) =>
  judgeKvLeases({
    requests: reqs,
    settings,
    observedUntilMs: T0 + 20 * S,
    expiredCounter: counter,
    ...over,
  })

describe('the vLLM lease check on the expiry counter alone', () => {
  it('passes every request when P was otherwise idle (no blocks held before, only the batch finished)', () => {
    const vs = judge({traffic: idle})
    expect(vs.map(v => v.verdict)).toEqual(['pass', 'pass'])
    expect(String(vs[0]!.evidence.idle)).toContain('request_success +2')
    expect(vs[0]!.summary).toContain('otherwise idle')
  })

  it("is unverified without P's request counters, naming the log lines that would decide it", () => {
    const vs = judge({})
    for (const v of vs) {
      expect(v.verdict).toBe('unverified')
      expect(String(v.evidence.why)).toContain('could stand in')
      expect(String(v.evidence.toVerify)).toContain('Releasing expired KV blocks for request <id>')
      expect(String(v.evidence.by)).toContain('+2')
    }
  })

  it('is unverified when P finished another request meanwhile (its expiry could stand in for ours)', () => {
    const busy = [idle[0]!, {...idle[1]!, finished: 13}]
    const v = judge({traffic: busy})[0]!
    expect(v.verdict).toBe('unverified')
    expect(String(v.evidence.why)).toContain('finished 3 request(s) meanwhile, the batch has 2')
  })

  it('is unverified when P already held blocks before the batch (an earlier lease could expire in the window)', () => {
    const held = [{...idle[0]!, kvUsage: 0.02}, idle[1]!]
    const v = judge({traffic: held})[0]!
    expect(v.verdict).toBe('unverified')
    expect(String(v.evidence.why)).toContain('held blocks before the batch')
  })

  it('is unverified when the request counters were read only after the batch was sent', () => {
    const late = [{...idle[0]!, t: T0 + 30}, idle[1]!]
    expect(judge({traffic: late})[0]!.verdict).toBe('unverified')
  })

  it("is unverified when the request counters were last read before the counter's rise", () => {
    const early = [idle[0]!, {...idle[1]!, t: T0 + 5 * S}]
    const v = judge({traffic: early})[0]!
    expect(v.verdict).toBe('unverified')
    expect(String(v.evidence.why)).toContain("after the counter's rise")
  })

  it('does not fail "never" a request the log does not name while the counter covers the batch', () => {
    const other: LogRelease = {
      t: T0 + 6 * S,
      resolutionMs: 1000,
      requestId: 'cmpl-a-0',
      cause: 'lease-expired',
      line: 'WARNING … Releasing expired KV blocks for request cmpl-a-0 …',
    }
    const [a, b] = judge({logReleases: [other]})
    expect(a!.verdict).toBe('pass')
    expect(b!.verdict).toBe('unverified')
    const [, b2] = judge({logReleases: [other], traffic: idle})
    expect(b2!.verdict).toBe('pass')
  })
})

describe('the expiry counter as a finer clock than the log second', () => {
  // Scrapes every 200 ms around the windows: +1 between 6.0 s and 6.2 s, +1 between 6.2 s and 6.4 s after T0.
  const scrapes = [
    {fromT: T0 - 150, t: T0 - 100, value: 3},
    {fromT: T0 + 5950, t: T0 + 6 * S, value: 3},
    {fromT: T0 + 6150, t: T0 + 6200, value: 4},
    {fromT: T0 + 6350, t: T0 + 6400, value: 5},
  ]
  const traffic = [
    {t: T0 - 100, finished: 10, kvUsage: 0},
    {t: T0 + 6400, finished: 12, kvUsage: 0},
  ]
  const lines = reqs.map(
    (r): LogRelease => ({
      t: T0 + 6 * S,
      resolutionMs: 1000,
      requestId: r.requestId,
      cause: 'lease-expired',
      line: `WARNING … Releasing expired KV blocks for request ${r.requestId} …`,
    }),
  )

  it('places the k-th rise on the k-th grant, from the scrape before it was sent to the one that showed it', () => {
    const m = sampledReleases({
      requests: reqs,
      settings,
      observedUntilMs: T0 + 20 * S,
      expiredCounter: scrapes,
      traffic,
    })
    expect([...m.entries()]).toEqual([
      ['cmpl-a-0', [T0 + 5950, T0 + 6200]],
      ['cmpl-b-0', [T0 + 6150, T0 + 6400]],
    ])
  })

  it('adds the sampled interval to a log pass as evidence, the verdict still resting on the line', () => {
    const [a] = judge({logReleases: lines, expiredCounter: scrapes, traffic})
    expect(a!.verdict).toBe('pass')
    expect(a!.evidence.releasedIn).toEqual([T0 + 6 * S, T0 + 7 * S])
    expect(a!.evidence.releasedInSampled).toEqual([T0 + 5950, T0 + 6200])
    expect(a!.evidence.sampledMeetsLogSecond).toBe(true)
  })

  it('gives no sampled time when P is not shown idle or the requests overlapped (the rise could be anyone)', () => {
    expect(judge({logReleases: lines, expiredCounter: scrapes})[0]!.evidence.releasedInSampled).toBeUndefined()
    const overlapping = [reqs[0]!, {...reqs[1]!, sentMs: T0 + 10}]
    const m = sampledReleases({
      requests: overlapping,
      settings,
      observedUntilMs: T0 + 20 * S,
      expiredCounter: scrapes,
      traffic,
    })
    expect(m.size).toBe(0)
  })
})
