import {describe, expect, it} from 'vitest'

import {checkCollateral} from '../../src/checks/collateral.js'
import {checkRecovery} from '../../src/checks/recovery.js'
import type {Observation, Timeline} from '../../src/model/timeline.js'

const T = 1_000_000
const tl = (extra: Observation[]): Timeline => ({
  contract: {scope: 'all', deadlineSeconds: 3, pollSeconds: 0.5},
  calibration: {prefillMs: 20, prefillSpreadMs: 2, observeMs: 2, samples: 8},
  observations: [
    {kind: 'fault-injected', t: T, fault: 'wedge-rank', leaseId: 'L', verified: true, evidence: ''},
    {kind: 'fault-reverted', t: T + 10_000, fault: 'wedge-rank', leaseId: 'L', verifiedClean: true, evidence: ''},
    // A load request sent after the revert, refused by the open breaker.
    {kind: 'request-sent', t: T + 12_000, rid: 'load-1', role: 'load'},
    {kind: 'request-answered', t: T + 12_010, rid: 'load-1', status: 503},
    ...extra,
  ].sort((a, b) => a.t - b.t),
})

describe("the gateway's circuit breaker after a fault", () => {
  it('a 503 while the breaker the fault opened is still open is the fault\'s reach, not collateral; the opening is reported', () => {
    const t = tl([
      {kind: 'marker', t: T + 10_500, name: 'router-breaker-open', detail: 'http://p:30000'},
      {kind: 'marker', t: T + 40_000, name: 'router-breaker-closed', detail: 'http://p:30000'},
    ])
    expect(checkCollateral(t).verdict).toBe('pass')
    const b = checkRecovery(t).find((v) => v.subject === 'router circuit breaker')!
    expect(b).toMatchObject({verdict: 'pass', summary: expect.stringMatching(/opened the router's circuit breaker \(http:\/\/p:30000\); it closed again 29\.5s later/)})
  })

  it('without a breaker marker the same 503 is collateral, and a breaker that never closed fails recovery', () => {
    expect(checkCollateral(tl([])).verdict).toBe('fail')
    const stuck = tl([{kind: 'marker', t: T + 10_500, name: 'router-breaker-open', detail: 'w'}])
    expect(checkRecovery(stuck).find((v) => v.subject === 'router circuit breaker')?.verdict).toBe('fail')
  })
})
