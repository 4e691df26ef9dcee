import {describe, expect, it} from 'vitest'

import type {KvLeaseSettings, LogRelease} from '../../src/checks/kv-lease.js'
import {type KvPinnedInput, judgeKvPinned, pinnedBoundMs, type StalledRequest} from '../../src/checks/kv-pinned.js'

const T0 = Date.UTC(2026, 11, 4, 12, 0, 0)
const settings: KvLeaseSettings = {
  mode: 'lease',
  duration: {seconds: 4, source: 'cmdline'},
  extension: {seconds: 2, source: 'derived'},
  heartbeatInterval: {seconds: 0, source: 'derived'},
  stepMs: 500,
  reaperMs: 500,
  stepAssumed: 'assumed',
}
const req = (over: Partial<StalledRequest> = {}): StalledRequest => ({
  requestId: 'cmpl-a-0',
  sentMs: T0,
  answeredMs: T0 + 50,
  decodeSentMs: T0 + 60,
  ...over,
})
const line = (t: number, id = 'cmpl-a-0'): LogRelease => ({
  t,
  resolutionMs: 1000,
  requestId: id,
  cause: 'lease-expired',
  line: `WARNING Releasing expired KV blocks for request ${id} which were retrieved by 0 remote worker(s) before lease expired.`,
})
const input = (over: Partial<KvPinnedInput> = {}): KvPinnedInput => ({
  requests: [req()],
  settings,
  logReleases: [],
  observedUntilMs: T0 + 12_600,
  decode: {healthy: true, waiting: 1, t: T0 + 12_650},
  matchedPackets: 8,
  heartbeats: {reachedP: true, evidence: "P's side channel received 900 byte(s) from D during the stall"},
  ...over,
})

describe('kv-pinned: a READ stalled while D heartbeats', () => {
  it('the bound is answered + 2 x duration + extension + step + reaper + the log second', () => {
    expect(pinnedBoundMs(req(), settings) - (T0 + 50)).toBe(8000 + 2000 + 1000 + 1000)
  })

  it('fails "pinned" when no release line came by the bound while D still held the request', () => {
    const [v] = judgeKvPinned(input())
    expect([v!.verdict, v!.evidence.failure]).toEqual(['fail', 'pinned'])
    expect(v!.summary).toMatch(/^pinned: P held the blocks 12\.6 s \(8\.6 s past the 4 s lease\) while D heartbeated/)
    expect(String(v!.evidence.held)).toMatch(/num_requests_waiting 1 >= 1/)
  })

  it('is unverified, not pinned, when D no longer counts the request waiting (D may have dropped it)', () => {
    const [v] = judgeKvPinned(input({decode: {healthy: true, waiting: 0, t: T0 + 12_650}}))
    expect(v!.verdict).toBe('unverified')
  })

  it('is unverified before the bound: the observation was too short to call it pinned', () => {
    const [v] = judgeKvPinned(input({observedUntilMs: T0 + 9000}))
    expect([v!.verdict, v!.summary]).toEqual(['unverified', 'observation ended before the bound'])
  })

  it('fails "freed-early" when P released by lease expiry while D still held and renewed the request', () => {
    const [v] = judgeKvPinned(input({logReleases: [line(T0 + 4000)]}))
    expect([v!.verdict, v!.evidence.failure]).toEqual(['fail', 'freed-early'])
    expect(v!.summary).toMatch(/^freed while D renewed/)
  })

  it("is unverified, not freed-early, when D's heartbeats were not seen reaching P (they may share the stalled path)", () => {
    const [v] = judgeKvPinned(
      input({logReleases: [line(T0 + 4000)], heartbeats: {reachedP: false, evidence: 'no traffic'}}),
    )
    expect(v!.verdict).toBe('unverified')
    expect(String(v!.evidence.why)).toMatch(/may have cut D's heartbeats too \(no traffic\)/)
  })

  it('passes a release by lease expiry after D failed the READ (its leg answered 500), inside its window', () => {
    const settled = {atMs: T0 + 2100, status: 500}
    const [v] = judgeKvPinned(input({requests: [req({decodeSettled: settled})], logReleases: [line(T0 + 4000)]}))
    expect([v!.verdict, v!.summary]).toEqual(['pass', 'released by lease expiry after D stopped (its READ failed)'])
    expect(v!.evidence.line).toContain('cmpl-a-0')
  })

  it('fails "never" when D failed the READ and its last renewal ran out with no release line', () => {
    const [v] = judgeKvPinned(input({requests: [req({decodeSettled: {atMs: T0 + 2100, status: 500}})]}))
    expect([v!.verdict, v!.evidence.failure]).toEqual(['fail', 'never'])
  })

  it('is unverified when the READ completed during the stall (D answered 200): the stall did not hold it', () => {
    const [v] = judgeKvPinned(input({requests: [req({decodeSettled: {atMs: T0 + 300, status: 200}})]}))
    expect([v!.verdict, v!.summary]).toEqual(['unverified', 'the READ was not stalled'])
  })

  it("is unverified when P's log could not be read, and for a P without the lease", () => {
    expect(judgeKvPinned(input({logReleases: undefined}))[0]!.verdict).toBe('unverified')
    expect(judgeKvPinned(input({settings: {...settings, mode: 'legacy'}}))[0]!.summary).toBe('not a lease-era P')
  })

  it('fails "early" for a release before grant + duration after D had stopped', () => {
    const settled = {atMs: T0 + 500, error: 'socket hang up'}
    const [v] = judgeKvPinned(input({requests: [req({decodeSettled: settled})], logReleases: [line(T0 + 1000)]}))
    expect([v!.verdict, v!.evidence.failure]).toEqual(['fail', 'early'])
  })
})

describe("kv-pinned: a release before D's last renewal ran out (D failed the READ after heartbeating)", () => {
  // D renewed every step until its leg answered 500 at T0 + 3100: P's lease ran to about T0 + 5100. A release logged
  // in [T0 + 4000, T0 + 5000) (a P that dropped the renewals frees at grant + 4 s) came before that.
  const settled = {atMs: T0 + 3100, status: 500}

  it('is unverified, never pass, when the log second ends before settled − interval − step + extension', () => {
    const tight = {...settings, stepMs: 20}
    const [v] = judgeKvPinned(
      input({settings: tight, requests: [req({decodeSettled: settled})], logReleases: [line(T0 + 4000)]}),
    )
    expect([v!.verdict, v!.summary]).toEqual(['unverified', "released 80 ms or more before D's last renewal ran out"])
    expect(v!.evidence.renewalEdgeMs).toBe(T0 + 5080)
  })

  it("still passes when D's heartbeats were not seen reaching P, or the line ends past the edge", () => {
    const tight = {...settings, stepMs: 20}
    const unseen = input({
      settings: tight,
      heartbeats: {reachedP: false, evidence: 'none'},
      requests: [req({decodeSettled: settled})],
      logReleases: [line(T0 + 4000)],
    })
    expect(judgeKvPinned(unseen)[0]!.verdict).toBe('pass')
    // With the assumed 500 ms step the edge is T0 + 4600: a line ending at T0 + 5000 is not shown early.
    const loose = input({requests: [req({decodeSettled: settled})], logReleases: [line(T0 + 4000)]})
    expect(judgeKvPinned(loose)[0]!.verdict).toBe('pass')
  })
})
