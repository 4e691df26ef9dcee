import {checkAborts} from '../checks/abort.js'
import {checkCollateral} from '../checks/collateral.js'
import {checkEvictions, type PinRecord} from '../checks/eviction.js'
import {checkRecovery} from '../checks/recovery.js'
import {checkScope} from '../checks/scope.js'
import type {Calibration, PinState, Timeline} from '../model/timeline.js'
import {fail, pass, type Verdict} from '../model/verdict.js'
import type {Deployment} from '../deployment/config.js'
import {RouterClient} from '../deployment/router-client.js'
import {SglangClient} from '../deployment/sglang-client.js'
import {discover} from '../discovery/discover.js'
import {oneLine} from '../errors.js'
import {faultDiscovery, type FaultPlan, renderPlan, runProbes} from '../faults/fault.js'
import {type LeaseGuard, withLeases} from '../faults/lease/lease-guard.js'
import {leaseTtlMs, newLeaseId} from '../faults/lease/lease.js'
import {getFault} from '../faults/registry.js'
import {sweepOffsets} from '../faults/abort-mid-transfer.js'
import {classifyDataPath} from '../faults/mechanisms/data-path.js'
import type {Host} from '../hosts/host.js'
import {now, Recorder} from '../workload/recorder.js'
import {sampleOnce, startSampler} from '../workload/sampler.js'
import {sendRequest, type Sent} from '../workload/send.js'
import {SteadyLoad} from '../workload/steady-load.js'
import {sleep, within} from '../workload/wait.js'
import {calibrate} from './calibrate.js'

/**
 * One experiment, end to end: discover, plan, calibrate on unfaulted requests, lease, inject, verify it took,
 * drive pins (or abort trials) under a light steady load, wait for each pin's window to close, revert, verify
 * clean, prove recovery, judge. Faults act, the Timeline records, checks judge: this module only sequences them.
 */

export interface InjectOptions {
  fault: string
  params: Record<string, unknown>
  pins: number
  /** Milliseconds between pin sends (0: all at once). */
  pinIntervalMs: number
  /** Inject, verify, and leave the fault in place for its TTL (the lease reverts it). */
  hold: boolean
  dryRun: boolean
  /** Lease TTL override, seconds. */
  ttlS?: number
  promptTokens: number
  /** Steady load: one request every loadIntervalMs while the experiment runs (0: none). */
  loadIntervalMs: number
  canaries: number
  onProgress?: (line: string) => void
}

export interface LeaseRecord {
  id: string
  fault: string
  mechanism: string
  injectedAt: number | null
  revertedAt: number | null
  verifiedInjected: boolean
  verifiedClean: boolean
  expiresAt: number
  evidence: {injected: string[]; clean: string[]}
}

export interface InjectResult {
  fault: string
  mechanism: string
  description: string
  plan: ReturnType<typeof renderPlan>
  dryRun?: {probes: Array<{argv: string; code: number | null; stdout: string; stderr: string}>}
  held?: {leaseId: string; expiresAt: string}
  calibration?: Calibration & {routerMs: number}
  lease?: LeaseRecord
  pins: PinRecord[]
  verdicts: Verdict[]
  summary: {passed: number; failed: number}
  timeline?: Timeline
}

/** Where each fault leaves its pins, in SGLang's terms (reference/sglang-pd.md §3-§4). */
export function pinStateOf(plan: FaultPlan): PinState {
  if (plan.fault === 'drop-dest-info') return {queue: 'bootstrap', kvPoll: 'Bootstrapping'}
  return {queue: 'inflight', kvPoll: 'Transferring'}
}

