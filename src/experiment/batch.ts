import {setMaxListeners} from 'node:events'

import type {BreakerExpectation, WedgeExpectation} from '../checks/expectation.js'
import {serviceClients} from '../deployment/clients.js'
import {IDLE_REFRESH_S} from '../deployment/freshness.js'
import type {SglangClient} from '../deployment/sglang-client.js'
import {oneLine, PdError} from '../errors.js'
import {type FaultDiscovery, type Observe, renderPlan} from '../faults/fault.js'
import type {LeaseGuard} from '../faults/lease/lease-guard.js'
import {leaseTtlMs, newLeaseId} from '../faults/lease/lease.js'
import {type ParamSource, parseFaultParams} from '../faults/params.js'
import {getFault} from '../faults/registry.js'
import type {ScenarioRun} from '../model/run.js'
import {now, Recorder} from '../workload/recorder.js'
import {type SampledServer, sampleOnce, startSampler} from '../workload/sampler.js'
import {sendDirect, sendRequest, type SendOptions, type Sent} from '../workload/send.js'
import {type LogMark, markLogs, readLogs} from '../workload/service-log.js'
import {SteadyLoad} from '../workload/steady-load.js'
import {abortable, throwIfStopped} from '../util/stop.js'
import {sleep, sleepUntil, within} from '../util/time.js'
import {type Entry, type EntryPart, injectedEverywhere, judgeBatch, leasesOf, scenarioShell} from './judge.js'
import {injectUnderLease, revertAndVerify} from './lease-steps.js'
import {type Calibrated, openBreakers, PROBE_TIMEOUT_MS, type RunSession, untilBreakersClose} from './session.js'
import {drained, gaugesOnly, type PairInBatch, pairsOf, serversOf} from './batch-pairs.js'
import {type BreakerTrial, tripAndProbe, watchBreakerClose} from './breaker-trial.js'
import type {BatchScenario} from './batch-scenario.js'
import {hostForFault, onHost, type PlacedHost, withLeasesOn} from './placement.js'
import {decodeFloorMs, holdHalves} from './decode-pins.js'
import {COMPETING_CODE, competingRefusal, competingText, competingTimeoutsFor, firingInWindow} from './competing.js'

export type {BatchScenario} from './batch-scenario.js'

/**
 * The one runner: a batch of fault scenarios sharing one window. Pins and abort trials go to prefill and decode
 * directly, once each (a retrying router would pin an evicted pin again); steady load and canaries go through the
 * router, as users' requests do. A batch may span several prefill/decode instance pairs: each scenario acts through
 * its own pair's session (calibration, discovery, hosts, clients), and the sampler and drain cover every pair's
 * servers (their samples labelled by instance). Calibrate (once per run), discover (once per run), plan every scenario,
 * lease and
 * inject each, verify, send pins (or abort trials, or watch health) under a light steady load, wait for the longest
 * window, revert all, verify clean, abort what is still held, canaries, drain, judge. `inject` is a
 * batch of one scenario; the suite runs batches in order. Faults act, the Recorder keeps the timeline, checks judge
 * (judge.ts): this module only sequences them.
 */

export interface BatchSettings {
  /**
   * run: the whole experiment; dry-run: plan and read-only probes only; hold: inject, verify, leave it to its lease.
   */
  mode: 'run' | 'dry-run' | 'hold'
  promptTokens: number
  /** Steady load: one request every loadIntervalMs while the batch runs (0: none). */
  loadIntervalMs: number
  canaries: number
  /** direct (default): each pin is one prefill request, sent to prefill and decode once. router: through the router,
   * as a client would send it — a retrying gateway then sends an evicted pin again and the verdicts judge the router,
   * not one request (kept to show exactly that). */
  pinPath?: 'direct' | 'router'
  /** Pins are sent `burst` at a time, `gapMs` apart: a burst queues at the server and blurs each pin's entry time. */
  pinPacing: {burst: number; gapMs: number}
  /** Lease TTL override (ms); default from the contract and the batch's window. */
  ttlMs?: number
  paramsSource: ParamSource
  /** A scenario that cannot be planned: thrown (inject: exit 2 naming why) or recorded as its error (suite). */
  planErrors: 'throw' | 'record'
  /**
   * Run a scenario although one of SGLang's own timeouts fires before its window closes (`--allow-competing-timeout`):
   * its pins released inside the window are unverified by construction. Default: refused at plan time.
   */
  allowCompetingTimeout?: boolean
  /**
   * The caller stops the batch on SIGINT or SIGTERM itself (through `signal`): the lease guards then leave the first
   * signal to it, so the batch reverts and the run is recorded; a second signal is theirs (revert and exit).
   */
  callerStopsOnSignal?: boolean
  /** Aborted when a stop condition fires: the batch stops waiting and reverts at once. */
  signal?: AbortSignal
  say: (line: string) => void
  /** Told when the batch has its recorder (the collateral stop condition reads it live). */
  onRecorder?: (rec: Recorder | undefined) => void
  /** A countdown to the batch's window close (for a spinner). */
  onDeadline?: (label: string, at: number) => void
}

