import {describe, expect, it} from 'vitest'

import {checkPeerRecovery} from '../../src/checks/peer-recovery.js'
import {heartbeatFromEnv} from '../../src/engines/sglang/discovery/heartbeat-bound.js'
import type {Observation, Timeline} from '../../src/model/timeline.js'

const T0 = 1_000_000

/** Canaries sent at these seconds after the role was healthy, each answered with its status (null: abandoned). */
function timeline(canaries: Array<[number, number | null, 'router' | 'direct', string?]>): Timeline {
  const observations: Observation[] = []
  canaries.forEach(([s, status, path, detail], i) => {
    const rid = `c${i}`
    const t = T0 + s * 1000
    observations.push({
      kind: 'request-sent',
      t,
      rid,
      role: 'canary',
      ...(path === 'direct' ? {path: 'direct' as const} : {}),
    })
    if (status === null) observations.push({kind: 'request-abandoned', t: t + 15_000, rid, detail: 'timeout'})
    else observations.push({kind: 'request-answered', t: t + 100, rid, status, ...(detail ? {detail} : {})})
  })
  return {
    contract: {scope: 'all', deadlineSeconds: 3, pollSeconds: 0.5},
    calibration: {prefillMs: 0, prefillSpreadMs: 0, observeMs: 0, samples: 0},
    observations,
  }
}

const hb = heartbeatFromEnv({
  SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL: '2',
  SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE: '2',
})

describe('heartbeatFromEnv', () => {
  it("reads decode's settings with SGLang's clamps and defaults; unread environment: unknown", () => {
    expect(hb).toMatchObject({intervalSeconds: 2, maxFailure: 2, boundSeconds: 4})
    expect(heartbeatFromEnv({})).toMatchObject({intervalSeconds: 5, maxFailure: 2, boundSeconds: 10})
    expect(heartbeatFromEnv({})!.source).toMatch(/unset \(SGLang's default\)/)
    expect(
      heartbeatFromEnv({
        SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL: '0.5',
        SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE: '0',
      }),
    ).toMatchObject({intervalSeconds: 2, maxFailure: 1, boundSeconds: 2})
    expect(heartbeatFromEnv(undefined)).toBeUndefined()
  })
})

describe('checkPeerRecovery', () => {
  const opts = {role: 'prefill' as const, healthyAt: T0, heartbeat: hb!, epsilonS: 0.5}

  it('passes when every canary after the bound completed, naming when the deployment was whole again', () => {
    const [v] = checkPeerRecovery(
      timeline([
        [0, 500, 'router'],
        [1.5, null, 'direct'],
        [2, 200, 'router'],
        [4.5, 200, 'router'],
        [5, 200, 'direct'],
      ]),
      opts,
    )
    expect(v!.verdict).toBe('pass')
    expect(v!.summary).toMatch(
      /2 of 2 canaries sent after decode's heartbeat bound 2 s × 2 = 4 s .* completed; every canary from \+2 s .* \(the last that did not was sent at \+1.5 s\)/,
    )
    expect(v!.evidence.brokenForS).toBe(1.5)
  })

  it('fails when a canary after the bound stalls, with the first good request after it', () => {
    const [v] = checkPeerRecovery(
      timeline([
        [0, 200, 'router'],
        [4.6, null, 'direct'],
        [5, 200, 'router'],
      ]),
      opts,
    )
    expect(v!.verdict).toBe('fail')
    expect(v!.summary).toMatch(
      /1 of 2 canaries .* did not complete \(first: c1 via direct at \+4.6 s, no answer\); the first good request after it was sent at \+5 s/,
    )
  })

  it('a router canary the gateway refused (its breaker open) is not judged; the direct ones are', () => {
    const refused =
      '{"error":{"code":"server_selection_failed","message":"No available servers: circuit breaker open"}}'
    const tl = timeline([
      [0, 500, 'router'],
      [4.6, 503, 'router', refused],
      [4.6, 200, 'direct'],
      [5, 200, 'direct'],
    ])
    const [v] = checkPeerRecovery(tl, opts)
    expect(v!.verdict).toBe('pass')
    expect(v!.summary).toMatch(/1 router canaries refused by the gateway .* not judged/)
    // A 503 that a worker gave (decode or prefill failing) is judged.
    const [w] = checkPeerRecovery(
      timeline([
        [4.6, 503, 'router', 'prefill_unavailable'],
        [5, 200, 'direct'],
      ]),
      opts,
    )
    expect(w!.verdict).toBe('fail')
  })

  it('a canary inside the bound + ε is not judged against it', () => {
    const [v] = checkPeerRecovery(
      timeline([
        [4.2, 500, 'router'],
        [4.6, 200, 'router'],
      ]),
      opts,
    )
    expect(v!.verdict).toBe('pass')
  })

  it("unverified without decode's settings, or without a canary after the bound", () => {
    const {heartbeat: _h, ...noBound} = opts
    const [u] = checkPeerRecovery(timeline([[5, 200, 'router']]), noBound)
    expect(u!.verdict).toBe('unverified')
    expect(u!.evidence.why).toMatch(/decode's environment was not read/)
    const [short] = checkPeerRecovery(timeline([[1, 200, 'router']]), opts)
    expect(short!.verdict).toBe('unverified')
  })
})
