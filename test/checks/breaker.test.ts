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
  it(
    "a 503 while the breaker the fault opened is still open is the fault's reach, not collateral; the opening is " +
      'reported',
    () => {
      const t = tl([
        {kind: 'marker', t: T + 10_500, name: 'router-breaker-open', detail: 'http://p:30000'},
        {kind: 'marker', t: T + 40_000, name: 'router-breaker-closed', detail: 'http://p:30000'},
      ])
      expect(checkCollateral(t).verdict).toBe('pass')
      const b = checkRecovery(t).find(v => v.subject === 'router circuit breaker')!
      expect(b).toMatchObject({
        verdict: 'pass',
        summary: expect.stringMatching(
          /opened the router's circuit breaker \(http:\/\/p:30000\); it closed again 29\.5s later/,
        ),
      })
    },
  )

  it('without a breaker marker the same 503 is collateral, and a breaker that never closed fails recovery', () => {
    expect(checkCollateral(tl([])).verdict).toBe('fail')
    const stuck = tl([{kind: 'marker', t: T + 10_500, name: 'router-breaker-open', detail: 'w'}])
    expect(checkRecovery(stuck).find(v => v.subject === 'router circuit breaker')?.verdict).toBe('fail')
  })
})

describe('a breaker that opened after the wait, found by the canaries', () => {
  // The wait saw the breaker closed; late failures opened it; the first canaries were refused, the batch waited for
  // it and sent them again (marker canaries-again).
  const late: Observation[] = [
    {kind: 'request-sent', t: T + 12_500, rid: 'canary-1', role: 'canary'},
    {
      kind: 'request-answered',
      t: T + 12_600,
      rid: 'canary-1',
      status: 503,
      detail: 'No available servers: No available prefill workers (all circuits open or unhealthy)',
    },
    {kind: 'marker', t: T + 12_700, name: 'router-breaker-open', detail: 'http://p:30000'},
    {kind: 'marker', t: T + 22_700, name: 'router-breaker-closed', detail: 'http://p:30000'},
    {kind: 'marker', t: T + 22_800, name: 'canaries-again', detail: 'x'},
    {kind: 'request-sent', t: T + 22_900, rid: 'canary-2', role: 'canary'},
  ]

  it('the refused round is evidence, the round sent again is judged; load refused meanwhile is in reach', () => {
    const t = tl([...late, {kind: 'request-answered', t: T + 23_000, rid: 'canary-2', status: 200}])
    const r = checkRecovery(t).find(v => v.subject === 'requests')!
    expect(r).toMatchObject({
      verdict: 'pass',
      summary: expect.stringMatching(/1 of 1 requests after the revert succeeded, sent again once the circuit breaker/),
    })
    expect(r.evidence).toMatchObject({refusedByOpenBreaker: [{rid: 'canary-1', status: 503}]})
    expect(checkCollateral(t).verdict).toBe('pass')
  })

  it('a round sent again that fails still fails recovery', () => {
    const t = tl([...late, {kind: 'request-answered', t: T + 23_000, rid: 'canary-2', status: 500}])
    expect(checkRecovery(t).find(v => v.subject === 'requests')?.verdict).toBe('fail')
  })

  it('load refused after a window closed again is collateral', () => {
    const t = tl([
      ...late,
      {kind: 'request-answered', t: T + 23_000, rid: 'canary-2', status: 200},
      {kind: 'request-sent', t: T + 24_000, rid: 'load-2', role: 'load'},
      {kind: 'request-answered', t: T + 24_010, rid: 'load-2', status: 503},
    ])
    expect(checkCollateral(t)).toMatchObject({verdict: 'fail', summary: expect.stringMatching(/load-2 \(503\)/)})
  })
})