export interface BatchOutcome {
  scenarios: ScenarioRun[]
  /** The batch's floor: its longest pin window (deadline + poll). */
  floorMs: number
}

/** Pause between two observation-delay probes while pins are out: enough samples for a p99, little added load. */
const HOP_PROBE_GAP_MS = 50
/** Upper bound on the queue drain after recovery: decode lets go of a request whose client left only after
 * SGLANG_REQUEST_STATE_WAIT_TIMEOUT (4 s), so this waits, with a deadline. */
export const DRAIN_WAIT_MS = 20_000
const HOLD_DEFAULT_MS = 60_000

export async function runBatch(
  session: RunSession,
  batch: BatchScenario[],
  settings: BatchSettings,
): Promise<BatchOutcome> {
  const {deployment} = session
  const say = settings.say
  const contract = deployment.watchdog
  const windowMs = (contract.deadlineSeconds + contract.pollSeconds) * 1000
  const marginMs = Math.max(2000, windowMs * 0.2)
  const pairs = pairsOf(session, batch)
  const main = pairs[0]!
  const pairOf = (s: BatchScenario): PairInBatch => pairs.find(p => p.session === (s.session ?? session))!
  const spansPairs = pairs.length > 1
  // Each pair is calibrated on its own servers (RunSession keeps it); its lag probes hold as many requests at once as
  // its pins, paced as they will be (none in hold mode).
  const calibrations = new Map<RunSession, Calibrated>()
  const stopOpt = settings.signal ? {signal: settings.signal} : {}
  if (settings.mode !== 'dry-run') {
    for (const p of pairs) {
      const lagProbes = {
        count: settings.mode === 'hold' ? 0 : batch.filter(s => pairOf(s) === p).reduce((n, s) => n + s.pins, 0),
        ...settings.pinPacing,
      }
      calibrations.set(
        p.session,
        await p.session.calibration({
          promptTokens: settings.promptTokens,
          say,
          lagProbes,
          ...(settings.mode === 'hold' ? {requests: 1} : {}),
          ...stopOpt,
        }),
      )
    }
  }
  const calibration = calibrations.get(main.session)
  if (settings.mode === 'dry-run')
    await abortable(warmUp(session, settings.signal), settings.signal, 'the warm-up request')
  const discoveries = new Map<RunSession, FaultDiscovery>()
  for (const p of pairs) discoveries.set(p.session, await p.session.discovery(say, settings.signal))

  // Plan every scenario before anything is injected.
  const entries: Entry[] = []
  // The host each scenario acts on (the one that owns what it targets, among its pair's), with its lease there; and
  // the host of each part of a fault on every node of a multi-node instance.
  const hostOf = new Map<Entry, PlacedHost>()
  const partHost = new Map<EntryPart, PlacedHost>()
  for (const s of batch) {
    const {session: on0, labels} = pairOf(s)
    const {placement} = on0
    const discovery = discoveries.get(on0)!
    const e: Entry = {
      s,
      startedAt: now(),
      ...(spansPairs ? {calibration: calibrations.get(on0), instances: labels} : {}),
    }
    try {
      const fault = getFault(s.fault)
      const params = parseFaultParams(fault, s.params, settings.paramsSource)
      const leaseId = newLeaseId(s.fault)
      const on = hostForFault(placement, params as Record<string, unknown>, discovery.ranks, s.gpuHost)
      const seen = onHost(discovery, on, placement)
      const facts = await abortable(
        fault.gather(on.host, seen, params, {timeoutMs: PROBE_TIMEOUT_MS}),
        settings.signal,
        `planning ${s.name}`,
      )
      e.plan = fault.plan({discovery: seen, params, leaseId, facts, calibration: calibrations.get(on0), contract})
      // SGLang's own timeouts that could release these pins: one firing before the window closes means the experiment
      // cannot exercise the watchdog. Refused before anything is injected, unless the caller allows it (its pins are
      // then unverified by construction).
      const competing = competingTimeoutsFor(fault.pins, e.plan.mechanism, discovery.sglangTimeouts)
      if (competing) e.competing = competing
      const firing = firingInWindow(competing, contract)
      if (firing.length > 0) {
        if (!settings.allowCompetingTimeout) throw competingRefusal(s.fault, firing, contract)
        e.competingAllowed = true
        e.plan.notes = [
          ...(e.plan.notes ?? []),
          `allowed to run although ${firing.map(c => competingText(c, contract)).join('; ')}: a pin released ` +
            `inside the window is unverified, never a pass`,
        ]
      }
      hostOf.set(e, on)
      // A fault on all of a role's ranks, on an instance over several nodes: the same fault on each other node's ranks,
      // each with its own plan and lease on its own host. (The twin's failure point is set through node 0's API for the
      // ranks it names: it stays one plan.)
      const every = fault.onEveryNode?.(params)
      if (every && s.gpuHost === undefined && e.plan.mechanism !== 'twin-failpoint') {
        const others = [
          ...new Set(
            discovery.ranks
              .filter(r => r.service === every && r.host !== undefined && r.host !== on.name)
              .map(r => r.host!),
          ),
        ]
        for (const name of others) {
          const at = placement.named(name)
          const seenThere = onHost(discovery, at, placement)
          const factsThere = await abortable(
            fault.gather(at.host, seenThere, params, {timeoutMs: PROBE_TIMEOUT_MS}),
            settings.signal,
            `planning ${s.name}`,
          )
          const part: EntryPart = {
            host: name,
            plan: fault.plan({
              discovery: seenThere,
              params,
              leaseId: newLeaseId(s.fault),
              facts: factsThere,
              calibration: calibrations.get(on0),
              contract,
            }),
          }
          e.parts ??= []
          e.parts.push(part)
          partHost.set(part, at)
        }
      }
      const acting = [on.name, ...(e.parts ?? []).map(x => x.host)]
      if (placement.spansHosts)
        say(`${s.name}: acts on ${acting.join(' and ')}${spansPairs ? ` (${labels.prefill} + ${labels.decode})` : ''}`)
      // A multi-node instance: a fault on some of its ranks; the plan says which of the instance's are untouched.
      const untouched = discovery.ranks.filter(
        r =>
          r.host !== undefined &&
          !acting.includes(r.host) &&
          e.plan!.targets.some(t => t.service === r.service) &&
          r.nodeRank !== undefined,
      )
      if (untouched.length > 0)
        e.plan.notes = [
          ...(e.plan.notes ?? []),
          `acts on ${acting.join(' and ')} only: ${untouched.map(r => `${r.service} TP${r.tpRank}`).join(', ')} ` +
            `on ${[...new Set(untouched.map(r => r.host))].join(', ')} (other node ranks of the instance) are not ` +
            `touched, and the all-reduce (MIN over every rank) still holds the request by the ranks it touches`,
        ]
    } catch (error) {
      if (settings.planErrors === 'throw') throw error
      // A refused scenario (its plan made, then refused) has no plan to act on.
      delete e.plan
      delete e.parts
      e.error =
        error instanceof PdError && error.code === COMPETING_CODE
          ? `not run: ${oneLine(error)}`
          : `could not plan: ${oneLine(error)}`
    }
    entries.push(e)
  }
  // Stopped while planning: nothing was injected; the run records it (a suite) or ends with it (inject), exit 3.
  throwIfStopped(settings.signal, 'planning the batch')
  const planned = entries.filter(e => e.plan)
  if (settings.mode === 'dry-run') {
    return {
      scenarios: await abortable(
        dryRun(entries, hostOf, partHost, calibration, contract),
        settings.signal,
        "the dry run's probes",
      ),
      floorMs: 0,
    }
  }
  // Nothing could be planned (each scenario refused, with its reason): nothing to inject, load or judge.
  if (planned.length === 0)
    return {scenarios: entries.map(e => scenarioShell(e, contract, calibration, now())), floorMs: 0}

  const ttlMs =
    settings.ttlMs ??
    (settings.mode === 'hold'
      ? HOLD_DEFAULT_MS
      : leaseTtlMs({
          deadlineSeconds: contract.deadlineSeconds,
          pollSeconds: contract.pollSeconds,
          holdMs: windowMs + marginMs + DRAIN_WAIT_MS + 30_000,
        }))
  const rec = new Recorder()
  settings.onRecorder?.(rec)
  const signal = settings.signal ?? new AbortController().signal
  let stoppedEarly = false
  let recoveryStopped = false
  let loadedObserveMs: number | undefined
  let held = false
  try {
    // A lease guard (and reverter) on every host a scenario acts on, each on its own: losing one host's connection
    // leaves that host's reverter to take its faults out by itself. One per host name: two pairs' placements hold
    // objects of their own for a host they share (its state dir is stateDir/<name> either way).
    const used = [
      ...new Map(
        planned.flatMap(e => [hostOf.get(e)!, ...(e.parts ?? []).map(x => partHost.get(x)!)]).map(h => [h.name, h]),
      ).values(),
    ]
    await withLeasesOn(
      used.length > 0 ? used : [main.session.placement.of('router')],
      async guardOf => {
        const guard = (e: Entry): LeaseGuard => guardOf(hostOf.get(e)!.name)
        // Every pair's servers: each one's queues, tokens and counters are the evidence of its scenarios.
        const servers = serversOf(pairs)
        const sampler = startSampler(rec, servers)
        const requestTimeoutMs = windowMs + marginMs + 5000
        const load = new SteadyLoad(session.router, rec, {
          intervalMs: settings.mode === 'hold' ? 0 : settings.loadIntervalMs,
          promptTokens: settings.promptTokens,
          requestTimeoutMs,
          maxDurationMs: windowMs + marginMs * 3 + DRAIN_WAIT_MS + 60_000,
        })
        const pinController = new AbortController()
        // Every pin and abort trial in flight listens on this one signal: many listeners are the design, not a leak.
        setMaxListeners(0, pinController.signal)
        const pins: Array<{e: Entry; sent: Sent}> = []
        let health: HealthWatch | undefined
        // trip-breaker runs alone (its footprint is exclusive): its trial, and the watch for the close after the
        // revert.
        let breaker: {e: Entry; x: BreakerExpectation; trial: BreakerTrial} | undefined
        try {
          // Let the load show the deployment healthy before the fault, and take the counters' baseline.
          if (settings.loadIntervalMs > 0 && settings.mode !== 'hold')
            await sleep(Math.min(500, settings.loadIntervalMs * 2), signal)
          await sampleOnce(rec, servers)
          // Where each pair's services' logs stand before the fault: afterwards only what they gained is read.
          const logMarks = new Map<PairInBatch, LogMark[]>()
          if (settings.mode === 'run')
            for (const p of pairs)
              logMarks.set(
                p,
                await markLogs(role => p.session.placement.of(role).host, p.session.deployment, {
                  timeoutMs: PROBE_TIMEOUT_MS,
                }),
              )
          // A wedge runs alone (the planner sees to it): its health watch reads its own pair's servers.
          const wedged = planned.find(e => e.plan!.expected?.kind === 'wedge')
          if (wedged && settings.mode === 'run')
            health = await startHealthWatch(pairOf(wedged.s).session, rec, wedged.plan!.expected as WedgeExpectation)
          const dpins = await holdHalves(planned, pairOf, rec, servers, settings, requestTimeoutMs, signal)
          await injectAll(
            guard,
            guardOf,
            e => (pairOf(e.s).session.placement.spansHosts ? hostOf.get(e)!.name : undefined),
            planned,
            rec,
            ttlMs,
            signal,
            say,
          )
          const active = planned.filter(e => injectedEverywhere(e) && leasesOf(e).every(l => l.revertedAt === null))
          if (settings.mode === 'hold') {
            // The leases stay armed: the host's reverters take the faults out at expiry.
            for (const e of active) {
              guard(e).release(e.lease!.id)
              for (const x of e.parts ?? []) guardOf(x.host).release(x.lease!.id)
            }
            held = true
            return
          }
          const wedges = observing(active, 'health', 'wedge')
          const trips = observing(active, 'breaker', 'breaker')
          if (!signal.aborted && trips.length > 0) {
            const e = trips[0]!
            const x = e.plan!.expected as BreakerExpectation
            const on = {promptTokens: settings.promptTokens, scenario: e.s.name, signal, say}
            const trial = await tripAndProbe(pairOf(e.s).session, rec, x, on)
            breaker = {e, x, trial}
          } else if (!signal.aborted && wedges.length > 0) {
            // A wedged instance holds no pin and runs no watchdog: hold it, watching health, for the detection bound.
            const hold = Math.max(...wedges.map(e => (e.plan!.expected as WedgeExpectation).holdSeconds)) * 1000
            say(`holding the wedge for ${(hold / 1000).toFixed(1)}s, sampling health`)
            settings.onDeadline?.('wedge held', now() + hold)
            await sleep(hold, signal)
          } else if (!signal.aborted && dpins?.observes(active)) await dpins.waitReleased(signal)
          else if (!signal.aborted && active.length > 0) {
            // The observation delay again, from the first pin to the window's end: a host (or a pdchaos) busier
            // now than at calibration delays every answer more, and ε must know it rather than call a pin late.
            const hops = watchHops(session, pairs, rec)
            try {
              await sendPins(session, pairOf, active, rec, pins, {
                settings,
                requestTimeoutMs,
                signal: pinController.signal,
                stop: signal,
              })
              if (pins.length > 0) {
                const closeAt = Math.max(...pins.map(p => p.sent.sentAt)) + windowMs + marginMs
                say(`waiting for evictions (window closes in ${((closeAt - now()) / 1000).toFixed(1)}s)`)
                settings.onDeadline?.('window closes', closeAt)
                // within, not a race with sleep: the pins usually end first, and the sleep's timer would then keep the
                // process alive until the window's end (1.7-3.7 s after every inject and suite had printed its
                // verdicts).
                await within(Promise.all(pins.map(p => p.sent.done)), closeAt - now(), signal)
              }
            } finally {
              loadedObserveMs = await hops.stop()
            }
            if (loadedObserveMs !== undefined && loadedObserveMs > calibration!.observeMs) {
              say(
                `observation delay while the pins were out: p99 ${loadedObserveMs.toFixed(1)} ms ` +
                  `(idle ${calibration!.observeMs.toFixed(1)} ms); each pin's ε uses the probes around its send ` +
                  `and answer`,
              )
            }
          }
          stoppedEarly = signal.aborted
          // Stop watching the pins: what is still held is abandoned by the client now (recorded as such).
          pinController.abort()
          await Promise.all(pins.map(p => p.sent.done))
          await dpins?.restore(say)
          await Promise.all(
            active.flatMap(e => [
              revertAndVerify(guard(e), e.plan!, rec, e.lease!, PROBE_TIMEOUT_MS, l => say(`${e.s.name}: ${l}`)),
              ...(e.parts ?? []).map(x =>
                revertAndVerify(guardOf(x.host), x.plan, rec, x.lease!, PROBE_TIMEOUT_MS, l =>
                  say(`${e.s.name} on ${x.host}: ${l}`),
                ),
              ),
            ]),
          )
          if (health) {
            say('waiting for the wedged instance to answer healthy again')
            await health.resumed(signal)
          }
          if (breaker) {
            const on = {promptTokens: settings.promptTokens, scenario: breaker.e.s.name, signal, say}
            await watchBreakerClose(pairOf(breaker.e.s).session, rec, breaker.x, breaker.trial, on)
          }
          // A pin is let go of on its own pair's servers; the load went through the gateway, to any pair's.
          const everyServer = servers.map(x => x.client)
          await releaseHeld(
            rec,
            [
              ...pins.map(p => ({sent: p.sent, on: [pairOf(p.e.s).session.prefill, pairOf(p.e.s).session.decode]})),
              ...load.sent.map(sent => ({sent, on: everyServer})),
            ],
            Math.max(0, ...planned.flatMap(e => leasesOf(e).map(l => l.revertedAt ?? 0))),
          )
          for (const p of pairs) {
            const rids = pins.filter(x => pairOf(x.e.s) === p).map(x => x.sent.rid)
            if (rids.length > 0) await readPinLogs(p, spansPairs, rec, logMarks.get(p) ?? [], rids, say)
          }
          const revertedAt = Math.max(0, ...planned.flatMap(e => leasesOf(e).map(l => l.revertedAt ?? 0)))
          if (!signal.aborted) await recover(session, servers, rec, load, settings, revertedAt, signal, say)
          // A stop after the window (during the revert or the recovery) leaves recovery unproven, not failed.
          recoveryStopped = signal.aborted
        } finally {
          pinController.abort()
          await health?.stop()
          await load.abandon()
          await sampler.stop()
        }
      },
      {say, ...(settings.callerStopsOnSignal ? {actOn: 'second' as const} : {})},
    )
  } finally {
    settings.onRecorder?.(undefined)
  }
  if (held) return {scenarios: heldScenarios(entries, contract, calibration), floorMs: 0}
  return {
    scenarios: judgeBatch({
      entries,
      observations: rec.sorted(),
      contract,
      calibration: calibration!,
      loadedObserveMs,
      stoppedEarly,
      recoveryStopped,
      loadIntervalMs: settings.loadIntervalMs,
      finishedAt: now(),
    }),
    floorMs: decodeFloorMs(rec) ?? windowMs,
  }
}

