import {serviceClients} from '../engines/sglang/deployment/clients.js'
import type {Deployment} from '../deployment/config.js'
import {checkPeerRecovery, canaryOutcomes} from '../checks/peer-recovery.js'
import type {HeartbeatSettings} from '../engines/sglang/discovery/heartbeat-bound.js'
import type {AloneRecovery, RestartResult} from '../model/restart.js'
import type {Observation, Timeline} from '../model/timeline.js'
import {unverified, type Verdict} from '../model/verdict.js'
import {sleep} from '../util/time.js'
import {now, Recorder} from '../workload/recorder.js'
import {sendDirect, sendRequest, type Sent} from '../workload/send.js'
import {coRestart, type RestartHost, type RestartTarget, type ServiceName} from './co-restart.js'

/**
 * One role restarted alone behind its stable address (SGLang #34289: a Kubernetes pod replaced behind its Service),
 * not the co-restart that hides the bug by restarting decode too. After the role's health gate, canaries go through
 * the router and direct to the pair, one of each every probe interval, until the heartbeat bound has passed and a few
 * more were sent; checkPeerRecovery judges them. A deployment the restart left broken is brought back by the
 * co-restart (prefill → decode → router behind their gates), on every exit path: decode re-resolves its prefill
 * endpoints when it restarts.
 */

export interface AloneOptions {
  role: 'prefill' | 'decode'
  /** The role's instances, in the file's order. */
  targets: RestartTarget[]
  /** What brings the deployment back when the role alone left it broken: every role, in the file's restart order. */
  repairTargets: RestartTarget[]
  healthTimeoutS: number
  commandTimeoutS: number
  /** Decode's heartbeat as discovery read it before the restart; undefined: the bound is unknown (unverified). */
  heartbeat?: HeartbeatSettings
  /** A router canary and a direct one every this many ms. */
  probeIntervalMs: number
  /** Canaries keep going this long past the bound, so that several are judged. */
  tailS: number
  /** Allowed past the bound for the canary's own round trip. */
  epsilonS: number
  onProgress?: (line: string) => void
  signal?: AbortSignal
}

/**
 * A canary round every 500 ms, kept up 0.5 s past the bound (two rounds judged); ε 0.5 s: the health gate's 200 ms poll
 * and a canary's own round trip.
 */
export const ALONE_DEFAULTS = {probeIntervalMs: 500, tailS: 0.5, epsilonS: 0.5}

/** Without a readable bound the canaries still run for SGLang's default (5 s × 2), so the report says what happened. */
const DEFAULT_BOUND_S = 10

type PlanShape = Pick<AloneOptions, 'role' | 'heartbeat' | 'probeIntervalMs' | 'tailS' | 'epsilonS'>

/** What `restart --only` will do, for --dry-run and the suite's plan. */
export function aloneProbePlan(o: PlanShape): string[] {
  const hb = o.heartbeat
  const bound = hb
    ? `decode's heartbeat bound ${hb.intervalSeconds} s × ${hb.maxFailure} = ${hb.boundSeconds} s (${hb.source})`
    : "decode's heartbeat bound: unknown (decode's environment not read): the verdict will be unverified"
  const span = (hb?.boundSeconds ?? DEFAULT_BOUND_S) + o.epsilonS + o.tailS
  const peer = o.role === 'prefill' ? 'prefill' : 'peer'
  return [
    `restart ${o.role} alone by its restart command, behind its health gate ` +
      `(decode keeps its cached endpoints of the old ${peer})`,
    bound,
    `canaries from the health gate for ${span} s: one through the router and one direct to the pair ` +
      `every ${o.probeIntervalMs} ms`,
    `pass: every canary sent after the bound + ε ${o.epsilonS} s completes; ` +
      'fail: one after it stalls or fails (SGLang #34289)',
    'if it fails or is interrupted: co-restart prefill → decode → router behind their gates ' +
      'to bring the deployment back',
  ]
}

const NO_WATCH = {canaries: [], watch: {samples: [], requests: []}}

export async function restartAlone(
  deployment: Deployment,
  hosts: RestartHost,
  o: AloneOptions,
): Promise<RestartResult> {
  const say = o.onProgress ?? (() => {})
  const started = now()
  const gates = {
    healthTimeoutS: o.healthTimeoutS,
    commandTimeoutS: o.commandTimeoutS,
    canaries: 0,
    watchS: 0,
    sampleS: 1,
    settleS: 0,
    gatesOnly: true,
  }
  // Before: the pair must serve, and decode must hold the old instance's endpoints (it resolves them on first use).
  const before = await servesBefore(deployment, o)
  const serves = before.ok
    ? 'the pair serves (decode has resolved the current peer)'
    : `the pair does not serve (${before.detail})`
  say(`before the restart: ${serves}`)
  if (!before.ok) return notServed(o, before, started)
  const restarted = await coRestart(deployment, hosts, {
    ...gates,
    order: [o.role],
    targets: o.targets,
    onProgress: say,
    ...(o.signal ? {signal: o.signal} : {}),
  })
  const verdicts = [...restarted.verdicts]
  const rec = new Recorder()
  let alone: AloneRecovery | undefined
  let broken = verdicts.some(v => v.verdict === 'fail')
  let finished = false
  try {
    if (!broken) {
      const probed = await probeAlone(deployment, o, restarted, started, rec, say)
      verdicts.push(...probed.judged)
      alone = probed.alone
      broken = probed.judged.some(v => v.verdict === 'fail') || Boolean(o.signal?.aborted)
    }
    finished = true
  } finally {
    // Interrupted, failed or left broken: bring the deployment back (the co-restart clears decode's stale cache).
    if (broken || !finished || o.signal?.aborted) {
      say('bringing the deployment back: co-restart prefill → decode → router')
      // No signal: an interrupt must not stop the repair half way.
      const order: ServiceName[] = ['prefill', 'decode', 'router']
      const repair = await coRestart(deployment, hosts, {...gates, order, targets: o.repairTargets, onProgress: say})
      verdicts.push(...repair.verdicts.map(v => ({...v, subject: `repair: ${v.subject}`})))
      if (alone) alone.repaired = repair.steps.map(s => s.instance ?? s.service)
      restarted.steps.push(...repair.steps)
    }
  }
  const observations = [...restarted.observations, ...rec.sorted()].sort((a, b) => a.t - b.t)
  const totalMs = Math.round(now() - started)
  return {steps: restarted.steps, totalMs, ...NO_WATCH, verdicts, observations, ...(alone ? {alone} : {})}
}

