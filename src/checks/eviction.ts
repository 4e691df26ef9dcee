import {DECODE_PREALLOC_QUEUE, DECODE_TRANSFER_QUEUE, PREFILL_BOOTSTRAP_QUEUE, PREFILL_INFLIGHT_QUEUE} from '../deployment/sglang-metrics.js'
import {epsilonFor} from './epsilon.js'
import type {FaultExpectation, StallExpectation} from './expectation.js'
import {releaseCauseOf} from './release-cause.js'
import {abandonedOf, answerOf, metricAt, requestsOf, type Observation, type PinState, type Timeline} from '../model/timeline.js'
import type {PinRecord} from '../model/run.js'
import {fail, pass, unverified, type Verdict} from '../model/verdict.js'

/**
 * The eviction oracle: every pin leaves no earlier than deadline - ε and no later than deadline + poll + ε after
 * it entered the watched queue. The clock is the pin's own answer; its absence is judged with the state it was
 * left in.
 */

export type {PinRecord} from '../model/run.js'

const UNKNOWN_STATE: PinState = {queue: 'unknown', kvPoll: 'unknown'}

export interface EvictionOptions {
  /** The plan's expectation (FaultPlan.expected): names the transport's limits when a transport error releases a pin. */
  expected?: FaultExpectation
}

/** A transport error (or a transfer failure) before or inside the window: the watchdog was not exercised. */
function transportRelease(after: number, released: ReturnType<typeof releaseCauseOf>, where: 'before' | 'inside', expected: StallExpectation | undefined) {
  const what = released.cause === 'transport-error' ? 'a transport error' : 'a KV transfer failure (its reason not stated: it came from another TP rank)'
  const toVerify = expected
    ? `raise ${expected.raise.join(' / ')} so that a stall outlasts the watchdog deadline${expected.deadlineSeconds === undefined ? '' : ` (${expected.deadlineSeconds} s)`} (now ${expected.limits}: the transport gives up after about ${expected.afterSeconds ?? '?'} s), or stall the KV over a TCP data path`
    : 'raise the transport\'s stall limit above the watchdog deadline (UCX_RC_MLX5_TIMEOUT / UCX_RC_TIMEOUT and UCX_RC_RETRY_COUNT for NIXL over RDMA, MC_TRANSFER_TIMEOUT for Mooncake), or stall the KV over a TCP data path'
  return {
    summary: `released by ${what} after ${secs(after)}${where === 'inside' ? ', inside the deadline window' : ''}; the watchdog was not exercised`,
    evidence: {
      why: `the pin's answer says the transfer failed (${released.evidence}), not that the watchdog evicted it: ${where === 'before' ? 'it left before the deadline window, so the watchdog never had to act' : 'a release by the transport cannot be told from an eviction'}`,
      toVerify,
      releasedBy: released.cause,
      ...(expected ? {expectedOutcome: expected.outcome, transportGivesUpAfterSeconds: expected.afterSeconds, transportLimits: expected.limits} : {}),
    },
  }
}