/** Each scenario under its own lease, all at once (they touch different GPUs, ranks and ports: the planner saw to
 * it). A fault that did not take effect is reverted at once and never judged. */
async function injectAll(
  guard: (e: Entry) => LeaseGuard,
  guardOf: (host: string) => LeaseGuard,
  hostName: (e: Entry) => string | undefined,
  planned: Entry[],
  rec: Recorder,
  ttlMs: number,
  signal: AbortSignal,
  say: (l: string) => void,
): Promise<void> {
  await Promise.all(
    planned.map(async e => {
      if (signal.aborted) return
      const tell = (l: string) => say(`${e.s.name}: ${l}`)
      e.startedAt = now()
      e.lease = await injectUnderLease(guard(e), e.plan!, rec, ttlMs, PROBE_TIMEOUT_MS, tell)
      if (hostName(e) !== undefined) e.lease.host = hostName(e)
      // The other nodes' parts, each under its own lease on its own host.
      for (const x of e.parts ?? []) {
        if (signal.aborted || !e.lease.verifiedInjected) break
        x.lease = await injectUnderLease(guardOf(x.host), x.plan, rec, ttlMs, PROBE_TIMEOUT_MS, l =>
          say(`${e.s.name} on ${x.host}: ${l}`),
        )
        x.lease.host = x.host
      }
      // A fault that did not take effect everywhere it acts is taken out everywhere at once, and never judged.
      if (!injectedEverywhere(e)) {
        await revertAndVerify(guard(e), e.plan!, rec, e.lease, PROBE_TIMEOUT_MS, tell)
        for (const x of e.parts ?? [])
          if (x.lease)
            await revertAndVerify(guardOf(x.host), x.plan, rec, x.lease, PROBE_TIMEOUT_MS, l =>
              say(`${e.s.name} on ${x.host}: ${l}`),
            )
      }
    }),
  )
}

