import {describe, expect, it} from 'vitest'

import {type AbortedLeaseInput, abortReleaseWindow, judgeAbortedLease} from '../../src/checks/kv-lease-abort.js'
import type {LogRelease} from '../../src/checks/kv-lease.js'

const T0 = Date.UTC(2026, 11, 4, 12, 0, 0, 0)
const S = 1000
const line = (t: number, cause: LogRelease['cause'] = 'lease-expired', id = 'cmpl-a-0'): LogRelease => ({
  t,
  resolutionMs: 1000,
  requestId: id,
  cause,
  line: `WARNING … Releasing expired KV blocks for request ${id} …`,
})
// Lease 6 s, extension 4 s, 20 ms steps; P answered at +50 ms, D's leg aborted at +300 ms, D's gauge fell at +340.
const base: AbortedLeaseInput = {
  requestId: 'cmpl-a-0',
  sentMs: T0,
  answeredMs: T0 + 50,
  abortMs: T0 + 300,
  entry: {by: 'deferred', atMs: T0 + 290, detail: "D's deferred gauge 0 -> 1"},
  dAbortSeenMs: T0 + 340,
  readHeld: {held: true, evidence: 'rule in place, 12 packets matched'},
  settings: {
    mode: 'lease',
    duration: {seconds: 6, source: 'cmdline'},
    extension: {seconds: 4, source: 'derived'},
    stepMs: 20,
    reaperMs: 20,
  },
  logReleases: [],
  observedUntilMs: T0 + 20 * S,
}
const judge = (over: Partial<AbortedLeaseInput>) => judgeAbortedLease({...base, ...over})

describe('the vLLM lease check after an abort during the READ', () => {
  it('opens at grant + duration and closes at the later of the grant and the last renewal, plus step and reaper', () => {
    // max(answered + 6 s, fell + 20 ms + 4 s) + 40 ms = max(T0 + 6050, T0 + 4360) + 40.
    expect(abortReleaseWindow(base)).toMatchObject({openMs: T0 + 6 * S, closeMs: T0 + 6090})
    // An abort late in the lease: the last renewal decides, measured from when D was seen to drop the request.
    const late = abortReleaseWindow({...base, abortMs: T0 + 5 * S, dAbortSeenMs: T0 + 5100})!
    expect([late.openMs, late.closeMs]).toEqual([T0 + 6 * S, T0 + 5100 + 20 + 4 * S + 40])
    // D's drop not seen: abort + one step, and the bound says it was assumed.
    const unseen = abortReleaseWindow({...base, abortMs: T0 + 5 * S, dAbortSeenMs: undefined})!
    expect(unseen.closeMs).toBe(T0 + 5 * S + 20 + 20 + 4 * S + 40)
    expect(unseen.dAbortBy).toMatch(/assumed/)
  })

  it('passes an expiry line naming the request inside the window, with the abort and the clocks in evidence', () => {
    const v = judge({logReleases: [line(T0 + 6 * S)]})
    expect(v.verdict).toBe('pass')
    expect(v.summary).toBe('released by the lease expiry path in its window after the abort')
    expect(v.evidence.abortedAt).toBe(T0 + 300)
    expect(v.evidence.clock).toBeDefined()
  })

  it('fails a release logged before the abort (early, or not the abort path)', () => {
    const v = judge({abortMs: T0 + 7 * S, dAbortSeenMs: T0 + 7050, logReleases: [line(T0 + 5 * S)]})
    expect(v.verdict).toBe('fail')
    expect(v.evidence).toMatchObject({failure: 'early', beforeAbort: true})
  })

  it('fails a release after the abort but a whole second before grant + duration (expire-early)', () => {
    const v = judge({logReleases: [line(T0 + 3 * S)]})
    expect(v.verdict).toBe('fail')
    expect(v.evidence).toMatchObject({failure: 'early', beforeAbort: false, earlyByMs: 2 * S})
  })

  it('fails "never" only when the READ was held throughout and the deferred gauge showed the READ', () => {
    expect(judge({}).evidence.failure).toBe('never')
    const notHeld = judge({readHeld: {held: false, evidence: 'rule gone'}})
    expect(notHeld.verdict).toBe('unverified')
    expect(String(notHeld.evidence.why)).toMatch(/notification, which P does not log/)
    const onlyWaiting = judge({entry: {by: 'waiting', atMs: T0 + 290, detail: 'no deferred series'}})
    expect(onlyWaiting.verdict).toBe('unverified')
    expect(String(onlyWaiting.evidence.why)).toMatch(/waiting for blocks/)
  })

  it('is unverified, never pass, when nothing showed the request in D before the abort', () => {
    const v = judge({entry: {by: 'none', detail: 'gauge did not rise'}, logReleases: [line(T0 + 6 * S)]})
    expect(v.verdict).toBe('unverified')
    expect(v.summary).toBe("abort not shown inside D's READ")
  })

  it('fails a late release past a measured window, and is unverified past an assumed one', () => {
    expect(judge({logReleases: [line(T0 + 8 * S)]}).evidence.failure).toBe('late')
    const assumed = judge({
      settings: {...base.settings, stepAssumed: 'assumed 500 ms'},
      logReleases: [line(T0 + 8 * S)],
    })
    expect(assumed.verdict).toBe('unverified')
  })

  it('is unverified before the window closed, without the log, or without the settings', () => {
    expect(judge({observedUntilMs: T0 + 5 * S}).summary).toBe('window not yet closed')
    expect(judge({logReleases: undefined}).summary).toBe("P's log unreadable")
    expect(judge({settings: {mode: 'unknown'}}).summary).toBe('lease settings unknown')
  })

  it('fails a release by the legacy path where the lease was read, and judges legacy from the grant alone', () => {
    expect(judge({logReleases: [line(T0 + 6 * S, 'legacy-timeout')]}).verdict).toBe('fail')
    const legacy = {...base.settings, mode: 'legacy' as const, extension: undefined}
    expect(abortReleaseWindow({...base, settings: legacy})!.closeMs).toBe(T0 + 50 + 6 * S + 40)
    expect(judge({settings: legacy, logReleases: [line(T0 + 6 * S, 'legacy-timeout')]}).verdict).toBe('pass')
  })
})
