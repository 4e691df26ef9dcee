import {freshnessOf, readingsOf, settledAfter, writtenSince} from '../engines/sglang/freshness.js'
import {PD_QUEUES, WATCHDOG_EVICTED_TOTAL} from '../engines/sglang/sglang-metrics.js'
import {round} from './eviction.js'
import {checkKvTokens} from './kv-tokens.js'
import {releaseCauseOf} from './release-cause.js'
import {
  abandonedOf,
  answerOf,
  faultWindows,
  metricAt,
  type Observation,
  requestsOf,
  sampledInstances,
  type Timeline,
} from '../model/timeline.js'
import {fail, pass, unverified, type Verdict} from '../model/verdict.js'

/**
 * After eviction and revert the deployment must be as it was: the next requests succeed, the PD queues drain, KV
 * token usage returns to its baseline (a leak fails where a fresh reading shows it; docs/freshness.md), and the
 * failure counters moved by exactly the number of pins.
 */

export interface RecoveryOptions {
  /** The prefill counters that count a failed PD request; their summed delta must equal the pins that failed. */
  failureCounters?: string[]
  /** Tokens in use (an idle loads snapshot) may differ from the baseline by this many. */
  usedTokensTolerance?: number
  /**
   * A batch over several instance pairs: the servers it spans (their samples are labelled by instance). Each one's
   * queues must be seen drained, its tokens back at its baseline; the counters are summed over the prefill instances.
   */
  instances?: Array<{service: 'prefill' | 'decode'; instance: string}>
}

/** The instances of a service to judge: those the batch spans and any sampled ([undefined]: one pair, unlabelled). */
function instancesOf(tl: Timeline, service: 'prefill' | 'decode', opts: RecoveryOptions): Array<string | undefined> {
  const stated = (opts.instances ?? []).filter(i => i.service === service).map(i => i.instance)
  const sampled = sampledInstances(tl, service).filter((i): i is string => i !== undefined)
  const all = [...new Set([...stated, ...sampled])]
  return all.length > 0 ? all : [undefined]
}

/** A series' name in evidence: with its instance where the batch spans several. */
const named = (instance: string | undefined, name: string) => (instance === undefined ? name : `${instance} ${name}`)

/** The fault's span: from the first injection to the last revert, and the last observation. */
interface Span {
  injectedAt: number
  revertedAt: number
  end: number
}

export function checkRecovery(tl: Timeline, opts: RecoveryOptions = {}): Verdict[] {
  const windows = faultWindows(tl)
  const span: Span = {
    injectedAt: Math.min(...windows.map(w => w.from)),
    revertedAt: Math.max(...windows.map(w => w.to ?? Number.POSITIVE_INFINITY)),
    end: Math.max(...tl.observations.map(o => o.t)),
  }
  return [
    ...checkBreaker(tl),
    checkRequests(tl, span),
    checkQueues(tl, span, opts),
    ...checkTokens(tl, span, opts),
    ...checkCounters(tl, span, opts),
  ]
}

/**
 * 1. The next requests succeed: the last round of canaries (a round the gateway's breaker refused was sent again
 * once it closed, marker canaries-again; the refused round is in the evidence).
 */
function checkRequests(tl: Timeline, {revertedAt}: Span): Verdict {
  const again = tl.observations.filter(o => o.kind === 'marker' && o.name === 'canaries-again').map(o => o.t)
  const from = Math.max(revertedAt, ...again)
  const refusedRound =
    again.length > 0
      ? requestsOf(tl, 'canary')
          .filter(c => c.t >= revertedAt && c.t < from)
          .map(c => ({rid: c.rid, status: answerOf(tl, c.rid)?.status ?? null}))
      : []
  const canaries = requestsOf(tl, 'canary').filter(c => c.t >= from)
  const bad = canaries.filter(c => {
    const a = answerOf(tl, c.rid)
    return !a || a.status < 200 || a.status > 299
  })
  const firstRound = refusedRound.length > 0 ? {refusedByOpenBreaker: refusedRound} : {}
  const sentAgain =
    refusedRound.length > 0 ? ', sent again once the circuit breaker that refused the first ones had closed' : ''
  if (canaries.length === 0)
    return fail('recovery', 'requests', 'no request was sent after the revert: recovery unproven', {
      revertedAt,
      ...firstRound,
    })
  if (bad.length > 0)
    return fail(
      'recovery',
      'requests',
      `${bad.length} of ${canaries.length} requests after the revert failed${sentAgain}: ${bad
        .slice(0, 5)
        .map(b => `${b.rid} (${answerOf(tl, b.rid)?.status ?? 'no answer'})`)
        .join(', ')}`,
      {canaries: canaries.length, failed: bad.map(b => b.rid), ...firstRound},
    )
  return pass(
    'recovery',
    'requests',
    `${canaries.length} of ${canaries.length} requests after the revert succeeded${sentAgain}`,
    {canaries: canaries.length, ...firstRound},
  )
}

