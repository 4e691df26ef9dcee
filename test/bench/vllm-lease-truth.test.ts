import {describe, expect, it} from 'vitest'

import {leaseTruth, pinnedTruth, releaseEstimate, type TruthEvent} from '../../scripts/bench-vllm-lease-truth.js'

/** The benchmark's truth verdict (scripts/bench-vllm-lease-truth.ts) on hand-written truth logs of the vLLM twin. */
const o = {durationMs: 4000, extensionMs: 2000, stepMs: 25, tolMs: 1}
const ev = (t: number, event: string, detail?: TruthEvent['detail']): TruthEvent => ({t, rid: 'r', event, detail})

describe('leaseTruth', () => {
  it('passes a lease-expired release at grant + duration, within one step', () => {
    const t = leaseTruth([ev(1000, 'granted'), ev(5010, 'freed', {cause: 'lease-expired'})], 'r', o)
    expect([t.verdict, t.deadlineMs, t.deadlineBy, t.lateMs]).toEqual(['pass', 5000, 'grant', 10])
  })

  it('moves the deadline to the last applied renewal, so a release at grant + duration is early', () => {
    const log = [ev(1000, 'granted'), ev(3500, 'heartbeat', {toMs: 5500}), ev(5000, 'freed', {cause: 'lease-expired'})]
    expect(leaseTruth(log, 'r', o)).toMatchObject({verdict: 'fail', why: 'early', deadlineMs: 5500})
  })

  it('counts a dropped renewal (no-renew) as one a correct P applies', () => {
    const log = [ev(1000, 'granted'), ev(4900, 'heartbeat-dropped'), ev(5000, 'freed', {cause: 'lease-expired'})]
    expect(leaseTruth(log, 'r', o)).toMatchObject({verdict: 'fail', why: 'early', deadlineBy: 'heartbeat-dropped'})
  })

  it('uses the nominal duration, not the expiry the twin granted (expire-early halves it)', () => {
    const log = [ev(1000, 'granted', {expiryMs: 3000}), ev(3005, 'freed', {cause: 'lease-expired'})]
    expect(leaseTruth(log, 'r', o)).toMatchObject({verdict: 'fail', why: 'early'})
  })

  it('fails never, late, and a release by a notification', () => {
    expect(leaseTruth([ev(1000, 'granted')], 'r', o).why).toBe('never')
    expect(leaseTruth([ev(1000, 'granted'), ev(5100, 'freed', {cause: 'lease-expired'})], 'r', o).why).toBe('late')
    expect(leaseTruth([ev(1000, 'granted'), ev(5000, 'freed', {cause: 'read-notified'})], 'r', o).why).toBe(
      'other-path',
    )
  })
})

describe('pinnedTruth', () => {
  it('is pinned when renewals reached P and nothing freed it before the revert', () => {
    const log = [ev(1000, 'granted'), ev(2000, 'heartbeat', {toMs: 4000}), ev(9000, 'freed', {cause: 'read-notified'})]
    expect(pinnedTruth(log, 'r', 8000).pinned).toBe(true)
    expect(pinnedTruth(log, 'r', 9500).pinned).toBe(false)
    expect(pinnedTruth([ev(1000, 'granted')], 'r', 8000).pinned).toBe(false)
  })
})

describe('releaseEstimate', () => {
  it("takes the sampled interval's middle when there is one, else the log second's", () => {
    expect(releaseEstimate({releasedIn: [1000, 2000], releasedInSampled: [1200, 1400]})).toMatchObject({
      ms: 1300,
      from: 'sampled',
    })
    expect(releaseEstimate({releasedIn: [1000, 2000]})).toMatchObject({ms: 1500, from: 'log-second'})
    expect(releaseEstimate({})).toBeUndefined()
  })
})
