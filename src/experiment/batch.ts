import {setMaxListeners} from 'node:events'

import type {LeaseGuard} from '../faults/lease/lease-guard.js'
import {leaseTtlMs} from '../faults/lease/lease.js'
import type {ScenarioRun} from '../model/run.js'
import {abortable} from '../util/stop.js'
import {sleep} from '../util/time.js'
import {now, Recorder} from '../workload/recorder.js'
import {type SampledServer, sampleOnce, startSampler} from '../workload/sampler.js'
import type {Sent} from '../workload/send.js'
import {type LogMark, markLogs} from '../workload/service-log.js'
import {SteadyLoad} from '../workload/steady-load.js'
import {dryRun, heldScenarios} from './batch-dry.js'
import {type PairInBatch, serversOf} from './batch-pairs.js'
import {type PlannedBatch, planBatch} from './batch-plan.js'
import {DRAIN_WAIT_MS, readPinLogs, recover, releaseHeld} from './batch-recover.js'
import type {BatchScenario} from './batch-scenario.js'
import type {BatchSettings} from './batch-settings.js'
import {type Entry, injectedEverywhere, leasesOf} from './entry.js'
import {judgeBatch, scenarioShell} from './judge.js'
import {injectUnderLease, revertAndVerify} from './lease-steps.js'
import {type AloneWatch, kindOf, type ObserveContext, type WindowKind} from './observers.js'
import {runPinWindow} from './pin-window.js'
import {withLeasesOn} from './placement.js'
import {PROBE_TIMEOUT_MS, type RunSession} from './session.js'

export type {BatchScenario} from './batch-scenario.js'
export type {BatchSettings} from './batch-settings.js'
export {DRAIN_WAIT_MS} from './batch-recover.js'

/**
 * The one runner: a batch of fault scenarios sharing one window. Pins and abort trials go to prefill and decode
 * directly, once each (a retrying router would pin an evicted pin again); steady load and canaries go through the
 * router, as users' requests do. A batch may span several prefill/decode instance pairs: each scenario acts through
 * its own pair's session (calibration, discovery, hosts, clients), and the sampler and drain cover every pair's
 * servers (their samples labelled by instance). Its phases: plan (batch-plan.ts: calibrate and discover once per run,
 * plan every scenario), inject each under its lease and verify it, observe (each scenario by its fault's `observe`
 * kind, observers.ts: pins or abort trials in one shared window under a light steady load, or a kind that watches
 * alone), revert all and verify clean, recover (batch-recover.ts: abort what is still held, canaries, drain), judge
 * (judge.ts). `inject` is a batch of one scenario; the suite runs batches in order. Faults act, the Recorder keeps
 * the timeline, checks judge: this module only sequences them.
 */

export interface BatchOutcome {
  scenarios: ScenarioRun[]
  /** The batch's floor: its longest pin window (deadline + poll). */
  floorMs: number
}

const HOLD_DEFAULT_MS = 60_000

export async function runBatch(
  session: RunSession,
  batch: BatchScenario[],
  settings: BatchSettings,
): Promise<BatchOutcome> {
  const b = await planBatch(session, batch, settings)
  if (settings.mode === 'dry-run') {
    const dry = dryRun(b.entries, b.hostOf, b.partHost, b.calibration, b.contract)
    return {scenarios: await abortable(dry, settings.signal, "the dry run's probes"), floorMs: 0}
  }
  // Nothing could be planned (each scenario refused, with its reason): nothing to inject, load or judge.
  if (!b.entries.some(e => e.plan))
    return {scenarios: b.entries.map(e => scenarioShell(e, b.contract, b.calibration, now())), floorMs: 0}
  return runPlanned(session, b, settings)
}

/** What the phases after planning share. */
interface Run {
  session: RunSession
  b: PlannedBatch
  planned: Entry[]
  settings: BatchSettings
  rec: Recorder
  signal: AbortSignal
  windowMs: number
  marginMs: number
  ttlMs: number
  /** What the judge needs to know of how the batch ended. */
  out: {stoppedEarly: boolean; recoveryStopped: boolean; loadedObserveMs?: number; held: boolean}
}

