import {describe, expect, it} from 'vitest'

import type {LogRelease} from '../../src/checks/kv-lease.js'
import {judgeWedgeLeases, type KvWedgeInput, wedgeWindow} from '../../src/checks/kv-wedge.js'

const T0 = Date.UTC(2026, 11, 4, 12, 0, 0, 0)
const S = 1000
// kv_lease_duration 12: extension 8, interval 2; a step bound of 500 ms (assumed).
const settings: KvWedgeInput['settings'] = {
  mode: 'lease',
  duration: {seconds: 12, source: 'P cmdline'},
  extension: {seconds: 8, source: 'P derived'},
  heartbeatInterval: {seconds: 2, source: 'D derived'},
  stepMs: 500,
  reaperMs: 500,
  stepAssumed: 'a step is not readable from outside',
}
// Renewed: granted at T0, D stopped 8 s later (its deadline is then the heartbeats'); fresh: granted 1 s before.
const renewed = {requestId: 'cmpl-r-0', sentMs: T0, answeredMs: T0 + 50}
const fresh = {requestId: 'cmpl-f-0', sentMs: T0 + 7 * S, answeredMs: T0 + 7 * S + 50}
const stop = {startMs: T0 + 8 * S, endMs: T0 + 8 * S + 100, what: 'SIGSTOP of D'}
const release = (t: number, id: string, cause: LogRelease['cause'] = 'lease-expired'): LogRelease => ({
  t,
  resolutionMs: 1000,
  requestId: id,
  cause,
  line: `WARNING … Releasing expired KV blocks for request ${id} …`,
})
const input = (over: Partial<KvWedgeInput>): KvWedgeInput => ({
  requests: [renewed],
  settings,
  stop,
  logReleases: [],
  observedUntilMs: T0 + 30 * S,
  ...over,
})
const judge = (over: Partial<KvWedgeInput>) => judgeWedgeLeases(input(over))[0]!

describe('the vLLM lease check when D stops heartbeating', () => {
  it('bounds a renewed lease from the stop when P logs no renewals, and says which edges are assumed', () => {
    const w = wedgeWindow(input({}), renewed)
    // open: stop − interval − step + extension = 8 − 2 − 0.5 + 8 = 13.5 s > grant + 12 s
    expect(w.open.ms).toBe(T0 + 13.5 * S)
    expect(w.open.assumed).toContain('heartbeated every interval')
    // close: stop end + step + extension, + step + reaper
    expect(w.close.ms).toBe(stop.endMs + 500 + 8 * S + 1000)
    expect(w.close.assumed).toContain('in flight at the stop')
  })

  it("uses P's logged renewals for the heartbeat edges: the open edge is then firm", () => {
    const renewals = [{t: T0 + 7 * S, resolutionMs: 1000, requestId: 'cmpl-r-0', line: 'DEBUG … Heartbeat extended'}]
    const w = wedgeWindow(input({renewals}), renewed)
    expect([w.open.ms, w.open.assumed]).toEqual([T0 + 15 * S, undefined])
    expect(w.close.ms).toBe(T0 + 16 * S + 1000)
    expect(w.close.assumed).toBe(settings.stepAssumed)
  })

  it('keeps the grant edge for a fresh lease (granted just before the stop)', () => {
    const w = wedgeWindow(input({requests: [fresh]}), fresh)
    expect([w.open.ms, w.open.by]).toEqual([fresh.sentMs + 12 * S, 'sent + duration'])
    expect(w.open.assumed).toBeUndefined()
  })

  it('passes a release in the window', () => {
    const v = judge({logReleases: [release(T0 + 15 * S, 'cmpl-r-0')]})
    expect([v.verdict, v.summary]).toEqual([
      'pass',
      "released by the lease's reaper in its window after D's heartbeats stopped",
    ])
    expect(v.evidence.stop).toContain('SIGSTOP of D')
  })

  it('fails early a fresh lease freed before grant + duration (the grant edge is firm)', () => {
    const v = judge({requests: [fresh], logReleases: [release(T0 + 16 * S, 'cmpl-f-0')]})
    expect([v.verdict, v.evidence.failure, v.evidence.earlyByMs]).toEqual(['fail', 'early', 2 * S])
  })

  it('is unverified, not fail, for a release before an assumed heartbeat edge but after the grant edge', () => {
    const v = judge({logReleases: [release(T0 + 12 * S, 'cmpl-r-0')]})
    expect(v.verdict).toBe('unverified')
    expect(v.evidence.toVerify).toContain('DEBUG')
  })

  it('fails early a renewed lease freed before the grant edge, assumption or not', () => {
    const v = judge({logReleases: [release(T0 + 9 * S, 'cmpl-r-0')]})
    expect([v.verdict, v.evidence.failure]).toEqual(['fail', 'early'])
  })

  it('is unverified, not fail, for a release past a close edge that rests on the assumed step', () => {
    const v = judge({logReleases: [release(T0 + 20 * S, 'cmpl-r-0')]})
    expect(v.verdict).toBe('unverified')
    expect(v.evidence.lateByMs).toBeGreaterThan(0)
  })

  it('fails late past a close edge that rests on nothing assumed', () => {
    const firm = {...settings}
    delete firm.stepAssumed
    const renewals = [{t: T0 + 7 * S, resolutionMs: 1000, requestId: 'cmpl-r-0', line: 'DEBUG …'}]
    const v = judge({settings: firm, renewals, logReleases: [release(T0 + 20 * S, 'cmpl-r-0')]})
    expect([v.verdict, v.evidence.failure]).toEqual(['fail', 'late'])
  })

  it('fails "never" once the log was read past the window with no release line', () => {
    const v = judge({})
    expect([v.verdict, v.evidence.failure]).toEqual(['fail', 'never'])
  })

  it('is unverified while the window is still open, and without a readable log', () => {
    expect(judge({observedUntilMs: T0 + 15 * S}).verdict).toBe('unverified')
    const v = judgeWedgeLeases({...input({}), logReleases: undefined})[0]!
    expect([v.verdict, v.summary]).toEqual(['unverified', "P's log unreadable"])
  })

  it('fails a release by another path than the reaper', () => {
    const v = judge({logReleases: [release(T0 + 15 * S, 'cmpl-r-0', 'legacy-timeout')]})
    expect(v.verdict).toBe('fail')
  })

  it('is unverified without the lease settings', () => {
    const v = judge({settings: {mode: 'unknown'}})
    expect([v.verdict, v.summary]).toEqual(['unverified', 'lease settings unknown'])
  })
})
