import {LOADS_DECODE_PREALLOC_QUEUE, LOADS_DECODE_TRANSFER_QUEUE} from '../engines/sglang/sglang-metrics.js'
import type {Observation, Timeline} from '../model/timeline.js'
import {fail, pass, unverified, type Verdict} from '../model/verdict.js'
import type {BreakerExpectation} from './expectation.js'

/**
 * trip-breaker's judgement (docs/faults.md, "trip-breaker"), a pure function of the timeline:
 * - fault-effect: prefill's breaker read open after the trip requests (else nothing else can be judged);
 * - breaker, per request sent at the open breaker: answered 503 within refuseWithinMs of its send (the clock: the
 *   request's own answer). Another status, a later answer or none fails: the gateway sent it on (SGLang #31206);
 * - breaker, decode's queues: prealloc + transfer from decode's /v1/loads snapshot must not rise above the reading
 *   taken before the first probe while the probes are out. Without a /v1/loads reading it is unverified: a per-batch
 *   gauge of /metrics is not fresh (an assumption shared with the freshness rule of DESIGN.md);
 * - recovery: after the open duration the breaker turns half-open (never earlier) and closes within closeWithinSeconds
 *   of its opening.
 */

type Breaker = Extract<Observation, {kind: 'breaker'}>
type Sent = Extract<Observation, {kind: 'request-sent'}>

const DECODE_QUEUES = [LOADS_DECODE_PREALLOC_QUEUE, LOADS_DECODE_TRANSFER_QUEUE]

function markerAt(tl: Timeline, name: string): number | undefined {
  return tl.observations.find(o => o.kind === 'marker' && o.name === name)?.t
}

/** Decode's prealloc + transfer queue per /v1/loads snapshot (one sampleOnce records both at one t). */
function decodeQueueReadings(tl: Timeline): Array<{t: number; reqs: number}> {
  const byT = new Map<number, number>()
  for (const o of tl.observations) {
    if (o.kind !== 'metric' || o.service !== 'decode' || !DECODE_QUEUES.includes(o.name)) continue
    byT.set(o.t, (byT.get(o.t) ?? 0) + o.value)
  }
  return [...byT].map(([t, reqs]) => ({t, reqs})).sort((a, b) => a.t - b.t)
}

const LOADS_SOURCE = 'decode /v1/loads (fresh snapshot)'
const S = (ms: number): string => (ms / 1000).toFixed(1)

type Answered = Extract<Observation, {kind: 'request-answered'}>
type Abandoned = Extract<Observation, {kind: 'request-abandoned'}>

/** The prefill breaker's reads, the trip requests and every answer: what each part is judged from. */
interface Trip {
  tl: Timeline
  x: BreakerExpectation
  reads: Breaker[]
  trips: Sent[]
  answers: Map<string, Answered>
  abandoned: Map<string, Abandoned>
  tripEvidence: Array<{rid: string; status: number | null; ms: number | null}>
  settings: Record<string, unknown>
}

const SUBJECT = "prefill's circuit breaker"

export function checkBreakerTrip(tl: Timeline, x: BreakerExpectation | undefined): Verdict[] {
  if (!x) {
    return [
      unverified('breaker', SUBJECT, 'no breaker expectation in the plan', {
        why: 'the plan carried no gateway settings',
        toVerify: 'plan trip-breaker again',
      }),
    ]
  }
  const t = tripOf(tl, x)
  const injectedAt = tl.observations.find(o => o.kind === 'fault-injected')?.t ?? -Infinity
  const firstOpen = t.reads.find(r => r.state === 'open' && r.t >= injectedAt)
  if (!firstOpen) return [neverOpen(t)]
  const lastClosed = [...t.reads].reverse().find(r => r.t < firstOpen.t && r.state !== 'open')
  const verdicts: Verdict[] = [
    pass(
      'fault-effect',
      SUBJECT,
      `read open after ${t.trips.length} trip request(s) of pdchaos's (the steady load refused by prefill counts ` +
        `too; threshold ${x.failureThreshold}, ${x.attempts} attempt(s) each)`,
      {
        openedReadAt: firstOpen.t,
        trips: t.tripEvidence,
        settings: t.settings,
        clock: "the gateway's smg_worker_cb_state read after each trip request",
      },
    ),
  ]
  // Requests at the open breaker: each a 503 within the bound.
  const probesFrom = markerAt(tl, 'breaker-probes') ?? firstOpen.t
  const probesTo = markerAt(tl, 'breaker-probes-end') ?? Infinity
  const inProbes = (at: number): boolean => at >= probesFrom && at <= probesTo
  const probes = tl.observations.filter(
    (o): o is Sent => o.kind === 'request-sent' && o.role === 'probe' && inProbes(o.t),
  )
  const decodeOpen = tl.observations.some(
    o => o.kind === 'breaker' && o.role === 'decode' && inProbes(o.t) && o.state === 'open',
  )
  verdicts.push(...probes.map(s => judgeProbe(t, s)))
  if (probes.length === 0) {
    verdicts.push(
      unverified('breaker', 'requests at the open breaker', 'no request was sent at the open breaker', {
        why: 'the run stopped, or the breaker half-opened first',
        toVerify: 'run trip-breaker again',
      }),
    )
  }
  verdicts.push(decodeQueues(tl, probes[0]?.t ?? probesFrom, probesTo, decodeOpen))
  verdicts.push(halfOpenThenClosed(t, firstOpen, lastClosed))
  return verdicts
}