/** Every scenario's pins (or abort trials), paced. */
async function sendPins(
  session: RunSession,
  pairOf: (s: BatchScenario) => PairInBatch,
  active: Entry[],
  rec: Recorder,
  pins: Array<{e: Entry; sent: Sent}>,
  o: {settings: BatchSettings; requestTimeoutMs: number; signal: AbortSignal; stop: AbortSignal},
): Promise<void> {
  const {settings} = o
  settings.say(
    `sending pins: ${active
      .map(e => `${e.s.name} ${e.plan!.trials ? `${e.plan!.trials.length} abort ` + `trials` : `${e.s.pins} pin(s)`}`)
      .join(', ')}`,
  )
  await Promise.all(
    active.map(async e => {
      // Each scenario's pins and aborts go to its own pair's prefill and decode (and that prefill's bootstrap server).
      const own = pairOf(e.s).session
      const send = (o: SendOptions): Sent =>
        settings.pinPath === 'router' ? sendRequest(session.router, rec, o) : sendDirect(own, own.bootstrap, rec, o)
      const plan = e.plan!
      const pinState = getFault(plan.fault).pins
      const base = {
        role: 'pin' as const,
        fault: plan.fault,
        scenario: e.s.name,
        timeoutMs: o.requestTimeoutMs,
        signal: o.signal,
        promptTokens: settings.promptTokens,
        ...(pinState === 'trials'
          ? {expectedState: {queue: 'inflight' as const, kvPoll: 'Transferring' as const}}
          : {expectedState: pinState}),
      }
      if (!plan.trials) {
        for (let i = 0; i < e.s.pins && !o.stop.aborted; i++) {
          if (i > 0 && i % settings.pinPacing.burst === 0) await sleep(settings.pinPacing.gapMs, o.stop)
          if (o.stop.aborted) break
          pins.push({e, sent: send(base)})
        }
        return
      }
      // The window these trials aim at, on the timeline: the abort check judges each abort's landing by it.
      if (plan.transferWindow) {
        rec.add({
          kind: 'transfer-window',
          t: now(),
          scenario: e.s.name,
          leaseId: plan.leaseId,
          ...plan.transferWindow,
          trials: plan.trials.map(x => ({rid: x.rid, offsetMs: x.offsetMs})),
        })
      }
      await Promise.all(
        plan.trials.map(async trial => {
          const sent = send({...base, rid: trial.rid})
          pins.push({e, sent})
          await sleepUntil(sent.sentAt + trial.offsetMs, now)
          await Promise.all(
            trial.aborts.map(async a => {
              const t = now()
              const r = await own[a.service].abort(a.body.rid).catch(() => undefined)
              rec.add({kind: 'abort-sent', t, rid: trial.rid, target: a.service, status: r?.status})
            }),
          )
        }),
      )
    }),
  )
}

