import type {HeartbeatSettings} from '../engines/sglang/discovery/heartbeat-bound.js'
import type {CanaryOutcome} from '../model/restart.js'
import {answerOf, requestsOf, type Timeline} from '../model/timeline.js'
import {fail, pass, unverified, type Verdict} from '../model/verdict.js'

/**
 * One role restarted alone behind a stable address (SGLang #34289): how long the deployment stays broken, judged
 * against the bound SGLang promises for noticing a lost peer, decode's heartbeat interval × max failures. Clock: the
 * restarted role's first healthy answer (marker `healthy <role>`); the canaries (through the router, and direct pins
 * to the pair) are each judged by their own answer. Pass: every canary sent after healthy + bound + ε completed.
 */

export interface PeerRecoveryOptions {
  role: 'prefill' | 'decode'
  /** When the restarted role's health gate first passed (epoch ms). */
  healthyAt: number
  /** Decode's heartbeat as its environment states it; undefined when that environment could not be read. */
  heartbeat?: HeartbeatSettings
  /** Allowed past the bound: the canary's own round trip and scheduling (seconds). */
  epsilonS: number
}

const r1 = (x: number) => Math.round(x * 10) / 10
const r3 = (x: number) => Math.round(x * 1000) / 1000

export function canaryOutcomes(tl: Timeline, healthyAt: number): CanaryOutcome[] {
  return requestsOf(tl, 'canary')
    .filter(c => c.t >= healthyAt)
    .map(c => {
      const a = answerOf(tl, c.rid)
      const path = c.path === 'direct' ? 'direct' : 'router'
      // The gateway refused it before any worker saw it (its breaker open, or no worker available): sgl-model-gateway's
      // handle_server_selection_error, a 503 "No available servers". That says nothing about decode's endpoints.
      const refused = path === 'router' && a?.status === 503 && GATEWAY_REFUSAL.test(a.detail ?? '')
      return {
        rid: c.rid,
        path,
        sentAfterS: r3((c.t - healthyAt) / 1000),
        status: a?.status ?? null,
        tookS: a ? r3((a.t - c.t) / 1000) : null,
        ...(refused ? {refusedByGateway: true} : {}),
      }
    })
}

const GATEWAY_REFUSAL = /no available servers|server_selection_failed|circuit.?breaker/i

const ok = (c: CanaryOutcome) => c.status !== null && c.status >= 200 && c.status < 300

/** The canaries judged, when the deployment was whole again, and the evidence every verdict carries. */
interface Measured {
  canaries: CanaryOutcome[]
  firstGood: CanaryOutcome | undefined
  measured: string
  refusals: string
  evidence: Record<string, unknown>
}

export function checkPeerRecovery(tl: Timeline, o: PeerRecoveryOptions): Verdict[] {
  const m = measure(tl, o)
  const subject = `${o.role} restarted alone`
  if (!o.heartbeat) {
    return [
      unverified('recovery', subject, `decode's heartbeat bound is unknown: ${m.measured}`, {
        ...m.evidence,
        why:
          "decode's environment was not read, so SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL and _MAX_FAILURE " +
          'are unknown',
        toVerify:
          "let pdchaos read decode's /proc/<pid>/environ (the deployment's sudo policy), " +
          'or run as the user that runs decode',
      }),
    ]
  }
  return [afterHeartbeatBound(o, o.heartbeat, m, subject)]
}

/**
 * A canary the gateway refused (its breaker opened on the failures before decode noticed) is no evidence either way:
 * judged are the others; the direct ones bypass the gateway and always count. The first canary after which every
 * later one completed is when the deployment was whole again.
 */
function measure(tl: Timeline, o: PeerRecoveryOptions): Measured {
  const all = canaryOutcomes(tl, o.healthyAt).sort((a, b) => a.sentAfterS - b.sentAfterS)
  const canaries = all.filter(c => !c.refusedByGateway)
  const refused = all.filter(c => c.refusedByGateway)
  let lastBad = -1
  canaries.forEach((c, i) => {
    if (!ok(c)) lastBad = i
  })
  const firstGood = canaries[lastBad + 1]
  const brokenFor = lastBad >= 0 ? canaries[lastBad]!.sentAfterS : 0
  const measured = firstGood
    ? `every canary from +${r1(firstGood.sentAfterS)} s after ${o.role} was healthy completed` +
      (lastBad >= 0 ? ` (the last that did not was sent at +${r1(brokenFor)} s)` : ' (none failed)')
    : 'no canary completed after the last failure'
  const refusals =
    refused.length > 0
      ? `; ${refused.length} router canaries refused by the gateway (its circuit breaker open, 503 before any ` +
        `worker) not judged`
      : ''
  const evidence = {
    clock:
      `${o.role}'s first healthy answer after its restart command (its health gate); ` +
      'each canary by its own answer',
    healthyAt: o.healthyAt,
    canaries: all,
    refusedByGateway: refused.length,
    firstGoodSentAfterS: firstGood?.sentAfterS ?? null,
    brokenForS: brokenFor,
    ...(o.heartbeat ? {heartbeat: o.heartbeat} : {}),
    epsilonS: o.epsilonS,
  }
  return {canaries, firstGood, measured, refusals, evidence}
}

/** Every canary sent after decode's heartbeat bound (+ ε) completed. */
function afterHeartbeatBound(
  o: PeerRecoveryOptions,
  hb: NonNullable<PeerRecoveryOptions['heartbeat']>,
  {canaries, firstGood, measured, refusals, evidence}: Measured,
  subject: string,
): Verdict {
  const limitS = hb.boundSeconds + o.epsilonS
  const bound = `${hb.intervalSeconds} s × ${hb.maxFailure} = ${hb.boundSeconds} s (+ ε ${o.epsilonS} s; ${hb.source})`
  const after = canaries.filter(c => c.sentAfterS >= limitS)
  if (after.length === 0) {
    return unverified('recovery', subject, `no canary was sent after the bound ${bound}: ${measured}`, {
      ...evidence,
      why: 'the canaries ended before the heartbeat bound',
      toVerify: 'send canaries for longer than the bound',
    })
  }
  const bad = after.filter(c => !ok(c))
  if (bad.length > 0) {
    const first = bad[0]!
    const goodAfter = firstGood
      ? `the first good request after it was sent at +${r1(firstGood.sentAfterS)} s`
      : 'no good request followed'
    return fail(
      'recovery',
      subject,
      `${bad.length} of ${after.length} canaries sent after decode's heartbeat bound ${bound} did not complete ` +
        `(first: ${first.rid} via ${first.path} at +${r1(first.sentAfterS)} s, ${first.status ?? 'no answer'}` +
        `${first.tookS === null ? '' : ` after ${r1(first.tookS)} s`}); ` +
        goodAfter +
        `: decode still uses the replaced ${o.role === 'prefill' ? "prefill's endpoints" : 'peer'} (SGLang #34289)`,
      {...evidence, failedAfterBound: bad},
    )
  }
  const summary =
    `${after.length} of ${after.length} canaries sent after decode's heartbeat bound ${bound} ` +
    `completed; ${measured}${refusals}`
  return pass('recovery', subject, summary, evidence)
}