/** Each PD queue's last reading, and which of them rest on gauges that may be stale or are not shown fresh. */
interface QueueReadings {
  queues: Record<string, number | undefined>
  staleNames: Set<string>
  releasedAt: number | undefined
  unshown: string[]
  /** Instances (undefined: the one unlabelled pair) none of whose queues was seen. */
  unseen: Array<string | undefined>
}

/**
 * Each PD queue: the /v1/loads snapshot (fresh once idle) first, the /metrics gauge as fallback. A gauge's 0 shows
 * the queue empty only when it was written after every request of the fault had ended (engines/sglang/freshness.ts):
 * otherwise it may be a write from before a request entered.
 */
function readQueues(tl: Timeline, {revertedAt, end}: Span, opts: RecoveryOptions): QueueReadings {
  const queues: Record<string, number | undefined> = {}
  const staleNames = new Set<string>()
  const releasedAt = settledAfter(tl, revertedAt, end)
  const unshown: string[] = []
  // Each instance (or the one unlabelled pair) must show at least one of its queues: one never seen is not drained.
  const seenOf = new Map<string | undefined, boolean>()
  for (const {service: svc, loads: fresh, gauge} of PD_QUEUES) {
    for (const inst of instancesOf(tl, svc, opts)) {
      const v = metricAt(tl, svc, fresh, end, inst)
      if (v !== undefined) queues[named(inst, fresh)] = v
      else {
        queues[named(inst, gauge)] = metricAt(tl, svc, gauge, end, inst)
        staleNames.add(named(inst, gauge))
        const last = readingsOf(tl, svc, gauge, inst)
          .filter(r => r.t <= end)
          .at(-1)
        const written = writtenSince(tl, svc, gauge, releasedAt, inst)
        if (last && (written === undefined || last.t < written.at)) unshown.push(named(inst, gauge))
      }
      seenOf.set(
        inst,
        (seenOf.get(inst) ?? false) || queues[named(inst, v === undefined ? gauge : fresh)] !== undefined,
      )
    }
  }
  const unseen = [...seenOf].filter(([, seen]) => !seen).map(([inst]) => inst)
  return {queues, staleNames, releasedAt, unshown, unseen}
}

/**
 * 2. The queues drain (judged at the last sample, taken after the canaries so the gauges were refreshed by a
 * batch). SGLang writes the /metrics gauges per batch or every 30 s when idle, so they can lag by about 30 s: a
 * nonzero gauge is no proof of a stuck request, and never a failure.
 */
function checkQueues(tl: Timeline, span: Span, opts: RecoveryOptions): Verdict {
  const {queues, staleNames, releasedAt, unshown, unseen} = readQueues(tl, span, opts)
  const stuck = Object.entries(queues).filter(([, v]) => v !== undefined && v > 0)
  const stuckFresh = stuck.filter(([n]) => !staleNames.has(n))
  const noLoads = 'read /v1/loads?include=disagg (an SGLang that serves it), which is fresh once the server is idle'
  if (stuckFresh.length > 0)
    return fail('recovery', 'queues', `queues not drained: ${stuckFresh.map(([n, v]) => `${n}=${v}`).join(', ')}`, {
      queues,
    })
  if (unseen.length > 0) {
    const which = unseen.every(i => i === undefined)
      ? 'no PD queue was sampled'
      : `no PD queue of ${unseen.join(', ')} was sampled`
    return unverified('recovery', 'queues', `${which} after the revert: drain unproven`, {
      why: 'neither /v1/loads?include=disagg nor the /metrics queue gauges answered with the PD queues',
      toVerify: noLoads,
    })
  }
  if (stuck.length > 0)
    return unverified(
      'recovery',
      'queues',
      `queues shown nonzero only by gauges that may be stale: ${stuck.map(([n, v]) => `${n}=${v}`).join(', ')}`,
      {
        queues,
        staleGauges: [...staleNames],
        why:
          'SGLang writes the PD queue gauges of /metrics only per batch (report_prefill_stats) or every 30 s ' +
          'from on_idle(), which returns early while a queue holds a request: a gauge can lag by up to about 30 s',
        toVerify: noLoads,
      },
    )
  if (unshown.length > 0)
    return unverified(
      'recovery',
      'queues',
      `queues read 0 only by gauges not shown written since the fault's last request ended: ${unshown.join(', ')}`,
      {
        queues,
        staleGauges: [...staleNames],
        releasedAt,
        why: `${freshnessOf(PD_QUEUES[0].gauge).rule}: a 0 written before a request entered hides it`,
        toVerify: noLoads,
      },
    )
  const fromGauges =
    staleNames.size > 0
      ? ` (${staleNames.size} of them from /metrics gauges written after the fault's last request ended)`
      : ''
  return pass('recovery', 'queues', `every PD queue drained to 0${fromGauges}`, {queues})
}