function tripOf(tl: Timeline, x: BreakerExpectation): Trip {
  const reads = tl.observations.filter((o): o is Breaker => o.kind === 'breaker' && o.role === 'prefill')
  const trips = tl.observations.filter((o): o is Sent => o.kind === 'request-sent' && o.role === 'trip')
  const answers = new Map<string, Answered>()
  const abandoned = new Map<string, Abandoned>()
  for (const o of tl.observations) {
    if (o.kind === 'request-answered') answers.set(o.rid, o)
    if (o.kind === 'request-abandoned') abandoned.set(o.rid, o)
  }
  const tripEvidence = trips.map(s => {
    const a = answers.get(s.rid)
    return {rid: s.rid, status: a?.status ?? null, ms: a ? Math.round(a.t - s.t) : null}
  })
  const settings = {
    failureThreshold: x.failureThreshold,
    attempts: x.attempts,
    openSeconds: x.openSeconds,
    successThreshold: x.successThreshold,
    source: x.settingsSource,
  }
  return {tl, x, reads, trips, answers, abandoned, tripEvidence, settings}
}

/** The breaker never read open after the trip requests: nothing else can be judged. */
function neverOpen({reads, trips, tripEvidence, settings}: Trip): Verdict {
  return unverified('fault-effect', SUBJECT, `the breaker did not read open after ${trips.length} refused request(s)`, {
    trips: tripEvidence,
    settings,
    reads: reads.length,
    why:
      reads.length === 0
        ? "the gateway's metrics (smg_worker_cb_state) were not readable or name no prefill worker"
        : 'the gateway did not count the refused requests as failures (an older gateway waits for decode when ' +
          'prefill ' +
          'fails, or retries hid them)',
    toVerify: 'a gateway exporting smg_worker_cb_state, with its --cb-failure-threshold as `status` reads it',
  })
}

/** One request sent at the open breaker: a 503 within refuseWithinMs of its send, by its own answer. */
function judgeProbe({x, answers, abandoned}: Trip, s: Sent): Verdict {
  const a = answers.get(s.rid)
  const ms = a ? a.t - s.t : undefined
  const took = ms === undefined ? '' : ms.toFixed(0)
  const ev = {
    rid: s.rid,
    sentAt: s.t,
    status: a?.status ?? null,
    ms: ms === undefined ? null : Math.round(ms),
    boundMs: x.refuseWithinMs,
    clock: "the request's own answer",
    why: x.why,
  }
  const bound = `(bound ${x.refuseWithinMs} ms)`
  if (a && a.status === 503 && ms! <= x.refuseWithinMs)
    return pass('breaker', s.rid, `refused with 503 in ${took} ms ${bound}`, ev)
  if (a && a.status === 503)
    return fail(
      'breaker',
      s.rid,
      `503 only after ${took} ms ${bound}: the gateway held the request with prefill's breaker open`,
      ev,
    )
  if (a)
    return fail(
      'breaker',
      s.rid,
      `answered ${a.status} after ${took} ms, not 503: the gateway dispatched it with prefill's breaker open`,
      ev,
    )
  return fail(
    'breaker',
    s.rid,
    `no answer within ${x.refuseWithinMs} ms with prefill's breaker open: the request was sent on ` +
      '(decode alone waits for KV that never comes, SGLang #31206)',
    {...ev, abandoned: abandoned.get(s.rid)?.detail ?? null, state: 'held by the gateway'},
  )
}

