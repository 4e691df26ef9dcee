import {checkAborts} from '../checks/abort.js'
import {checkCollateral} from '../checks/collateral.js'
import {checkEvictions} from '../checks/eviction.js'
import {checkRecovery} from '../checks/recovery.js'
import {checkScope} from '../checks/scope.js'
import type {Calibration, Observation, Timeline} from '../model/timeline.js'
import {fail, pass, type Verdict} from '../model/verdict.js'
import type {Deployment} from '../deployment/config.js'
import {RouterClient} from '../deployment/router-client.js'
import {SglangClient} from '../deployment/sglang-client.js'
import {discover} from '../discovery/discover.js'
import {oneLine} from '../errors.js'
import {calibrate} from '../experiment/calibrate.js'
import {createAndInject, DEFAULT_WIDEN_KBYTES, DRAIN_WAIT_MS, drained, type LeaseRecord, pinStateOf, revertAndVerify} from '../experiment/inject.js'
import {sweepOffsets} from '../faults/abort-mid-transfer.js'
import {faultDiscovery, type FaultPlan} from '../faults/fault.js'
import {withLeases} from '../faults/lease/lease-guard.js'
import {leaseTtlMs, newLeaseId} from '../faults/lease/lease.js'
import {getFault} from '../faults/registry.js'
import type {Host} from '../hosts/host.js'
import type {ScenarioRun} from '../model/run.js'
import {now, Recorder} from '../workload/recorder.js'
import {sampleOnce, startSampler} from '../workload/sampler.js'
import {sendRequest, type Sent} from '../workload/send.js'
import {SteadyLoad} from '../workload/steady-load.js'
import {within} from '../workload/wait.js'
import type {PlannedScenario} from './planner.js'

/**
 * One batch of fault scenarios sharing one window: one calibration, one steady load, inject all (each under its own
 * lease), send each scenario's pins, wait for the longest window, revert all, one recovery. Each pin is judged by
 * its own scenario (its own expected state and bounds) on a view of the timeline without the other scenarios' pins;
 * the batch-wide checks (recovery, collateral) are judged once, on the whole timeline, and reported on the batch's
 * first scenario so that a failure is counted once.
 */

const PIN_BURST = 10
const PIN_TICK_MS = 50

export interface BatchOptions {
  promptTokens: number
  loadIntervalMs: number
  canaries: number
  /** Aborted when a stop condition fires: the batch stops waiting and reverts at once. */
  signal: AbortSignal
  say: (line: string) => void
  /** Told when the batch has its recorder (the collateral stop condition reads it live). */
  onRecorder?: (rec: Recorder | undefined) => void
  /** A countdown to the batch's window close (for a spinner). */
  onDeadline?: (label: string, at: number) => void
  /** A calibration from an earlier batch on the same processes (no restart since): reused, not measured again. */
  calibration?: Calibration & {routerMs: number}
}

export interface BatchOutcome {
  scenarios: ScenarioRun[]
  /** The batch's floor: its longest pin window (deadline + poll). */
  floorMs: number
  calibration: Calibration & {routerMs: number}
}

interface Entry {
  s: PlannedScenario
  plan?: FaultPlan
  lease?: LeaseRecord
  error?: string
  params: Record<string, unknown>
  startedAt: number
}

const sleep = (ms: number, signal?: AbortSignal) => new Promise<void>((resolve) => {
  if (signal?.aborted) return resolve()
  const onAbort = () => { clearTimeout(t); resolve() }
  const t = setTimeout(() => { signal?.removeEventListener('abort', onAbort); resolve() }, ms)
  signal?.addEventListener('abort', onAbort, {once: true})
})