/** The deployment did not serve before the restart: nothing restarted, unverified (it cannot show what broke). */
function notServed(
  o: AloneOptions,
  before: {detail: string; observations: Observation[]},
  started: number,
): RestartResult {
  const why = `not restarted: the deployment did not serve before the restart (${before.detail})`
  const v = unverified('recovery', `${o.role} restarted alone`, why, {
    why: 'a deployment that fails before the restart cannot show what the restart broke',
    toVerify: 'bring the deployment back (pdchaos restart) and run again',
  })
  const totalMs = Math.round(now() - started)
  return {steps: [], totalMs, ...NO_WATCH, observations: before.observations, verdicts: [v]}
}

/**
 * The canaries from the last instance's gate (from then on the whole role is its new self), judged by
 * checkPeerRecovery.
 */
async function probeAlone(
  deployment: Deployment,
  o: AloneOptions,
  restarted: RestartResult,
  started: number,
  rec: Recorder,
  say: (l: string) => void,
): Promise<{judged: Verdict[]; alone: AloneRecovery}> {
  const last = restarted.steps.at(-1)!
  const markers = restarted.observations.filter(x => x.kind === 'marker' && x.name.startsWith('restart '))
  const startMarker = markers.at(-1)
  const healthyAt = (startMarker?.t ?? started) + (last.healthyAfterMs ?? 0)
  rec.add({kind: 'marker', t: healthyAt, name: `healthy ${o.role}`})
  const sent = await sendCanaries(deployment, rec, healthyAt, o, say)
  await Promise.all(sent.map(s => s.done))
  const w = deployment.watchdog
  const tl: Timeline = {
    contract: {scope: w.scope, deadlineSeconds: w.deadlineSeconds, pollSeconds: w.pollSeconds},
    calibration: {prefillMs: 0, prefillSpreadMs: 0, observeMs: 0, samples: 0},
    observations: rec.sorted(),
  }
  const heartbeat = o.heartbeat ? {heartbeat: o.heartbeat} : {}
  const judged = checkPeerRecovery(tl, {role: o.role, healthyAt, ...heartbeat, epsilonS: o.epsilonS})
  return {judged, alone: {role: o.role, healthyAt, ...heartbeat, canaries: canaryOutcomes(tl, healthyAt)}}
}

/** Prefill's bootstrap server, as the gateway injects it into both /generate bodies. */
function bootstrapOf(deployment: Deployment): {host: string; port: number} {
  return {host: new URL(deployment.services.prefill.url).hostname, port: deployment.services.prefill.bootstrapPort}
}

/** One request through the router and one direct, before the restart: both must succeed. */
async function servesBefore(
  deployment: Deployment,
  o: AloneOptions,
): Promise<{ok: boolean; detail: string; observations: Observation[]}> {
  const rec = new Recorder()
  const {router, prefill, decode} = serviceClients(deployment)
  const timeoutMs = (deployment.watchdog.deadlineSeconds + deployment.watchdog.pollSeconds) * 1000 + 10_000
  const opts = {role: 'baseline' as const, timeoutMs, ...(o.signal ? {signal: o.signal} : {})}
  const [a, b] = await Promise.all([
    sendRequest(router, rec, opts).done,
    sendDirect({prefill, decode}, bootstrapOf(deployment), rec, opts).done,
  ])
  const bad = [
    ['router', a.status],
    ['direct', b.status],
  ].filter(([, st]) => st !== 200)
  const detail = bad.map(([p, st]) => `${p}: ${st ?? 'no answer'}`).join(', ')
  return {ok: bad.length === 0, detail, observations: rec.sorted()}
}

/** One router canary and one direct pin every probe interval, from the gate until the bound + ε + tail. */
async function sendCanaries(
  deployment: Deployment,
  rec: Recorder,
  healthyAt: number,
  o: AloneOptions,
  say: (l: string) => void,
): Promise<Sent[]> {
  const {router, prefill, decode} = serviceClients(deployment)
  const boundS = o.heartbeat?.boundSeconds ?? DEFAULT_BOUND_S
  const until = healthyAt + (boundS + o.epsilonS + o.tailS) * 1000
  // A canary decode still sends to the old peer waits for prefill's watchdog or decode's heartbeat: allow both.
  const timeoutMs = (deployment.watchdog.deadlineSeconds + deployment.watchdog.pollSeconds + boundS) * 1000 + 10_000
  const span = Math.round((until - now()) / 100) / 10
  say(`canaries for ${span} s (bound ${boundS} s + ε ${o.epsilonS} s + ${o.tailS} s), through the router and direct`)
  const sent: Sent[] = []
  while (now() < until && !o.signal?.aborted) {
    const opts = {role: 'canary' as const, timeoutMs, ...(o.signal ? {signal: o.signal} : {})}
    sent.push(sendRequest(router, rec, opts), sendDirect({prefill, decode}, bootstrapOf(deployment), rec, opts))
    await sleep(o.probeIntervalMs, o.signal)
  }
  return sent
}