/**
 * The observation delay, measured the way calibration measures it (a router and a prefill round trip on cheap
 * endpoints), over and over until stopped, each probe recorded in the timeline (ε of a pin uses the probes around
 * its send and answer); stop() gives the p99 over the probes that succeeded, or undefined without one. Bounded in
 * count.
 */
function watchHops(
  session: RunSession,
  pairs: PairInBatch[],
  rec: Recorder,
): {stop: () => Promise<number | undefined>} {
  const stopping = new AbortController()
  const hops: number[] = []
  const loop = (async () => {
    for (let i = 0; !stopping.signal.aborted && i < 2000; i++) {
      // Over several pairs, the slowest prefill speaks for the round trip: ε must cover every pair's pins.
      const [a, ...bs] = await Promise.all([
        session.router.liveness(),
        ...pairs.map(p => p.session.prefill.health('/v1/loads')),
      ])
      // A failed probe measured its own timeout, not a delay: counting it would widen ε past any late eviction. Any
      // answer of prefill is a round trip (an SGLang without /v1/loads answers 404, as promptly).
      if (a!.ok && bs.every(b => b.ok || b.status !== undefined)) {
        const ms = a!.ms + Math.max(...bs.map(b => b.ms))
        hops.push(ms)
        rec.add({kind: 'hop', t: now(), ms})
      }
      await sleep(HOP_PROBE_GAP_MS, stopping.signal)
    }
  })()
  return {
    async stop() {
      stopping.abort()
      await loop
      if (hops.length === 0) return undefined
      const sorted = [...hops].sort((a, b) => a - b)
      return sorted[Math.min(sorted.length - 1, Math.ceil(0.99 * sorted.length) - 1)]!
    },
  }
}