async function runPlanned(session: RunSession, b: PlannedBatch, settings: BatchSettings): Promise<BatchOutcome> {
  const {contract} = b
  const windowMs = (contract.deadlineSeconds + contract.pollSeconds) * 1000
  const marginMs = Math.max(2000, windowMs * 0.2)
  const ttlMs =
    settings.ttlMs ??
    (settings.mode === 'hold'
      ? HOLD_DEFAULT_MS
      : leaseTtlMs({...contract, holdMs: windowMs + marginMs + DRAIN_WAIT_MS + 30_000}))
  const rec = new Recorder()
  settings.onRecorder?.(rec)
  const signal = settings.signal ?? new AbortController().signal
  const planned = b.entries.filter(e => e.plan)
  const out = {stoppedEarly: false, recoveryStopped: false, held: false}
  const run: Run = {session, b, planned, settings, rec, signal, windowMs, marginMs, ttlMs, out}
  try {
    // A lease guard (and reverter) on every host a scenario acts on, each on its own: losing one host's connection
    // leaves that host's reverter to take its faults out by itself. One per host name: two pairs' placements hold
    // objects of their own for a host they share (its state dir is stateDir/<name> either way).
    const used = [
      ...new Map(
        planned.flatMap(e => [b.hostOf.get(e)!, ...(e.parts ?? []).map(x => b.partHost.get(x)!)]).map(h => [h.name, h]),
      ).values(),
    ]
    await withLeasesOn(
      used.length > 0 ? used : [b.pairs[0]!.session.placement.of('router')],
      g => underLeases(run, g),
      {
        say: settings.say,
        ...(settings.callerStopsOnSignal ? {actOn: 'second' as const} : {}),
      },
    )
  } finally {
    settings.onRecorder?.(undefined)
  }
  if (run.out.held) return {scenarios: heldScenarios(b.entries, contract, b.calibration), floorMs: 0}
  // A kind whose batch waits on more than the window (a restart behind its health gate) records its own floor.
  return {scenarios: judged(run), floorMs: floorMarkerMs(run.rec) ?? windowMs}
}

function judged(r: Run): ScenarioRun[] {
  return judgeBatch({
    entries: r.b.entries,
    observations: r.rec.sorted(),
    contract: r.b.contract,
    calibration: r.b.calibration!,
    loadedObserveMs: r.out.loadedObserveMs,
    stoppedEarly: r.out.stoppedEarly,
    recoveryStopped: r.out.recoveryStopped,
    loadIntervalMs: r.settings.loadIntervalMs,
    finishedAt: now(),
  })
}

/** What runs under the batch's leases: the load and sampler, then inject, observe, revert, recover. */
interface Live {
  guardOf: (host: string) => LeaseGuard
  guard: (e: Entry) => LeaseGuard
  servers: SampledServer[]
  load: SteadyLoad
  requestTimeoutMs: number
  pinController: AbortController
  pins: Array<{e: Entry; sent: Sent}>
  ctx: ObserveContext
  watch?: AloneWatch
}

async function underLeases(r: Run, guardOf: (host: string) => LeaseGuard): Promise<void> {
  const {settings, rec, b} = r
  // Every pair's servers: each one's queues, tokens and counters are the evidence of its scenarios.
  const servers = serversOf(b.pairs)
  const sampler = startSampler(rec, servers)
  const requestTimeoutMs = r.windowMs + r.marginMs + 5000
  const load = new SteadyLoad(r.session.router, rec, {
    intervalMs: settings.mode === 'hold' ? 0 : settings.loadIntervalMs,
    promptTokens: settings.promptTokens,
    requestTimeoutMs,
    maxDurationMs: r.windowMs + r.marginMs * 3 + DRAIN_WAIT_MS + 60_000,
  })
  const pinController = new AbortController()
  // Every pin and abort trial in flight listens on this one signal: many listeners are the design, not a leak.
  setMaxListeners(0, pinController.signal)
  const ctx: ObserveContext = {
    session: r.session,
    pairs: b.pairs,
    pairOf: b.pairOf,
    rec,
    settings,
    signal: r.signal,
    calibration: b.calibration!,
    servers,
    requestTimeoutMs,
  }
  const guard = (e: Entry): LeaseGuard => guardOf(b.hostOf.get(e)!.name)
  const live: Live = {guardOf, guard, servers, load, requestTimeoutMs, pinController, pins: [], ctx}
  try {
    await faultWindow(r, live)
  } finally {
    pinController.abort()
    await live.watch?.stop()
    await load.abandon()
    await sampler.stop()
  }
}

