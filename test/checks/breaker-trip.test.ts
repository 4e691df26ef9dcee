import {describe, expect, it} from 'vitest'

import {checkBreakerTrip} from '../../src/checks/breaker-trip.js'
import type {BreakerExpectation} from '../../src/checks/expectation.js'
import type {Observation, Timeline} from '../../src/model/timeline.js'

/** trip-breaker's judgement on synthetic timelines: each row right, and each way it can go wrong named. */

const T = 1_000_000
const X: BreakerExpectation = {
  kind: 'breaker',
  role: 'prefill',
  workerUrl: 'http://127.0.0.1:30000',
  decodeUrl: 'http://127.0.0.1:30001',
  failureThreshold: 10,
  successThreshold: 3,
  openSeconds: 10,
  attempts: 5,
  tripRequests: 4,
  tripTimeoutMs: 6500,
  probes: 2,
  refuseWithinMs: 1488,
  closeWithinSeconds: 20,
  settingsSource: 'test',
  why: 'test',
}
type State = 'closed' | 'open' | 'half_open'
const read = (
  t: number,
  state: State,
  n = {toOpen: 0, toHalfOpen: 0, toClosed: 0},
  role: 'prefill' | 'decode' = 'prefill',
): Observation => ({
  kind: 'breaker',
  t,
  worker: role === 'prefill' ? X.workerUrl : X.decodeUrl,
  role,
  state,
  transitions: n,
})
const req = (t: number, rid: string, role: 'trip' | 'probe', status?: number, ms = 400): Observation[] => [
  {kind: 'request-sent', t, rid, role},
  ...(status === undefined
    ? [{kind: 'request-abandoned' as const, t: t + X.refuseWithinMs + 1000, rid, detail: 'client deadline'}]
    : [{kind: 'request-answered' as const, t: t + ms, rid, status}]),
]
const queue = (t: number, prealloc: number, transfer = 0): Observation[] => [
  {kind: 'metric', t, service: 'decode', name: 'sglang_disagg_decode_prealloc_queue_reqs', value: prealloc},
  {kind: 'metric', t, service: 'decode', name: 'sglang_disagg_decode_transfer_queue_reqs', value: transfer},
]
const marker = (t: number, name: string): Observation => ({kind: 'marker', t, name})

function timeline(
  o: {probes?: Observation[]; queues?: Observation[]; halfOpenAt?: number; closedAt?: number; noLoads?: boolean} = {},
): Timeline {
  const obs: Observation[] = [
    {kind: 'fault-injected', t: T, fault: 'trip-breaker', leaseId: 'L', verified: true, evidence: ''},
    read(T + 10, 'closed'),
    ...req(T + 20, 'trip-1', 'trip', 502, 300),
    read(T + 330, 'closed'),
    ...req(T + 340, 'trip-2', 'trip', 502, 300),
    read(T + 650, 'open', {toOpen: 1, toHalfOpen: 0, toClosed: 0}),
    marker(T + 660, 'breaker-probes'),
    ...(o.noLoads ? [] : (o.queues ?? [...queue(T + 660, 1), ...queue(T + 900, 1), ...queue(T + 1500, 0)])),
    ...(o.probes ?? [...req(T + 700, 'probe-1', 'probe', 503, 420), ...req(T + 1200, 'probe-2', 'probe', 503, 410)]),
    marker(T + 2500, 'breaker-probes-end'),
    {kind: 'fault-reverted', t: T + 2600, fault: 'trip-breaker', leaseId: 'L', verifiedClean: true, evidence: ''},
    marker(T + 2700, 'breaker-close-watch'),
    read(o.halfOpenAt ?? T + 10_700, 'half_open', {toOpen: 1, toHalfOpen: 1, toClosed: 0}),
    read(o.closedAt ?? T + 10_900, 'closed', {toOpen: 1, toHalfOpen: 1, toClosed: 1}),
  ]
  return {
    contract: {scope: 'all', deadlineSeconds: 3, pollSeconds: 0.5},
    calibration: {prefillMs: 20, prefillSpreadMs: 2, observeMs: 2, samples: 8},
    observations: obs.sort((a, b) => a.t - b.t),
  }
}
const verdictOf = (tl: Timeline, subject: string) => checkBreakerTrip(tl, X).find(v => v.subject === subject)

describe('checkBreakerTrip', () => {
  it(
    'passes every row of a gateway that fails fast, leaves decode alone and closes its breaker after the open ' +
      'duration',
    () => {
      const v = checkBreakerTrip(timeline(), X)
      expect(v.map(x => [x.check, x.subject, x.verdict])).toEqual([
        ['fault-effect', "prefill's circuit breaker", 'pass'],
        ['breaker', 'probe-1', 'pass'],
        ['breaker', 'probe-2', 'pass'],
        ['breaker', "decode's prealloc and transfer queues", 'pass'],
        ['recovery', "prefill's circuit breaker half-opens and closes", 'pass'],
      ])
    },
  )

  it('fails a request at the open breaker that got no answer (half-dispatched) or another status', () => {
    const tl = timeline({probes: [...req(T + 700, 'probe-1', 'probe'), ...req(T + 1200, 'probe-2', 'probe', 500, 900)]})
    expect(verdictOf(tl, 'probe-1')).toMatchObject({
      verdict: 'fail',
      summary: expect.stringMatching(/no answer within 1488 ms .*SGLang #31206/),
    })
    expect(verdictOf(tl, 'probe-2')).toMatchObject({
      verdict: 'fail',
      summary: expect.stringMatching(/answered 500 .* not 503/),
    })
    const late = timeline({probes: req(T + 700, 'probe-1', 'probe', 503, 2000)})
    expect(verdictOf(late, 'probe-1')).toMatchObject({
      verdict: 'fail',
      summary: expect.stringMatching(/503 only after 2000 ms/),
    })
  })

  it("fails when decode's fresh queues grew while the probes were out; unverified without a fresh reading", () => {
    const grew = timeline({queues: [...queue(T + 660, 1), ...queue(T + 900, 1, 1), ...queue(T + 1500, 2, 1)]})
    expect(verdictOf(grew, "decode's prealloc and transfer queues")).toMatchObject({
      verdict: 'fail',
      summary: expect.stringMatching(/grew from 1 to 3/),
    })
    const none = verdictOf(timeline({noLoads: true}), "decode's prealloc and transfer queues")
    expect(none).toMatchObject({verdict: 'unverified', evidence: {why: expect.stringMatching(/not fresh/)}})
  })

  it(
    'fails a breaker that half-opened before its open duration, or never closed; unverified when it never ' + 'opened',
    () => {
      const early = verdictOf(
        timeline({halfOpenAt: T + 5000, closedAt: T + 5200}),
        "prefill's circuit breaker half-opens and closes",
      )
      expect(early).toMatchObject({verdict: 'fail', summary: expect.stringMatching(/before its 10 s/)})
      const tl = timeline({closedAt: T + 30_000})
      expect(verdictOf(tl, "prefill's circuit breaker half-opens and closes")).toMatchObject({
        verdict: 'fail',
        summary: expect.stringMatching(/not closed within 20 s/),
      })
      const never: Timeline = {
        ...timeline(),
        observations: timeline().observations.filter(o => !(o.kind === 'breaker' && o.state !== 'closed')),
      }
      expect(checkBreakerTrip(never, X)).toEqual([
        expect.objectContaining({check: 'fault-effect', verdict: 'unverified'}),
      ])
    },
  )
})