/** The services' log lines naming the pins (what released each, in the servers' words), once the window is over. */
async function readPinLogs(
  p: PairInBatch,
  labelled: boolean,
  rec: Recorder,
  marks: LogMark[],
  rids: string[],
  say: (l: string) => void,
): Promise<void> {
  const {session} = p
  const read = await readLogs(role => session.placement.of(role).host, session.deployment, marks, rids, {
    timeoutMs: PROBE_TIMEOUT_MS,
    watchdogPattern: session.deployment.watchdog.logPattern,
  })
  // Over several pairs each read says whose log it was: a scenario's view keeps its own pair's reads.
  for (const o of read) rec.add(labelled && o.kind === 'log-read' ? {...o, instance: p.labels[o.service]} : o)
  const unread = read.flatMap(o =>
    o.kind === 'log-read' && !o.ok ? [`${labelled ? p.labels[o.service] : o.service}: ${o.detail}`] : [],
  )
  if (unread.length > 0)
    say(`service log not read (release causes then rest on the answers and counters): ${unread.join('; ')}`)
}

/** Nothing left behind: every request the faults held and nothing released is aborted on the servers it may be on. */
async function releaseHeld(
  rec: Recorder,
  sent: Array<{sent: Sent; on: SglangClient[]}>,
  revertedAt: number,
): Promise<void> {
  const answered = new Set(
    rec.observations.filter(o => o.kind === 'request-answered').map(o => (o as {rid: string}).rid),
  )
  const held = sent.filter(({sent: s}) => s.sentAt <= (revertedAt || now()) && !answered.has(s.rid))
  await Promise.all(
    held.map(async ({sent: s, on}) => {
      await Promise.all(on.map(c => c.abort(s.rid).catch(() => undefined)))
      rec.marker('cleanup-abort', s.rid)
    }),
  )
}

