import {describe, expect, it} from 'vitest'

import {judgeKvLeases, type KvLeaseInput, type LogRelease} from '../../src/checks/kv-lease.js'

const T0 = Date.UTC(2026, 11, 4, 12, 0, 0, 0)
const S = 1000
const settings: KvLeaseInput['settings'] = {
  mode: 'lease',
  duration: {seconds: 6, source: 'kv_transfer_config'},
  stepMs: 20,
  reaperMs: 20,
}
const req = {requestId: 'cmpl-a-0', sentMs: T0, answeredMs: T0 + 50, decodeSent: false}
const line = (t: number, cause: LogRelease['cause'] = 'lease-expired', id = 'cmpl-a-0'): LogRelease => ({
  t,
  resolutionMs: 1000,
  requestId: id,
  cause,
  line: `WARNING … Releasing expired KV blocks for request ${id} …`,
})
const judge = (over: Partial<KvLeaseInput>) =>
  judgeKvLeases({requests: [req], settings, logReleases: [], observedUntilMs: T0 + 20 * S, ...over})[0]!

describe('the vLLM lease check', () => {
  it('passes a release logged in the second the lease ran out', () => {
    const v = judge({logReleases: [line(T0 + 6 * S)]})
    expect(v.verdict).toBe('pass')
    expect(v.evidence.line).toContain('cmpl-a-0')
    expect(v.evidence.clock).toBeDefined()
  })

  it('passes when the log second straddles the window start (1 s resolution)', () => {
    expect(judge({logReleases: [line(T0 + 5 * S + 500)]}).verdict).toBe('pass')
  })

  it('fails a release logged a whole second before the window opens (early)', () => {
    const v = judge({logReleases: [line(T0 + 3 * S)]})
    expect(v.verdict).toBe('fail')
    expect(v.evidence.failure).toBe('early')
    expect(v.evidence.earlyByMs).toBe(2 * S)
  })

  it('does not fail as late a release past a window whose step bound was assumed, not read', () => {
    const v = judge({
      settings: {...settings, stepAssumed: 'engine step + reaper pass 1000 ms (assumed)'},
      logReleases: [line(T0 + 8 * S)],
    })
    expect(v.verdict).toBe('unverified')
    expect(String(v.evidence.why)).toMatch(/assumption \(engine step \+ reaper pass 1000 ms/)
  })

  it('fails a release logged after the window closed (late)', () => {
    const v = judge({logReleases: [line(T0 + 8 * S)]})
    expect(v.verdict).toBe('fail')
    expect(v.evidence.failure).toBe('late')
  })

  it('fails a pin never released once the window closed and the log was read past it', () => {
    const v = judge({logReleases: [line(T0 + 6 * S, 'lease-expired', 'cmpl-other-0')]})
    expect(v.verdict).toBe('fail')
    expect(v.evidence.failure).toBe('never')
  })

  it('is unverified when the log was read before the window closed', () => {
    const v = judge({observedUntilMs: T0 + 6 * S})
    expect(v.verdict).toBe('unverified')
    expect(v.evidence.toVerify).toBe('read it later')
  })

  it('fails a release by the legacy path under a lease', () => {
    const v = judge({logReleases: [line(T0 + 6 * S, 'legacy-timeout')]})
    expect(v.verdict).toBe('fail')
    expect(v.summary).toContain('legacy-timeout')
  })

  it('judges the legacy abort timeout with its own line', () => {
    const legacy = {...settings, mode: 'legacy' as const, duration: {seconds: 120, source: 'environment'}}
    const v = judge({
      settings: legacy,
      logReleases: [line(T0 + 120 * S, 'legacy-timeout')],
      observedUntilMs: T0 + 200 * S,
    })
    expect(v.verdict).toBe('pass')
  })

  it('is unverified when the settings are unknown', () => {
    const v = judge({settings: {mode: 'unknown'}, logReleases: [line(T0 + 6 * S)]})
    expect(v.verdict).toBe('unverified')
    expect(v.evidence.toVerify).toContain('kv_lease_duration')
  })

  it('is unverified when D was sent the request (heartbeats may renew)', () => {
    const v = judgeKvLeases({
      requests: [{...req, decodeSent: true}],
      settings,
      logReleases: [line(T0 + 6 * S)],
      observedUntilMs: T0 + 20 * S,
    })[0]!
    expect(v.verdict).toBe('unverified')
  })

  it('is unverified when the log is unreadable and the counter cannot name the request', () => {
    const counter = [
      {t: T0 - 100, value: 3},
      {t: T0 + 7 * S, value: 5}, // +2 for a batch of 1: another request's expiry could explain it
    ]
    const v = judge({logReleases: undefined, expiredCounter: counter})
    expect(v.verdict).toBe('unverified')
    expect(v.evidence.why).toContain('no line')
  })

  it('passes on the counter when it moved by exactly the batch, after every window opened', () => {
    const counter = [
      {t: T0 - 100, value: 3},
      {t: T0 + 5 * S, value: 3},
      {t: T0 + 6 * S + 60, value: 4},
    ]
    // P otherwise idle (test/checks/kv-lease-counter.test.ts has the cases where it is not shown).
    const traffic = [
      {t: T0 - 100, finished: 7, kvUsage: 0},
      {t: T0 + 7 * S, finished: 8},
    ]
    const v = judge({logReleases: undefined, expiredCounter: counter, traffic})
    expect(v.verdict).toBe('pass')
    expect(String(v.evidence.by)).toContain('+1')
  })

  it('does not pass on a counter sampled only after the window closed (a late release would look the same)', () => {
    const counter = [
      {t: T0 - 100, value: 3},
      {t: T0 + 5 * S, value: 3},
      {t: T0 + 9 * S, value: 4},
    ]
    expect(judge({logReleases: undefined, expiredCounter: counter}).verdict).toBe('unverified')
  })

  it('never counts an unrecognized-notification line as the release', () => {
    const v = judge({logReleases: [line(T0 + 6 * S, 'unrecognized-notification')]})
    expect(v.verdict).toBe('fail')
    expect(v.evidence.failure).toBe('never')
  })
})