/** 3. KV tokens in use back at their baseline, judged only from readings fresh enough to show a leak (kv-tokens.ts). */
function checkTokens(tl: Timeline, {injectedAt, revertedAt, end}: Span, opts: RecoveryOptions): Verdict[] {
  const out: Verdict[] = []
  for (const svc of ['prefill', 'decode'] as const) {
    for (const inst of instancesOf(tl, svc, opts)) {
      const v = checkKvTokens(tl, svc, inst, {
        injectedAt,
        revertedAt,
        end,
        usedTokensTolerance: opts.usedTokensTolerance,
      })
      if (v) out.push(v)
    }
  }
  return out
}

/** The requests that failed, sorted by whether they must have moved the failure counters. */
interface FailedTally {
  /** Failed, and not let go of by pdchaos: each moved the counters once. */
  certain: number
  /** Let go of by pdchaos (abandoned, or aborted while cleaning up): each may or may not have moved them. */
  uncertain: number
  /** Released by a cause other than the watchdog while only its counter is judged: not expected to move it. */
  otherCause: number
  /** Refused by the gateway with no worker to send to: its earlier attempts may have moved them, or none did. */
  refused: number
}

/**
 * A request pdchaos stopped waiting for, or aborted while cleaning up, may or may not have gone through the counted
 * path (the watchdog can evict it after pdchaos let go). The watchdog's counter moves only for its own evictions: a
 * request its answer says something else released (a transport error, an abort, SGLang's timeout) moved another
 * counter, and is not expected there.
 */
function tallyFailed(tl: Timeline, counters: string[]): FailedTally {
  const cleaned = new Set(
    tl.observations
      .filter(o => o.kind === 'marker' && o.name === 'cleanup-abort')
      .map(o => (o as {detail?: string}).detail),
  )
  const watchdogOnly = counters.length > 0 && counters.every(c => c === WATCHDOG_EVICTED_TOTAL)
  const t: FailedTally = {certain: 0, uncertain: 0, otherCause: 0, refused: 0}
  for (const o of tl.observations) {
    if (o.kind !== 'request-sent') continue
    const a = answerOf(tl, o.rid)
    const failed = a !== undefined && (a.status < 200 || a.status > 299)
    const letGo = cleaned.has(o.rid) || abandonedOf(tl, o.rid) !== undefined
    const cause = failed ? releaseCauseOf(a.detail).cause : 'unknown'
    // The gateway answered without a worker (no server available): its earlier attempts, if any, may have moved the
    // counters, or none did. Uncertain either way.
    if (failed && cause === 'gateway') t.refused++
    else if (failed && watchdogOnly && cause !== 'watchdog' && cause !== 'unknown' && !cleaned.has(o.rid))
      t.otherCause++
    else if (failed && !cleaned.has(o.rid)) t.certain++
    else if (letGo) t.uncertain++
  }
  return t
}

/**
 * Each counter's move over the fault, summed over the prefill instances (the requests that failed may have been on
 * any); a counter not read before and after it is missing.
 */
function counterDeltas(tl: Timeline, counters: string[], {injectedAt, end}: Span, opts: RecoveryOptions) {
  let delta = 0
  const missing: string[] = []
  const per: Record<string, number> = {}
  for (const name of counters) {
    let d = 0
    for (const inst of instancesOf(tl, 'prefill', opts)) {
      const b = metricAt(tl, 'prefill', name, injectedAt, inst)
      const a = metricAt(tl, 'prefill', name, end, inst)
      if (a === undefined || b === undefined) {
        missing.push(named(inst, name))
        d = Number.NaN
        break
      }
      d += a - b
    }
    if (Number.isNaN(d)) continue
    per[name] = round(d, 3)
    delta += d
  }
  return {delta, missing, per}
}

/**
 * 4. Failure counters moved by exactly the requests that failed (pins, and load caught by the fault); each request
 * pdchaos let go of widens the range by one, and the evidence says so. An empty counter list skips this part (abort
 * trials move several counters through several paths).
 */
function checkCounters(tl: Timeline, span: Span, opts: RecoveryOptions): Verdict[] {
  const counters = opts.failureCounters ?? [WATCHDOG_EVICTED_TOTAL]
  const tally = tallyFailed(tl, counters)
  const {delta, missing, per} = counterDeltas(tl, counters, span, opts)
  if (missing.length > 0) return [countersMissing(missing)]
  if (counters.length === 0) return []
  return [judgeCounters(tl, span, tally, Math.round(delta), per)]
}