/** Recovery: the next requests must succeed, then the queues must drain (with a deadline). */
async function recover(
  session: RunSession,
  servers: SampledServer[],
  rec: Recorder,
  load: SteadyLoad,
  settings: BatchSettings,
  revertedAt: number,
  signal: AbortSignal,
  say: (l: string) => void,
): Promise<void> {
  await heldRequestsEnd(
    rec,
    load.sent.filter(s => s.sentAt <= revertedAt),
    signal,
    say,
  )
  await waitForBreakers(session, rec, signal, say)
  const canaries = (): Promise<Array<{status: number | null}>> =>
    Promise.all(
      Array.from(
        {length: settings.canaries},
        () =>
          sendRequest(session.router, rec, {role: 'canary', timeoutMs: 30_000, promptTokens: settings.promptTokens})
            .done,
      ),
    )
  const first = await canaries()
  // A breaker that opened after the wait (a failure the gateway counted late, or traffic that is not pdchaos's) refuses
  // the canaries without sending them to a worker: that is no proof the deployment failed to recover. Wait for it and
  // send them again, once; the recovery check judges the last round.
  if (!signal.aborted && first.some(a => a.status === 503) && ((await openBreakers(session.router))?.length ?? 0) > 0) {
    await waitForBreakers(session, rec, signal, say, 'after the canaries')
    rec.marker('canaries-again', 'the first canaries met an open circuit breaker')
    await canaries()
  }
  say('waiting for the queues to drain')
  await load.stopSending()
  // within() clears its timer: a pending 20 s timer would keep the process alive after the run.
  await within(Promise.all(load.sent.map(p => p.done)), DRAIN_WAIT_MS)
  const drainBy = now() + DRAIN_WAIT_MS
  // Without /v1/loads only the per-batch gauges tell the queues, and they read what was in flight at the last batch
  // until SGLang's idle refresh rewrites them: wait for that write (docs/freshness.md) rather than judge a stale one.
  const refreshedBy = now() + IDLE_REFRESH_S * 1000 + 2000
  do {
    await sampleOnce(rec, servers)
    if (drained(rec, servers)) break
    await sleep(250, signal)
  } while ((now() < drainBy || (gaugesOnly(rec) && now() < refreshedBy)) && !signal.aborted)
}

/** A dry run sends one unfaulted request through the router first: a fresh deployment opens its routes on first use. */
async function warmUp(session: RunSession, signal?: AbortSignal): Promise<void> {
  await session.router
    .generate(
      {rid: `pdchaos-warmup-${Date.now().toString(36)}`, text: 'warm up', max_new_tokens: 1},
      {timeoutMs: 30_000, ...(signal ? {signal} : {})},
    )
    .catch(() => undefined)
}

async function dryRun(
  entries: Entry[],
  hostOf: Map<Entry, PlacedHost>,
  partHost: Map<EntryPart, PlacedHost>,
  calibration: Calibrated | undefined,
  contract: ScenarioRun['contract'],
): Promise<ScenarioRun[]> {
  return Promise.all(
    entries.map(async e => {
      const run = scenarioShell(e, contract, calibration, now())
      if (!e.plan) return run
      const probes = []
      // The probes of each node it would act on, on that node's host.
      const units = [
        {plan: e.plan, host: hostOf.get(e)!},
        ...(e.parts ?? []).map(x => ({plan: x.plan, host: partHost.get(x)!})),
      ]
      for (const {plan, host} of units)
        for (const argv of plan.readOnlyProbes) {
          const shown = renderPlan({...plan, readOnlyProbes: [argv]}).readOnlyProbes[0]!
          try {
            const r = await host.host.run(argv, {timeoutMs: PROBE_TIMEOUT_MS, sudo: plan.sudo})
            probes.push({argv: shown, code: r.code, stdout: r.stdout.slice(0, 2000), stderr: r.stderr.slice(0, 500)})
          } catch (error) {
            probes.push({argv: shown, code: null, stdout: '', stderr: oneLine(error)})
          }
        }
      run.dryRun = {probes}
      for (const p of probes)
        if (p.code !== 0)
          run.verdicts.push({
            check: 'fault-effect',
            subject: p.argv,
            verdict: 'fail',
            summary: `read-only probe failed: ${p.stderr || `exit ${p.code}`}`,
            evidence: {probe: p},
          })
      return run
    }),
  )
}