/** Baseline, inject, observe, revert, recover: every step of a batch with its faults in place. */
async function faultWindow(r: Run, live: Live): Promise<void> {
  const {settings, signal} = r
  const logMarks = await beforeFault(r, live)
  await injectAll(r, live)
  const active = r.planned.filter(e => injectedEverywhere(e) && leasesOf(e).every(l => l.revertedAt === null))
  if (settings.mode === 'hold') {
    // The leases stay armed: the host's reverters take the faults out at expiry.
    for (const e of active) {
      live.guard(e).release(e.lease!.id)
      for (const x of e.parts ?? []) live.guardOf(x.host).release(x.lease!.id)
    }
    r.out.held = true
    return
  }
  await observe(r, live, active)
  r.out.stoppedEarly = signal.aborted
  // Stop watching the pins: what is still held is abandoned by the client now (recorded as such).
  live.pinController.abort()
  await Promise.all(live.pins.map(p => p.sent.done))
  await revertAll(r, live, active)
  await live.watch?.afterRevert()
  await afterRevert(r, live, logMarks)
  // A stop after the window (during the revert or the recovery) leaves recovery unproven, not failed.
  r.out.recoveryStopped = signal.aborted
}

/**
 * Let the load show the deployment healthy before the fault, take the counters' baseline, mark where each pair's logs
 * stand (afterwards only what they gained is read), and start a kind that watches from before the fault (it runs
 * alone: the planner sees to it).
 */
async function beforeFault(r: Run, live: Live): Promise<Map<PairInBatch, LogMark[]>> {
  const {settings} = r
  if (settings.loadIntervalMs > 0 && settings.mode !== 'hold')
    await sleep(Math.min(500, settings.loadIntervalMs * 2), r.signal)
  await sampleOnce(r.rec, live.servers)
  const logMarks = new Map<PairInBatch, LogMark[]>()
  if (settings.mode === 'run')
    for (const p of r.b.pairs)
      logMarks.set(
        p,
        await markLogs(role => p.session.placement.of(role).host, p.session.deployment, {timeoutMs: PROBE_TIMEOUT_MS}),
      )
  const alone = r.planned.find(e => kindOf(e).share === 'alone')
  const kind = alone && kindOf(alone)
  if (alone && kind?.share === 'alone' && settings.mode === 'run') live.watch = await kind.watch(alone, live.ctx)
  return logMarks
}

/**
 * With the faults in place: a kind that watches alone observes its scenario; otherwise every scenario of a window kind
 * sends its requests in the one shared window (pin-window.ts).
 */
async function observe(r: Run, live: Live, active: Entry[]): Promise<void> {
  if (r.signal.aborted) return
  const alone = active.find(e => kindOf(e).share === 'alone')
  if (alone && live.watch) {
    await live.watch.hold()
    return
  }
  const windowed = active.flatMap(e => {
    const kind = kindOf(e)
    return kind.share === 'window' ? [{e, kind: kind as WindowKind}] : []
  })
  if (windowed.length === 0) return
  const timing = {
    windowMs: r.windowMs,
    marginMs: r.marginMs,
    requestTimeoutMs: live.requestTimeoutMs,
    pinSignal: live.pinController.signal,
  }
  r.out.loadedObserveMs = await runPinWindow(windowed, live.ctx, timing, live.pins)
}

/**
 * Each scenario under its own lease, all at once (they touch different GPUs, ranks and ports: the planner saw to it).
 * A fault that did not take effect is reverted at once and never judged.
 */