function countersMissing(missing: string[]): Verdict {
  return unverified(
    'recovery',
    'counters',
    `the failure counter balance is unverified: prefill does not export ${missing.join(', ')}`,
    {
      missing,
      why:
        `pdchaos checks that the failure counters moved by exactly the requests that failed, ` +
        `and ${missing.join(', ')} was not in prefill's /metrics before and after the fault`,
      toVerify: missing.some(m => m.endsWith(WATCHDOG_EVICTED_TOTAL))
        ? `have the watchdog count its evictions in ${WATCHDOG_EVICTED_TOTAL} (the counter pdchaos proposes ` +
          `for it), and enable --enable-metrics`
        : 'start prefill with --enable-metrics',
    },
  )
}

/**
 * Requests sent through the router (load, canaries) while a fault was in place, or that took at least the deadline
 * (a path still stalled after the revert, as an RDMA queue pair in its retransmission backoff is, can hold a canary
 * that long): a retrying gateway sends a failed attempt again with a new room, and each one moves the counters once
 * more, unseen by pdchaos.
 */
function routedInReachOf(tl: Timeline, end: number): number {
  const windows = faultWindows(tl)
  const deadlineMs = tl.contract.deadlineSeconds * 1000
  return tl.observations.filter(o => {
    if (o.kind !== 'request-sent' || o.path === 'direct') return false
    const answeredAt = answerOf(tl, o.rid)?.t ?? end
    return windows.some(w => o.t <= (w.to ?? end) && answeredAt >= w.from) || answeredAt - o.t >= deadlineMs
  }).length
}

function judgeCounters(
  tl: Timeline,
  {end}: Span,
  {certain, uncertain: letGo, otherCause, refused}: FailedTally,
  moved: number,
  per: Record<string, number>,
): Verdict {
  const evidence = {
    counters: per,
    failedRequests: certain,
    releasedByPdchaos: letGo,
    ...(otherCause ? {releasedByOtherCauses: otherCause} : {}),
    ...(refused ? {refusedByGateway: refused} : {}),
  }
  const plus = [
    'requests that failed',
    ...(letGo ? ['those pdchaos let go of'] : []),
    ...(refused ? ['those the gateway refused with no worker to send to'] : []),
  ].join(', plus ')
  const uncertain = letGo + refused
  const expected = uncertain === 0 ? `${certain}` : `${certain} to ${certain + uncertain}`
  const routedInReach = routedInReachOf(tl, end)
  const wrong = `failure counters moved by ${moved}, expected ${expected} (${plus})`
  if (moved < certain) return fail('recovery', 'counters', wrong, evidence)
  if (moved > certain + uncertain && routedInReach > 0)
    return unverified(
      'recovery',
      'counters',
      `failure counters moved by ${moved}, ${moved - certain - uncertain} more than the ${expected} pdchaos ` +
        `can attribute`,
      {
        ...evidence,
        routedInReach,
        why:
          `${routedInReach} request(s) went through the router while a fault was in place or took at least ` +
          `the deadline, and a retrying gateway sends a failed one again (each failed attempt moves the ` +
          `counters once more, out of pdchaos's sight)`,
        toVerify: 'run the steady load with --load-interval 0, or against a gateway started with --disable-retries',
      },
    )
  if (moved > certain + uncertain) return fail('recovery', 'counters', wrong, evidence)
  return pass('recovery', 'counters', `failure counters moved by ${moved}, as expected (${expected})`, evidence)
}

/**
 * The gateway's circuit breaker, each time it was found open after a fault: reported, and it must have closed again.
 */
function checkBreaker(tl: Timeline): Verdict[] {
  const markers = tl.observations.filter(
    (o): o is Extract<Observation, {kind: 'marker'}> =>
      o.kind === 'marker' && (o.name === 'router-breaker-open' || o.name === 'router-breaker-closed'),
  )
  const end = Math.max(...tl.observations.map(o => o.t))
  const out: Verdict[] = []
  markers.forEach((opened, i) => {
    if (opened.name !== 'router-breaker-open') return
    const closed = markers[i + 1]?.name === 'router-breaker-closed' ? markers[i + 1] : undefined
    const evidence = {
      workers: opened.detail,
      foundOpenAt: opened.t,
      closedAt: closed?.t ?? null,
      metric: 'smg_worker_cb_state',
    }
    out.push(
      closed
        ? pass(
            'recovery',
            'router circuit breaker',
            `the fault opened the router's circuit breaker (${opened.detail}); it closed ` +
              `again ${((closed.t - opened.t) / 1000).toFixed(1)}s later, before the canaries`,
            evidence,
          )
        : fail(
            'recovery',
            'router circuit breaker',
            `the fault opened the router's circuit breaker (${opened.detail}) and it was still ` +
              `open ${((end - opened.t) / 1000).toFixed(1)}s later: healthy requests get 503`,
            evidence,
          ),
    )
  })
  return out
}
