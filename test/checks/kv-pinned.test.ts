import {describe, expect, it} from 'vitest'

import type {KvLeaseSettings, LogRelease} from '../../src/checks/kv-lease.js'
import {
  type KvPinnedInput,
  judgeKvPinned,
  type PinnedRenewal,
  pinnedBoundMs,
  type StalledRequest,
} from '../../src/checks/kv-pinned.js'

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

describe("kv-pinned with P's renewal lines (DEBUG, nixl/base_worker.py _handle_heartbeat)", () => {
  const renewal = (t: number, id = 'cmpl-a-0'): PinnedRenewal => ({
    t,
    resolutionMs: 1000,
    requestId: id,
    extensionS: 2,
    line: `DEBUG Heartbeat extended lease for request ${id} by 2s (old_expiry=1.0, new_expiry=3.0)`,
  })
  const debugEnv = {debug: true, evidence: "P's environment (/proc/1/environ): VLLM_LOGGING_LEVEL=DEBUG"}
  const infoEnv = {debug: false, evidence: "P's environment (/proc/1/environ): unset: vLLM's default INFO"}
  const hb = {reachedP: true, evidence: "P's side channel received 15619 byte(s) from D during the stall"}

  // BENCHMARKS.md, stall-kv with --xfer-stall-timeout 2 and --vllm-bug no-renew, round 0 (first request): sent at
  // window open − 4 s, D's READ failed ~2 s later, P (dropping every renewal) freed at grant + 4 s, 45.5 ms before
  // a correct P's deadline: inside the same log second, so no release time shows it. The missing renewals do.
  const xfer2 = input({
    requests: [
      req({
        sentMs: 1796397049736,
        answeredMs: 1796397049776,
        decodeSentMs: 1796397049781,
        decodeSettled: {atMs: 1796397051800, status: 500},
      }),
    ],
    logReleases: [line(1796397053000)],
    observedUntilMs: 1796397062400,
    heartbeats: hb,
    renewals: [],
  })
  // --xfer-stall-timeout 3, no-renew, round 0: freed 1030.6 ms before the deadline D's last renewal set.
  const xfer3 = input({
    requests: [
      req({
        sentMs: 1796396917055,
        answeredMs: 1796396917080,
        decodeSentMs: 1796396917085,
        decodeSettled: {atMs: 1796396920091, status: 500},
      }),
    ],
    logReleases: [line(1796396921000)],
    observedUntilMs: 1796396929700,
    heartbeats: hb,
    renewals: [],
  })

  it('fails "not-renewed" on both no-renew journals when P logs at DEBUG (its environment says so)', () => {
    for (const run of [xfer2, xfer3]) {
      const [v] = judgeKvPinned({...run, prefillLogLevel: debugEnv})
      expect([v!.verdict, v!.evidence.failure]).toEqual(['fail', 'not-renewed'])
      expect(v!.evidence.debug).toContain('VLLM_LOGGING_LEVEL=DEBUG')
      expect(String(v!.evidence.noRenewal)).toContain('Heartbeat extended lease for request cmpl-a-0')
    }
  })

  it("fails it too when P's environment was not read but P logged renewals of another request of the run", () => {
    const [v] = judgeKvPinned({...xfer3, renewals: [renewal(1796396918000, 'cmpl-b-0')]})
    expect([v!.verdict, v!.evidence.failure]).toEqual(['fail', 'not-renewed'])
    expect(v!.evidence.debug).toMatch(/renewals of other requests/)
  })

  it("does not fail it when D's heartbeats were not seen reaching P, or D held the request under one interval", () => {
    const unseen = judgeKvPinned({...xfer3, prefillLogLevel: debugEnv, heartbeats: {reachedP: false, evidence: '0'}})
    expect(unseen[0]!.evidence.failure).not.toBe('not-renewed')
    // A 30 s lease heartbeats every 5 s: a READ failing 3 s after D took the request may have met no heartbeat.
    const slow = {...settings, heartbeatInterval: {seconds: 5, source: 'derived'}}
    const [v] = judgeKvPinned({...xfer3, settings: slow, prefillLogLevel: debugEnv})
    expect(v!.evidence.failure).not.toBe('not-renewed')
  })

  it("P not shown at DEBUG: today's rule, unverified where the release could precede D's last renewal", () => {
    const settled = {atMs: T0 + 3100, status: 500}
    const [v] = judgeKvPinned(
      input({
        settings: {...settings, stepMs: 20},
        requests: [req({decodeSettled: settled})],
        logReleases: [line(T0 + 4000)],
        renewals: [],
        prefillLogLevel: infoEnv,
      }),
    )
    expect(v!.verdict).toBe('unverified')
    expect(v!.evidence.toVerify).toMatch(/set VLLM_LOGGING_LEVEL=DEBUG on P/)
    expect(v!.evidence.prefillLogLevel).toContain("vLLM's default INFO")
  })

  it('fails "freed-early" when the release\'s second ends before P\'s own last renewal + extension', () => {
    const settled = {atMs: T0 + 3100, status: 500}
    const renewals = [renewal(T0 + 1000), renewal(T0 + 2000), renewal(T0 + 3000)]
    const run = input({requests: [req({decodeSettled: settled})], renewals, prefillLogLevel: debugEnv})
    // Renewed in [T0 + 3000, T0 + 4000) by 2 s: P's deadline was at least T0 + 5000; a line of [T0 + 4000, T0 + 5000)
    // ends there: early. Firm, whatever D's heartbeats or the assumed step: both stamps are P's own log.
    const [v] = judgeKvPinned({...run, logReleases: [line(T0 + 4000)], heartbeats: {reachedP: false, evidence: '?'}})
    expect([v!.verdict, v!.evidence.failure]).toEqual(['fail', 'freed-early'])
    expect(v!.evidence.lastRenewal).toContain('Heartbeat extended lease for request cmpl-a-0')
    // The next second may hold the deadline: not early.
    expect(judgeKvPinned({...run, logReleases: [line(T0 + 5000)]})[0]!.verdict).toBe('pass')
  })

  it("passes the correct twin's run: renewals until D's READ failed, the release after the last one + 2 s", () => {
    // BENCHMARKS.md, --xfer-stall-timeout 3 on a twin without a defect, round 0: D's leg answered 500 at
    // 1796396851078, P's last renewal in the second 1796396851000, freed 1796396853098 (2.6 ms past its deadline).
    const renewals = [848000, 849000, 850000, 851000].flatMap(s => [
      renewal(1796396000000 + s),
      renewal(1796396000000 + s, 'cmpl-b-0'),
    ])
    const [v] = judgeKvPinned(
      input({
        requests: [
          req({
            sentMs: 1796396848021,
            answeredMs: 1796396848050,
            decodeSentMs: 1796396848055,
            decodeSettled: {atMs: 1796396851078, status: 500},
          }),
        ],
        logReleases: [line(1796396853000)],
        observedUntilMs: 1796396860800,
        heartbeats: hb,
        renewals,
        prefillLogLevel: debugEnv,
      }),
    )
    expect([v!.verdict, v!.summary]).toEqual(['pass', 'released by lease expiry after D stopped (its READ failed)'])
  })
})