async function injectAll(r: Run, live: Live): Promise<void> {
  const {signal, rec, ttlMs, b} = r
  const say = r.settings.say
  const hostName = (e: Entry) => (b.pairOf(e.s).session.placement.spansHosts ? b.hostOf.get(e)!.name : undefined)
  await Promise.all(
    r.planned.map(async e => {
      if (signal.aborted) return
      const tell = (l: string) => say(`${e.s.name}: ${l}`)
      e.startedAt = now()
      e.lease = await injectUnderLease(live.guard(e), e.plan!, rec, ttlMs, PROBE_TIMEOUT_MS, tell)
      if (hostName(e) !== undefined) e.lease.host = hostName(e)
      // The other nodes' parts, each under its own lease on its own host.
      for (const x of e.parts ?? []) {
        if (signal.aborted || !e.lease.verifiedInjected) break
        x.lease = await injectUnderLease(live.guardOf(x.host), x.plan, rec, ttlMs, PROBE_TIMEOUT_MS, l =>
          say(`${e.s.name} on ${x.host}: ${l}`),
        )
        x.lease.host = x.host
      }
      // A fault that did not take effect everywhere it acts is taken out everywhere at once, and never judged.
      if (!injectedEverywhere(e)) {
        await revertAndVerify(live.guard(e), e.plan!, rec, e.lease, PROBE_TIMEOUT_MS, tell)
        for (const x of e.parts ?? [])
          if (x.lease)
            await revertAndVerify(live.guardOf(x.host), x.plan, rec, x.lease, PROBE_TIMEOUT_MS, l =>
              say(`${e.s.name} on ${x.host}: ${l}`),
            )
      }
    }),
  )
}

/** Every active fault out, on every node it acts on, each verified clean. */
async function revertAll(r: Run, live: Live, active: Entry[]): Promise<void> {
  const say = r.settings.say
  await Promise.all(
    active.flatMap(e => [
      revertAndVerify(live.guard(e), e.plan!, r.rec, e.lease!, PROBE_TIMEOUT_MS, l => say(`${e.s.name}: ${l}`)),
      ...(e.parts ?? []).map(x =>
        revertAndVerify(live.guardOf(x.host), x.plan, r.rec, x.lease!, PROBE_TIMEOUT_MS, l =>
          say(`${e.s.name} on ${x.host}: ${l}`),
        ),
      ),
    ]),
  )
}

/** What is still held let go of, the pins' log lines read, then recovery (batch-recover.ts). */
async function afterRevert(r: Run, live: Live, logMarks: Map<PairInBatch, LogMark[]>): Promise<void> {
  const {b, rec, signal, settings} = r
  const revertedAt = () => Math.max(0, ...r.planned.flatMap(e => leasesOf(e).map(l => l.revertedAt ?? 0)))
  // A pin is let go of on its own pair's servers; the load went through the gateway, to any pair's.
  const everyServer = live.servers.map(x => x.client)
  await releaseHeld(
    rec,
    [
      ...live.pins.map(p => ({sent: p.sent, on: [b.pairOf(p.e.s).session.prefill, b.pairOf(p.e.s).session.decode]})),
      ...live.load.sent.map(sent => ({sent, on: everyServer})),
    ],
    revertedAt(),
  )
  for (const p of b.pairs) {
    const rids = live.pins.filter(x => b.pairOf(x.e.s) === p).map(x => x.sent.rid)
    if (rids.length > 0) await readPinLogs(p, b.spansPairs, rec, logMarks.get(p) ?? [], rids, settings.say)
  }
  if (!signal.aborted)
    await recover(r.session, live.servers, rec, live.load, settings, revertedAt(), signal, settings.say)
}

/** The floor a kind recorded for its batch (marker batch-floor, in ms), else undefined. */
function floorMarkerMs(rec: Recorder): number | undefined {
  const m = rec.observations.find(o => o.kind === 'marker' && o.name === 'batch-floor')
  return m?.kind === 'marker' ? Number(m.detail) : undefined
}