export async function runBatch(deployment: Deployment, host: Host, batch: PlannedScenario[], opts: BatchOptions): Promise<BatchOutcome> {
  const say = opts.say
  const svc = deployment.services
  const probeMs = 5000
  const prefill = new SglangClient(svc.prefill.url, {service: 'prefill', timeoutMs: probeMs})
  const decode = new SglangClient(svc.decode.url, {service: 'decode', timeoutMs: probeMs})
  const router = new RouterClient(svc.router.url, {service: 'router', timeoutMs: probeMs, metricsUrl: svc.router.metricsUrl})
  const contract = deployment.watchdog
  const {deadlineSeconds, pollSeconds} = contract
  const observeWindowMs = (deadlineSeconds + pollSeconds) * 1000
  const marginMs = Math.max(2000, observeWindowMs * 0.2)
  // Calibrate before discovery: a fresh deployment publishes its ranks' ZMQ ports on the bootstrap route only once
  // it has served a request, and drop-dest-info plans from those ports.
  if (!opts.calibration) say('calibrating on unfaulted requests')
  const calibration = opts.calibration ?? await calibrate(deployment, {prefill, decode, router}, {promptTokens: opts.promptTokens})
  say('discovering the deployment')
  const disc = faultDiscovery(await discover(deployment, host, {timeoutMs: probeMs}), deployment)

  // Plan every scenario before anything is injected; one that cannot be planned is an error of its own.
  const entries: Entry[] = []
  for (const s of batch) {
    const fault = getFault(s.spec.fault!)
    const raw: Record<string, unknown> = {...s.spec.params}
    if (s.spec.fault === 'abort-mid-transfer') {
      const p = calibration.prefillMs
      if (raw.gpu !== undefined && raw.widenKBytesPerSecond === undefined) raw.widenKBytesPerSecond = DEFAULT_WIDEN_KBYTES
      raw.windowStartMs = Math.round(Math.max(0, p * 0.6))
      raw.windowEndMs = Math.round(Math.max(p, 3))
    }
    const e: Entry = {s, params: raw, startedAt: now()}
    try {
      const params = fault.parseParams(raw)
      const leaseId = newLeaseId(s.spec.fault!)
      const facts = await fault.gather(host, disc, params, {timeoutMs: probeMs})
      e.plan = fault.plan({discovery: disc, params, leaseId, facts})
    } catch (error) {
      e.error = `could not plan: ${oneLine(error)}`
    }
    entries.push(e)
  }
  const live = () => entries.filter((e) => e.plan && !e.error)
  const ttlMs = leaseTtlMs({deadlineSeconds, pollSeconds, holdMs: observeWindowMs + marginMs + DRAIN_WAIT_MS + 30_000})
  const rec = new Recorder()
  opts.onRecorder?.(rec)
  let stoppedEarly = false
  let loadedObserveMs: number | undefined

  try {
    await withLeases(host, deployment.stateDir, async (guard) => {
      const sampler = startSampler(rec, {prefill, decode})
      const requestTimeoutMs = observeWindowMs + marginMs + 5000
      const load = new SteadyLoad(router, rec, {
        intervalMs: opts.loadIntervalMs, promptTokens: opts.promptTokens, requestTimeoutMs,
        maxDurationMs: observeWindowMs + marginMs * 3 + DRAIN_WAIT_MS + 60_000,
      })
      const stopAll = async () => {
        await load.abandon()
        await sampler.stop()
      }
      const pinController = new AbortController()
      const pins: Array<{e: Entry; sent: Sent}> = []
      try {
        if (opts.loadIntervalMs > 0) await sleep(Math.min(500, opts.loadIntervalMs * 2), opts.signal)
        for (const e of live()) {
          if (opts.signal.aborted) break
          e.startedAt = now()
          e.lease = await createAndInject(guard, e.plan!, rec, ttlMs, probeMs, (l) => say(`${e.s.name}: ${l}`))
          if (!e.lease.verifiedInjected) await revertAndVerify(guard, e.plan!, rec, e.lease, host, probeMs, (l) => say(`${e.s.name}: ${l}`))
        }
        const active = live().filter((e) => e.lease?.verifiedInjected && e.lease.revertedAt === null)
        // Abort trials: their offsets sweep the window, which the widening holds open (as inject does).
        for (const e of active) {
          const plan = e.plan!
          if (!plan.trials || plan.inject.length === 0) continue
          const end = calibration.prefillMs + Math.min(1000, deadlineSeconds * 1000 * 0.4)
          const offsets = sweepOffsets(plan.trials.length, calibration.prefillMs, end)
          plan.trials.forEach((t, i) => { t.offsetMs = offsets[i] })
        }
        if (!opts.signal.aborted) {
          say(`sending pins: ${active.map((e) => `${e.s.name} ${e.plan!.trials ? `${e.plan!.trials.length} abort trials` : `${e.s.spec.pins} pin(s)`}`).join(', ')}`)
          // Many pins load the deployment: the observation delay is measured again while they are sent (the same hops
          // as calibration), and ε uses the larger of the idle and the loaded figure.
          const totalPins = active.reduce((n, e) => n + (e.plan!.trials ? 0 : e.s.spec.pins), 0)
          let sending = true
          const loadedHops: number[] = []
          const hopProbe = (async () => {
            for (let i = 0; totalPins > PIN_BURST && sending && i < 2000; i++) {
              const [a, b] = await Promise.all([router.liveness(), prefill.health('/v1/loads')])
              loadedHops.push(a.ms + b.ms)
            }
          })()
          await Promise.all(active.map(async (e) => {
            const plan = e.plan!
            const expectedState = pinStateOf(plan)
            const base = {role: 'pin' as const, fault: plan.fault, scenario: e.s.name, expectedState, timeoutMs: requestTimeoutMs, signal: pinController.signal, promptTokens: opts.promptTokens}
            if (!plan.trials) {
              // Paced (PIN_BURST every PIN_TICK_MS): a burst of a thousand requests queues in front of the server, and the
              // time it waits there before entering the watched queue is time the client would count against the watchdog.
              for (let i = 0; i < e.s.spec.pins; i++) {
                if (i > 0 && i % PIN_BURST === 0) await sleep(PIN_TICK_MS)
                pins.push({e, sent: sendRequest(router, rec, base)})
              }
              return
            }
            await Promise.all(plan.trials.map(async (trial) => {
              const sent = sendRequest(router, rec, {...base, rid: trial.rid})
              pins.push({e, sent})
              await sleep(Math.max(0, sent.sentAt + trial.offsetMs - now()))
              await Promise.all(trial.aborts.map(async (a) => {
                const client = a.service === 'prefill' ? prefill : decode
                const t = now()
                const r = await client.abort(a.body.rid).catch(() => undefined)
                rec.add({kind: 'abort-sent', t, rid: trial.rid, target: a.service, status: r?.status})
              }))
            }))
          }))
          sending = false
          await hopProbe
          if (loadedHops.length > 0) {
            const sorted = [...loadedHops].sort((a, b) => a - b)
            loadedObserveMs = sorted[Math.min(sorted.length - 1, Math.ceil(0.99 * sorted.length) - 1)]
            say(`observation delay under the pin load: p99 ${loadedObserveMs.toFixed(1)} ms over ${sorted.length} probes (idle ${calibration.observeMs.toFixed(1)} ms)`)
          }
          if (pins.length > 0) {
            const closeAt = Math.max(...pins.map((p) => p.sent.sentAt)) + observeWindowMs + marginMs
            say(`waiting for evictions (window closes in ${((closeAt - now()) / 1000).toFixed(1)}s)`)
            opts.onDeadline?.('window closes', closeAt)
            await Promise.race([Promise.all(pins.map((p) => p.sent.done)), sleep(Math.max(0, closeAt - now()), opts.signal)])
          }
        }
        stoppedEarly = opts.signal.aborted
        pinController.abort()
        await Promise.all(pins.map((p) => p.sent.done))
        for (const e of active) await revertAndVerify(guard, e.plan!, rec, e.lease!, host, probeMs, (l) => say(`${e.s.name}: ${l}`))
        const revertedAt = Math.max(0, ...live().map((e) => e.lease?.revertedAt ?? 0))
        const answered = new Set(rec.observations.filter((o) => o.kind === 'request-answered').map((o) => (o as {rid: string}).rid))
        for (const s of [...pins.map((p) => p.sent), ...load.sent].filter((x) => x.sentAt <= (revertedAt || now()) && !answered.has(x.rid))) {
          await Promise.all([prefill.abort(s.rid).catch(() => undefined), decode.abort(s.rid).catch(() => undefined)])
          rec.marker('cleanup-abort', s.rid)
        }
        if (!opts.signal.aborted) {
          for (let i = 0; i < opts.canaries; i++) await sendRequest(router, rec, {role: 'canary', timeoutMs: 30_000, promptTokens: opts.promptTokens}).done
          say('waiting for the queues to drain')
          await load.stopSending()
          // within() clears its timer: a pending 20 s timer would keep the process alive after the run.
          await within(Promise.all(load.sent.map((p) => p.done)), DRAIN_WAIT_MS)
          const drainBy = now() + DRAIN_WAIT_MS
          do {
            await sampleOnce(rec, {prefill, decode})
            if (drained(rec)) break
            await sleep(250, opts.signal)
          } while (now() < drainBy && !opts.signal.aborted)
        }
      } finally {
        pinController.abort()
        await stopAll()
      }
    }, {say})
  } finally {
    opts.onRecorder?.(undefined)
  }

  const observations = rec.sorted()
  const finishedAt = now()
  const anyTrials = live().some((e) => e.plan!.trials)
  const judged = loadedObserveMs !== undefined && loadedObserveMs > calibration.observeMs ? {...calibration, observeMs: loadedObserveMs} : calibration
  const whole: Timeline = {contract, calibration: judged, observations}
  const batchVerdicts: Verdict[] = stoppedEarly ? [] : [
    ...checkRecovery(whole, {failureCounters: anyTrials ? [] : ['sglang:num_watchdog_evicted_reqs_total']}),
    ...(opts.loadIntervalMs > 0 ? [checkCollateral(whole)] : []),
  ]
  const names = batch.map((s) => s.name)
  const label = names.length > 1 ? ` (batch: ${names.join(', ')})` : ''
  let batchAttached = false
  const scenarios = entries.map((e): ScenarioRun => {
    const tl = viewFor(whole, e.s.name)
    const verdicts: Verdict[] = []
    const leases = e.lease ? [e.lease] : []
    const run: ScenarioRun = {
      name: e.s.name, kind: 'inject', fault: e.s.spec.fault, params: e.s.spec.params, startedAt: Math.round(e.startedAt), finishedAt: Math.round(finishedAt),
      verdicts, pins: [], leases, timeline: tl, contract,
    }
    if (e.error) return {...run, error: e.error}
    const lease = e.lease
    if (!lease) return {...run, error: 'not injected: the run stopped first'}
    if (!lease.verifiedInjected) {
      verdicts.push(fail('fault-effect', lease.id, `the fault did not take effect: ${lease.evidence.injected.join('; ')}`, {lease}))
    } else {
      verdicts.push(pass('fault-effect', lease.id, `${e.plan!.fault} took effect: ${lease.evidence.injected.join('; ') || 'nothing to change on the host'}`, {lease}))
      if (!stoppedEarly) {
        if (e.plan!.trials) verdicts.push(...checkAborts(tl))
        else {
          const ev = checkEvictions(tl)
          verdicts.push(...ev.verdicts)
          run.pins = ev.pins
          verdicts.push(...checkScope(tl))
        }
      }
    }
    verdicts.push(lease.verifiedClean
      ? pass('cleanup', lease.id, `reverted and verified clean: ${lease.evidence.clean.join('; ') || 'nothing was changed on the host'}`, {lease})
      : fail('cleanup', lease.id, `revert not verified clean: ${lease.evidence.clean.join('; ')}`, {lease}))
    if (!batchAttached && lease.verifiedInjected) {
      batchAttached = true
      verdicts.push(...batchVerdicts.map((v) => ({...v, subject: v.subject + label})))
    }
    if (stoppedEarly) run.error = 'stopped before its window closed: no eviction verdict'
    return run
  })
  return {scenarios, floorMs: observeWindowMs, calibration}
}

/** The timeline as one scenario sees it: every observation except the other scenarios' pins (and their aborts). */
export function viewFor(tl: Timeline, scenario: string): Timeline {
  const others = new Set<string>()
  for (const o of tl.observations) if (o.kind === 'request-sent' && o.role === 'pin' && o.scenario !== undefined && o.scenario !== scenario) others.add(o.rid)
  const keep = (o: Observation): boolean => !('rid' in o && o.kind !== 'log' && o.rid !== undefined && others.has(o.rid))
  return {contract: tl.contract, calibration: tl.calibration as Calibration, observations: tl.observations.filter(keep)}
}