/** Decode's queues while the probes were out: no higher than the reading taken before the first probe. */
function decodeQueues(tl: Timeline, firstProbe: number, probesTo: number, decodeOpen: boolean): Verdict {
  const readings = decodeQueueReadings(tl)
  const before = [...readings].reverse().find(r => r.t <= firstProbe)
  const during = readings.filter(r => r.t > firstProbe && r.t <= probesTo)
  const qSubject = "decode's prealloc and transfer queues"
  const peak = during.length > 0 ? during.reduce((m, r) => (r.reqs > m.reqs ? r : m), during[0]!) : undefined
  const qEv =
    before && peak
      ? {
          before: before.reqs,
          beforeAt: before.t,
          peak: peak.reqs,
          peakAt: peak.t,
          readings: during.length,
          source: LOADS_SOURCE,
        }
      : {}
  if (before && peak && peak.reqs > before.reqs) {
    // Growth is evidence whatever decode's own breaker read: only a request sent to decode puts one in its queues.
    return fail(
      'breaker',
      qSubject,
      `grew from ${before.reqs} to ${peak.reqs} with prefill's breaker open: ` +
        'decode was sent requests alone (SGLang #31206)',
      {...qEv, state: 'decode waiting for KV from a prefill that never got the request'},
    )
  }
  if (decodeOpen)
    return unverified(
      'breaker',
      qSubject,
      "decode's own breaker was open too: a decode-only dispatch could not have happened",
      {
        why: "decode's breaker opened while the probes were out, so the gateway could not send decode anything",
        toVerify:
          "a run in which decode's breaker stays closed (dispatch.rs ticks prefill's breaker alone on a prefill " +
          'failure)',
      },
    )
  if (!before || !peak)
    return unverified('breaker', qSubject, "no fresh reading of decode's queues around the probes", {
      readings: readings.length,
      why:
        "decode's /v1/loads?include=disagg answered no disagg queues; its /metrics gauges are written per batch " +
        "and are not fresh (assumed per DESIGN.md's freshness rule)",
      toVerify:
        'an SGLang whose /v1/loads has the disagg section ' + '(sglang_disagg_decode_{prealloc,transfer}_queue_reqs)',
    })
  return pass(
    'breaker',
    qSubject,
    `stayed at or below ${before.reqs} over ${during.length} fresh reading(s) while the probes were out`,
    qEv,
  )
}

/** Half-open after the open duration (never earlier), then closed within closeWithinSeconds of its opening. */
function halfOpenThenClosed({tl, x, reads}: Trip, firstOpen: Breaker, lastClosed: Breaker | undefined): Verdict {
  const watchFrom = markerAt(tl, 'breaker-close-watch')
  const after = reads.filter(r => r.t > firstOpen.t)
  const halfOpen = after.find(
    r => r.state === 'half_open' || r.transitions.toHalfOpen > firstOpen.transitions.toHalfOpen,
  )
  const closed = after.find(r => r.state === 'closed' && r.transitions.toClosed > firstOpen.transitions.toClosed)
  const earliest = (lastClosed?.t ?? firstOpen.t - x.openSeconds * 1000) + x.openSeconds * 1000
  const closeBy = firstOpen.t + x.closeWithinSeconds * 1000
  const rSubject = "prefill's circuit breaker half-opens and closes"
  const rEv = {
    openedReadAt: firstOpen.t,
    lastClosedReadAt: lastClosed?.t ?? null,
    halfOpenReadAt: halfOpen?.t ?? null,
    closedReadAt: closed?.t ?? null,
    openSeconds: x.openSeconds,
    closeWithinSeconds: x.closeWithinSeconds,
    clock: "the gateway's smg_worker_cb_state and transitions, read after each request",
  }
  if (halfOpen && halfOpen.t < earliest) {
    const since = S(halfOpen.t - (lastClosed?.t ?? firstOpen.t))
    return fail('recovery', rSubject, `half-open ${since} s after it opened, before its ${x.openSeconds} s`, rEv)
  }
  if (halfOpen && closed && closed.t <= closeBy)
    return pass(
      'recovery',
      rSubject,
      `half-open after its ${x.openSeconds} s, closed ${S(closed.t - firstOpen.t)} s after it opened ` +
        `(bound ${x.closeWithinSeconds} s)`,
      rEv,
    )
  if (watchFrom === undefined || (after.at(-1)?.t ?? 0) < closeBy)
    return unverified('recovery', rSubject, 'the breaker was not watched to its bound', {
      ...rEv,
      why: 'the run stopped before the close bound',
      toVerify: 'run trip-breaker to the end',
    })
  const what = halfOpen
    ? `half-open, but not closed within ${x.closeWithinSeconds} s of opening`
    : `still open ${x.closeWithinSeconds} s after it opened`
  return fail('recovery', rSubject, what, {...rEv, state: after.at(-1)?.state ?? 'unknown'})
}