export async function runInject(deployment: Deployment, host: Host, opts: InjectOptions): Promise<InjectResult> {
  const say = opts.onProgress ?? (() => {})
  const svc = deployment.services
  const probeMs = 5000
  const prefill = new SglangClient(svc.prefill.url, {service: 'prefill', timeoutMs: probeMs})
  const decode = new SglangClient(svc.decode.url, {service: 'decode', timeoutMs: probeMs})
  const router = new RouterClient(svc.router.url, {service: 'router', timeoutMs: probeMs, metricsUrl: svc.router.metricsUrl})
  const {deadlineSeconds, pollSeconds} = deployment.watchdog

  const fault = getFault(opts.fault)
  const isAbort = opts.fault === 'abort-mid-transfer'
  // abort-mid-transfer plans from a transfer window that is measured below; a nominal one validates the flags now.
  const nominal = isAbort && opts.params.windowStartMs === undefined ? {windowStartMs: 0, windowEndMs: 100} : {}
  let params = fault.parseParams({...opts.params, ...nominal}) as Record<string, unknown>
  const rec = new Recorder()
  let calibration: (Calibration & {routerMs: number}) | undefined
  // Unfaulted requests first: they calibrate ε, and they open what a fresh deployment opens lazily (decode's route
  // cache, the KV data connections that stall-kv must find). A dry run sends one, which changes nothing.
  if (!opts.dryRun) {
    say('calibrating on unfaulted requests')
    calibration = await calibrate(deployment, {prefill, decode, router}, {promptTokens: opts.promptTokens, ...(opts.hold ? {requests: 1} : {})})
  } else {
    await router.generate({rid: `pdchaos-warmup-${Date.now().toString(36)}`, text: 'warm up', max_new_tokens: 1}, {timeoutMs: 30_000}).catch(() => undefined)
  }
  say('discovering the deployment')
  const report = await discover(deployment, host, {timeoutMs: probeMs})
  const disc = faultDiscovery(report, deployment)
  if (isAbort && opts.params.windowStartMs === undefined) {
    // Unless told otherwise, widen the transfer window on a TCP data path by rate-limiting one rank's KV connections,
    // so the sweep lands inside Transferring rather than around a sub-millisecond transfer.
    const widen = opts.params.widenKBytesPerSecond === undefined && classifyDataPath(disc.transport).kind === 'tcp'
      ? {gpu: opts.params.gpu ?? disc.ranks.find((r) => r.service === 'prefill' && r.gpu !== undefined)?.gpu, widenKBytesPerSecond: DEFAULT_WIDEN_KBYTES}
      : {}
    const p = calibration?.prefillMs ?? 50
    params = fault.parseParams({...opts.params, ...widen, windowStartMs: Math.round(Math.max(0, p * 0.6)), windowEndMs: Math.round(Math.max(p, 3))}) as Record<string, unknown>
  }
  const leaseId = newLeaseId(opts.fault)
  const facts = await fault.gather(host, disc, params, {timeoutMs: probeMs})
  const plan = fault.plan({discovery: disc, params, leaseId, facts})
  const rendered = renderPlan(plan)
  const base = {fault: plan.fault, mechanism: plan.mechanism, description: plan.description, plan: rendered}

  if (opts.dryRun) {
    say('dry run: read-only probes only')
    const probes = []
    for (const argv of plan.readOnlyProbes) {
      try {
        const r = await host.run(argv, {timeoutMs: probeMs, sudo: plan.sudo})
        probes.push({argv: renderPlan({...plan, readOnlyProbes: [argv]}).readOnlyProbes[0], code: r.code, stdout: r.stdout.slice(0, 2000), stderr: r.stderr.slice(0, 500)})
      } catch (error) {
        probes.push({argv: argv.join(' '), code: null, stdout: '', stderr: oneLine(error)})
      }
    }
    const verdicts = probes.filter((p) => p.code !== 0).map((p) => fail('fault-effect', p.argv, `read-only probe failed: ${p.stderr || `exit ${p.code}`}`, {probe: p}))
    return {...base, dryRun: {probes}, pins: [], verdicts, summary: {passed: 0, failed: verdicts.length}}
  }

  const observeWindowMs = (deadlineSeconds + pollSeconds) * 1000
  const marginMs = Math.max(2000, observeWindowMs * 0.2)
  // --hold keeps the fault for its TTL (60 s unless --ttl); a run holds it through its window plus a margin.
  const ttlMs = opts.ttlS !== undefined ? opts.ttlS * 1000
    : opts.hold ? HOLD_DEFAULT_MS : leaseTtlMs({deadlineSeconds, pollSeconds, holdMs: observeWindowMs + marginMs + 10_000})

  return withLeases(host, deployment.stateDir, async (guard) => {
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
    // Let the load show the deployment healthy before the fault.
    if (opts.loadIntervalMs > 0 && !opts.hold) await sleep(Math.min(2000, opts.loadIntervalMs * 3))

    const lease = await createAndInject(guard, plan, rec, ttlMs, probeMs, say)
    if (!lease.verifiedInjected) {
      // Never judge a watchdog against a fault that is not there.
      await revertAndVerify(guard, plan, rec, lease, host, probeMs, say)
      await stopAll()
      const v = fail('fault-effect', lease.id, `the fault did not take effect: ${lease.evidence.injected.join('; ')}`, {lease})
      return {...base, lease, calibration, pins: [], verdicts: [v], summary: {passed: 0, failed: 1}}
    }
    if (opts.hold) {
      await stopAll()
      guard.dispose()
      // The lease stays armed: its reverter takes the fault out at expiry.
      guard.release(lease.id)
      return {...base, lease, held: {leaseId: lease.id, expiresAt: new Date(lease.expiresAt).toISOString()}, pins: [], verdicts: [], summary: {passed: 0, failed: 0}}
    }
    const expectedState = pinStateOf(plan)
    if (plan.trials && plan.inject.length > 0 && calibration) {
      const stalled = params.widenKBytesPerSecond === 0
      let end: number
      if (stalled) {
        // The transfer is held still: every request sits in Transferring once its forward is done, so the window
        // runs from the unfaulted prefill time for as long as the watchdog leaves the request alone.
        end = calibration.prefillMs + Math.min(1000, deadlineSeconds * 1000 * 0.4)
      } else {
        // Slowed, not stopped: measure the window again with the limit in place.
        const widened = await calibrate(deployment, {prefill, decode, router}, {promptTokens: opts.promptTokens, requests: 3, routerToo: false})
        end = Math.max(calibration.prefillMs + 1, widened.prefillMs * 0.95)
      }
      const offsets = sweepOffsets(plan.trials.length, calibration.prefillMs, end)
      plan.trials.forEach((t, i) => { t.offsetMs = offsets[i] })
      say(`transfer window ${stalled ? 'held open' : 'widened'}: aborts at ${calibration.prefillMs.toFixed(0)}..${end.toFixed(0)} ms after send`)
    }

    const pinController = new AbortController()
    try {
      const pins: Sent[] = []
      if (plan.trials) {
        say(`abort trials: ${plan.trials.length}`)
        await Promise.all(plan.trials.map(async (trial) => {
          const s = sendRequest(router, rec, {role: 'pin', rid: trial.rid, fault: plan.fault, expectedState, timeoutMs: requestTimeoutMs, signal: pinController.signal, promptTokens: opts.promptTokens})
          pins.push(s)
          await sleep(s.sentAt + trial.offsetMs - now())
          await Promise.all(trial.aborts.map(async (a) => {
            const client = a.service === 'prefill' ? prefill : decode
            const t = now()
            const r = await client.abort(a.body.rid).catch(() => undefined)
            rec.add({kind: 'abort-sent', t, rid: trial.rid, target: a.service, status: r?.status})
          }))
        }))
      } else {
        say(`sending ${opts.pins} pin(s), ${opts.pinIntervalMs} ms apart`)
        for (let i = 0; i < opts.pins; i++) {
          // Spaced, so each pin enters the queue as it is sent: a burst queues at the server and every pin's entry
          // lags its send by a different, unseen amount, which would blur the deadline window.
          if (i > 0 && opts.pinIntervalMs > 0) await sleep(opts.pinIntervalMs)
          pins.push(sendRequest(router, rec, {role: 'pin', fault: plan.fault, expectedState, timeoutMs: requestTimeoutMs, signal: pinController.signal, promptTokens: opts.promptTokens}))
        }
      }
      // Wait until every pin has answered or its window (deadline + poll + margin) has closed.
      const closeAt = Math.max(...pins.map((p) => p.sentAt)) + observeWindowMs + marginMs
      say(`waiting for evictions (window closes in ${((closeAt - now()) / 1000).toFixed(1)}s)`)
      await within(Promise.all(pins.map((p) => p.done)), closeAt - now())
      // Stop watching the pins: what is still held is abandoned by the client now (recorded as such).
      pinController.abort()
      await Promise.all(pins.map((p) => p.done))
      await revertAndVerify(guard, plan, rec, lease, host, probeMs, say)
      // Nothing left behind: every request the fault held and nothing released (pins, load) is aborted on both servers.
      const answered = new Set(rec.observations.filter((o) => o.kind === 'request-answered').map((o) => (o as {rid: string}).rid))
      const held = [...pins, ...load.sent].filter((s) => s.sentAt <= (lease.revertedAt ?? now()) && !answered.has(s.rid))
      for (const s of held) {
        await Promise.all([prefill.abort(s.rid).catch(() => undefined), decode.abort(s.rid).catch(() => undefined)])
        rec.marker('cleanup-abort', s.rid)
      }
      // Recovery: the next requests must succeed, then the queues must drain (decode lets go of a request whose
      // client went away only after SGLANG_REQUEST_STATE_WAIT_TIMEOUT, so this waits, with a deadline).
      for (let i = 0; i < opts.canaries; i++) await sendRequest(router, rec, {role: 'canary', timeoutMs: 30_000, promptTokens: opts.promptTokens}).done
      say('waiting for the queues to drain')
      await load.stopSending()
      await within(Promise.all(load.sent.map((p) => p.done)), DRAIN_WAIT_MS)
      const drainBy = now() + DRAIN_WAIT_MS
      do {
        await sampleOnce(rec, {prefill, decode})
        if (drained(rec)) break
        await sleep(500)
      } while (now() < drainBy)
    } finally {
      pinController.abort()
      await stopAll()
    }

    const timeline: Timeline = {contract: deployment.watchdog, calibration: calibration!, observations: rec.sorted()}
    const {verdicts: evictionVerdicts, pins} = plan.trials ? {verdicts: [], pins: []} : checkEvictions(timeline)
    const verdicts: Verdict[] = [
      pass('fault-effect', lease.id, `${plan.fault} took effect: ${lease.evidence.injected.join('; ') || 'nothing to change on the host'}`, {lease}),
      ...evictionVerdicts,
      ...(plan.trials ? checkAborts(timeline) : checkScope(timeline)),
      // Abort trials move several counters through several paths (honoured, lost, evicted, cleaned up): their own
      // verdicts judge them, so the counter balance is checked for watchdog pins only.
      ...checkRecovery(timeline, {failureCounters: plan.trials ? [] : ['sglang:num_watchdog_evicted_reqs_total']}),
      ...(opts.loadIntervalMs > 0 ? [checkCollateral(timeline)] : []),
      lease.verifiedClean
        ? pass('cleanup', lease.id, `reverted and verified clean: ${lease.evidence.clean.join('; ') || 'nothing was changed on the host'}`, {lease})
        : fail('cleanup', lease.id, `revert not verified clean: ${lease.evidence.clean.join('; ')}`, {lease}),
    ]
    const failed = verdicts.filter((v) => v.verdict === 'fail').length
    return {...base, calibration, lease, pins, verdicts, summary: {passed: verdicts.length - failed, failed}, timeline}
  }, {say})
}