export function checkEvictions(tl: Timeline, opts: EvictionOptions = {}): {verdicts: Verdict[]; pins: PinRecord[]} {
  const stallExpected = opts.expected?.kind === 'stall' ? opts.expected : undefined
  const verdicts: Verdict[] = []
  const pins: PinRecord[] = []
  const {deadlineSeconds, pollSeconds, scope} = tl.contract
  const deadlineMs = deadlineSeconds * 1000
  const pollMs = pollSeconds * 1000
  const end = Math.max(...tl.observations.map((o) => o.t))

  for (const sent of requestsOf(tl, 'pin')) {
    const state = sent.expectedState ?? UNKNOWN_STATE
    const answer = answerOf(tl, sent.rid)
    const eps = epsilonFor(tl, state.queue, {sentAt: sent.t, answeredAt: answer?.t})
    const entry = sent.t + eps.entryOffsetMs
    const low = entry + deadlineMs - eps.lowMs
    const high = entry + deadlineMs + pollMs + eps.highMs
    const bounds: [number, number] = [(low - sent.t) / 1000, (high - sent.t) / 1000]
    const base = {
      clock: 'the request\'s own answer',
      contract: {scope, deadlineSeconds, pollSeconds},
      epsilonMs: {low: round(eps.lowMs), high: round(eps.highMs)},
      epsilonWhy: eps.why,
      entry: eps.entryOffsetMs === 0 ? 'send time' : `send + ${round(eps.entryOffsetMs)} ms (calibrated)`,
      expectedState: state,
    }
    const record = (verdict: Verdict, evictedAt: number | null) => {
      verdicts.push(verdict)
      pins.push({
        rid: sent.rid, fault: sent.fault, sentAt: sent.t, evictedAt,
        evictionSeconds: evictedAt === null ? null : round((evictedAt - sent.t) / 1000, 3),
        bounds: [round(bounds[0], 3), round(bounds[1], 3)], verdict: verdict.verdict, evidence: verdict.evidence,
      })
    }

    if (answer && answer.status >= 200 && answer.status < 300) {
      record(fail('fault-effect', sent.rid, `not pinned: completed with ${answer.status} after ${secs(answer.t - sent.t)} — the fault did not hold it`, {
        ...base, status: answer.status, answeredAfterSeconds: round((answer.t - sent.t) / 1000, 3),
      }), null)
      continue
    }
    if (answer) {
      const after = answer.t - sent.t
      const released = releaseCauseOf(answer.detail)
      const evidence = {
        ...base, status: answer.status, detail: answer.detail, evictedAfterSeconds: round(after / 1000, 3),
        ...(released.cause === 'unknown' ? {} : {releasedBy: released.cause, releaseEvidence: released.evidence}),
      }
      // A transport error released it (before or inside the window), or a transfer failure whose reason the text does
      // not show released it before the window: either way not the watchdog. (Inside the window such an unexplained
      // transfer failure may be the watchdog's own, reported through the same path: judged as before.)
      if ((released.cause === 'transport-error' && answer.t <= high) || (released.cause === 'transfer-failed' && answer.t < low)) {
        const r = transportRelease(after, released, answer.t < low ? 'before' : 'inside', stallExpected)
        record(unverified('eviction', sent.rid, r.summary, {...evidence, ...r.evidence}), answer.t)
        continue
      }
      if (answer.t < low) {
        record(fail('eviction', sent.rid, `evicted early: after ${secs(after)}, before the deadline window [${bounds[0].toFixed(3)}s, ${bounds[1].toFixed(3)}s] — a false timeout`, evidence), answer.t)
      } else if (answer.t > high) {
        record(fail('eviction', sent.rid, `evicted late: after ${secs(after)}, past deadline + poll + ε (${bounds[1].toFixed(3)}s)`, evidence), answer.t)
      } else if (eps.highMs >= pollMs) {
        // Answers reach pdchaos as late as a poll interval: a watchdog one poll late (or a little early) looks the
        // same as a punctual one answered late. Only clearly early or clearly late evictions can be judged.
        record(unverified('eviction', sent.rid, `evicted after ${secs(after)}, inside [${bounds[0].toFixed(3)}s, ${bounds[1].toFixed(3)}s] only because ε is a whole poll wide (${Math.round(eps.highMs)} ms)`, {
          ...evidence,
          why: `answers reached pdchaos up to ${Math.round(eps.highMs)} ms late (${eps.why}), as long as the poll interval (${pollMs} ms): an eviction one poll late cannot be told from a punctual one answered late`,
          toVerify: 'run again when the host (and the machine pdchaos runs on) is less loaded, or from a machine nearer the servers; the observation delay must stay well under the poll interval',
        }), answer.t)
      } else {
        record(pass('eviction', sent.rid, `evicted after ${secs(after)}, inside [${bounds[0].toFixed(3)}s, ${bounds[1].toFixed(3)}s]`, evidence), answer.t)
      }
      continue
    }
    // No answer: still held when pdchaos stopped watching (or its own client deadline ran out).
    const gaveUp = abandonedOf(tl, sent.rid)
    const heldFor = (gaveUp?.t ?? end) - sent.t
    const signals = stateSignals(tl, gaveUp?.t ?? end)
    record(fail('eviction', sent.rid, `never evicted: still held after ${secs(heldFor)} (window ended at ${bounds[1].toFixed(3)}s), in the ${state.queue} queue (${state.kvPoll})`, {
      ...base, heldSeconds: round(heldFor / 1000, 3), leftIn: state, deploymentSignals: signals, stoppedWatching: gaveUp?.detail ?? 'end of observation',
    }), null)
  }
  return {verdicts, pins}
}

/** What the deployment itself said about its queues at time t (gauges may be stale: reported, never the clock). */
function stateSignals(tl: Timeline, t: number): Record<string, number | undefined> {
  const names = [PREFILL_BOOTSTRAP_QUEUE, PREFILL_INFLIGHT_QUEUE, DECODE_TRANSFER_QUEUE, DECODE_PREALLOC_QUEUE]
  const out: Record<string, number | undefined> = {}
  for (const n of names) {
    const service = n.includes('decode') ? 'decode' : 'prefill'
    const v = metricAt(tl, service, n, t)
    if (v !== undefined) out[n] = v
  }
  return out
}

export function round(v: number, digits = 1): number {
  const f = 10 ** digits
  return Math.round(v * f) / f
}

export function secs(ms: number): string {
  return `${(ms / 1000).toFixed(3)}s`
}

export type {Observation}