function heldScenarios(
  entries: Entry[],
  contract: ScenarioRun['contract'],
  calibration: Calibrated | undefined,
): ScenarioRun[] {
  return entries.map(e => {
    const run = scenarioShell(e, contract, e.calibration ?? calibration, now())
    if (e.lease?.verifiedInjected)
      run.held = {leaseId: e.lease.id, expiresAt: new Date(e.lease.expiresAt).toISOString()}
    else if (e.lease)
      run.verdicts.push({
        check: 'fault-effect',
        subject: e.lease.id,
        verdict: 'fail',
        summary: `the fault did not take effect: ${e.lease.evidence.injected.join('; ')}`,
        evidence: {lease: e.lease},
      })
    return run
  })
}

interface HealthWatch {
  /** Until the wedged service has answered ok three times in a row after the revert, or its resumption bound (+2 s). */
  resumed(signal: AbortSignal): Promise<void>
  stop(): Promise<void>
}

/**
 * wedge-rank's evidence: prefill's and decode's health, one probe in flight per service, a new one every
 * sampleIntervalMs (or as soon as a slow one answers), each recorded when its answer arrives. The first round is
 * taken before the fault is injected.
 */
async function startHealthWatch(session: RunSession, rec: Recorder, x: WedgeExpectation): Promise<HealthWatch> {
  const clients = serviceClients(session.deployment, {timeoutMs: (x.healthTimeoutSeconds + 5) * 1000})
  const stopping = new AbortController()
  const okStreak = {prefill: 0, decode: 0}
  const probe = async (service: 'prefill' | 'decode') => {
    const h = await clients[service].health(x.probePath)
    rec.add({
      kind: 'health',
      t: now(),
      service,
      ok: h.ok,
      ...(h.status === undefined ? {} : {status: h.status}),
      ms: h.ms,
    })
    okStreak[service] = h.ok ? okStreak[service] + 1 : 0
    return h.ms
  }
  await Promise.all([probe('prefill'), probe('decode')])
  // Bounded: the watch ends with the batch (stop), and at most this many probes per service.
  const loops = (['prefill', 'decode'] as const).map(async service => {
    for (let i = 0; i < 100_000 && !stopping.signal.aborted; i++) {
      const ms = await probe(service)
      await sleep(Math.max(0, x.sampleIntervalMs - ms), stopping.signal)
    }
  })
  return {
    async resumed(signal) {
      okStreak[x.service] = 0
      const by = now() + (x.resumeWithinSeconds + 2) * 1000
      while (okStreak[x.service] < 3 && now() < by && !signal.aborted) await sleep(x.sampleIntervalMs, signal)
    },
    async stop() {
      stopping.abort()
      await Promise.all(loops)
    },
  }
}

/**
 * A fault can make the gateway open a worker's circuit breaker (every request the fault failed counts); until it
 * closes, healthy requests get 503. Say so, mark it on the timeline (the checks report it, and requests refused
 * meanwhile are the fault's reach, not collateral), and wait for it before the canaries, with a deadline.
 */
async function waitForBreakers(
  session: RunSession,
  rec: Recorder,
  signal: AbortSignal,
  say: (l: string) => void,
  when = 'during the fault',
): Promise<void> {
  const {open, closed} = await untilBreakersClose(session.router, {
    signal,
    onOpen: workers => {
      rec.marker('router-breaker-open', workers.join(' '))
      say(
        `the router's circuit breaker opened ${when} (${workers.join(', ')}): waiting for it to close before the ` +
          `canaries`,
      )
    },
  })
  if (open.length > 0 && closed) rec.marker('router-breaker-closed', open.join(' '))
}

/**
 * The requests the fault held that went through the gateway: their failed attempts (evicted by the watchdog, or let
 * go of by the cleanup) reach the gateway's breaker only as they end, and the gateway sends them again. Until they
 * have ended the breaker's state is not final (one read of it would race them), and the path may still be stalled
 * (an RDMA queue pair waits out its retransmission timeout before it sends again). Wait for them, bounded.
 */
async function heldRequestsEnd(
  rec: Recorder,
  held: Sent[],
  signal: AbortSignal,
  say: (l: string) => void,
): Promise<void> {
  const answered = new Set(
    rec.observations.filter(o => o.kind === 'request-answered').map(o => (o as {rid: string}).rid),
  )
  const open = held.filter(s => !answered.has(s.rid))
  if (open.length === 0 || signal.aborted) return
  say(`waiting for ${open.length} request(s) the fault held to end (the gateway may send them again)`)
  let ended = false
  void Promise.all(open.map(s => s.done)).then(() => (ended = true))
  // Polled, so that a stop (the signal) ends the wait at once and no timer outlives it.
  const by = now() + DRAIN_WAIT_MS
  while (!ended && now() < by && !signal.aborted) await sleep(Math.min(100, by - now()), signal)
  rec.marker('held-requests-ended', ended ? `${open.length}` : `not all within ${DRAIN_WAIT_MS / 1000}s`)
}

/** The active scenarios whose fault observes `observe` with an expectation of `kind` (the runner's branches). */
function observing(active: Entry[], observe: Observe, kind: string): Entry[] {
  return active.filter(e => e.plan!.expected?.kind === kind && getFault(e.plan!.fault).observe === observe)
}