export async function createAndInject(guard: LeaseGuard, plan: FaultPlan, rec: Recorder, ttlMs: number, probeMs: number, say: (l: string) => void): Promise<LeaseRecord> {
  const lease = await guard.create({
    id: plan.leaseId, fault: plan.fault, params: {mechanism: plan.mechanism, targets: plan.targets}, ttlMs,
    // A lease needs a revert; a fault that changes nothing on the host leaves a harmless one.
    revert: plan.revert.length > 0 ? plan.revert : [['true']], command: `inject ${plan.fault}`,
  })
  const record: LeaseRecord = {
    id: lease.id, fault: plan.fault, mechanism: plan.mechanism, injectedAt: null, revertedAt: null,
    verifiedInjected: false, verifiedClean: false, expiresAt: lease.expiresAt, evidence: {injected: [], clean: []},
  }
  say(`injecting ${plan.fault} (${plan.mechanism}) under lease ${lease.id}`)
  for (const argv of plan.inject) {
    const r = await guard.host.run(argv, {timeoutMs: probeMs, sudo: plan.sudo})
    if (r.code !== 0) record.evidence.injected.push(`\`${argv.join(' ')}\` exited ${r.code}: ${oneLine(r.stderr).slice(0, 200)}`)
  }
  record.injectedAt = now()
  const v = await runProbes(guard.host, plan.verifyInjected, probeMs)
  record.verifiedInjected = v.ok && record.evidence.injected.length === 0
  record.evidence.injected.push(...v.results.map((x) => x.evidence))
  rec.add({kind: 'fault-injected', t: record.injectedAt, fault: plan.fault, leaseId: lease.id, verified: record.verifiedInjected, evidence: record.evidence.injected.join('; ')})
  say(record.verifiedInjected ? `in place: ${record.evidence.injected.join('; ') || 'client-side fault'}` : `NOT in place: ${record.evidence.injected.join('; ')}`)
  return record
}

export async function revertAndVerify(guard: LeaseGuard, plan: FaultPlan, rec: Recorder, record: LeaseRecord, host: Host, probeMs: number, say: (l: string) => void): Promise<void> {
  say(`reverting lease ${record.id}`)
  const r = await guard.revert(record.id)
  record.revertedAt = now()
  const v = await runProbes(host, plan.verifyClean, probeMs)
  record.verifiedClean = v.ok && (r.exitCode === 0 || r.status === 'already-reverted')
  record.evidence.clean.push(`revert ${r.status} by ${r.byWhom ?? '?'} (exit ${r.exitCode})`, ...v.results.map((x) => x.evidence))
  rec.add({kind: 'fault-reverted', t: record.revertedAt, fault: plan.fault, leaseId: record.id, verifiedClean: record.verifiedClean, evidence: record.evidence.clean.join('; ')})
  say(record.verifiedClean ? 'verified clean' : `NOT verified clean: ${record.evidence.clean.join('; ')}`)
}

export const DRAIN_WAIT_MS = 20_000
const HOLD_DEFAULT_MS = 60_000
/** Widening the abort window on a TCP data path by default holds the transfer still (0 kB/s): on loopback one KV
 * segment can be the whole transfer, so a rate limit cannot stretch it. */
export const DEFAULT_WIDEN_KBYTES = 0

/** Every PD queue reads 0 in the latest loads snapshot of both servers. */
export function drained(rec: Recorder): boolean {
  const names = ['sglang_disagg_prefill_bootstrap_queue_reqs', 'sglang_disagg_prefill_inflight_queue_reqs', 'sglang_disagg_decode_prealloc_queue_reqs', 'sglang_disagg_decode_transfer_queue_reqs']
  const last = new Map<string, number>()
  for (const o of rec.observations) if (o.kind === 'metric' && names.includes(o.name)) last.set(`${o.service}/${o.name}`, o.value)
  return last.size > 0 && [...last.values()].every((v) => v === 0)
}

