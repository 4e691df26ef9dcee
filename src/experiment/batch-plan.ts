import {oneLine, PdError} from '../errors.js'
import type {FaultDiscovery, FaultScenario, PlanBase} from '../faults/fault.js'
import {newLeaseId} from '../faults/lease/lease.js'
import {parseFaultParams} from '../faults/params.js'
import {getFault} from '../faults/registry.js'
import type {ScenarioRun} from '../model/run.js'
import {abortable, throwIfStopped} from '../util/stop.js'
import {now} from '../workload/recorder.js'
import {type PairInBatch, pairsOf} from './batch-pairs.js'
import type {BatchScenario} from './batch-scenario.js'
import type {BatchSettings} from './batch-settings.js'
import {COMPETING_CODE, competingRefusal, competingText, competingTimeoutsFor, firingInWindow} from './competing.js'
import type {Entry, EntryPart} from './entry.js'
import {hostForFault, onHost, type PlacedHost} from './placement.js'
import {type Calibrated, PROBE_TIMEOUT_MS, type RunSession} from './session.js'

/**
 * A batch's first phase: calibrate each pair (once per run), discover it (once per run), and plan every scenario
 * before anything is injected: its fault and params (parsed once), the host it acts on, the host's facts, the plan,
 * and the same fault on the other nodes of a multi-node instance. A scenario that cannot be planned is thrown
 * (`inject`) or recorded as its error (a suite).
 */

export interface PlannedBatch {
  pairs: PairInBatch[]
  pairOf: (s: BatchScenario) => PairInBatch
  spansPairs: boolean
  /** The batch's own pair's calibration (undefined in a dry run). */
  calibration: Calibrated | undefined
  contract: ScenarioRun['contract']
  entries: Entry[]
  /** The host each scenario acts on (the one that owns what it targets, among its pair's). */
  hostOf: Map<Entry, PlacedHost>
  /** The host of each part of a fault on every node of a multi-node instance. */
  partHost: Map<EntryPart, PlacedHost>
}

export async function planBatch(
  session: RunSession,
  batch: BatchScenario[],
  settings: BatchSettings,
): Promise<PlannedBatch> {
  const pairs = pairsOf(session, batch)
  const pairOf = (s: BatchScenario): PairInBatch => pairs.find(p => p.session === (s.session ?? session))!
  const calibrations = await calibrateAll(pairs, batch, pairOf, settings)
  if (settings.mode === 'dry-run')
    await abortable(warmUp(session, settings.signal), settings.signal, 'the warm-up request')
  const discoveries = new Map<RunSession, FaultDiscovery>()
  for (const p of pairs) discoveries.set(p.session, await p.session.discovery(settings.say, settings.signal))
  const b: PlannedBatch = {
    pairs,
    pairOf,
    spansPairs: pairs.length > 1,
    calibration: calibrations.get(pairs[0]!.session),
    contract: session.deployment.watchdog,
    entries: [],
    hostOf: new Map(),
    partHost: new Map(),
  }
  for (const s of batch) {
    const on = pairOf(s).session
    b.entries.push(
      await planScenario(s, b, {discovery: discoveries.get(on)!, calibration: calibrations.get(on)}, settings),
    )
  }
  // Stopped while planning: nothing was injected; the run records it (a suite) or ends with it (inject), exit 3.
  throwIfStopped(settings.signal, 'planning the batch')
  return b
}

/**
 * Each pair is calibrated on its own servers (RunSession keeps it); its lag probes hold as many requests at once as its
 * pins, paced as they will be (none in hold mode). A dry run calibrates nothing.
 */
async function calibrateAll(
  pairs: PairInBatch[],
  batch: BatchScenario[],
  pairOf: (s: BatchScenario) => PairInBatch,
  settings: BatchSettings,
): Promise<Map<RunSession, Calibrated>> {
  const calibrations = new Map<RunSession, Calibrated>()
  if (settings.mode === 'dry-run') return calibrations
  for (const p of pairs) {
    const lagProbes = {
      count: settings.mode === 'hold' ? 0 : batch.filter(s => pairOf(s) === p).reduce((n, s) => n + s.pins, 0),
      ...settings.pinPacing,
    }
    calibrations.set(
      p.session,
      await p.session.calibration({
        promptTokens: settings.promptTokens,
        say: settings.say,
        lagProbes,
        ...(settings.mode === 'hold' ? {requests: 1} : {}),
        ...(settings.signal ? {signal: settings.signal} : {}),
      }),
    )
  }
  return calibrations
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

interface PairFacts {
  discovery: FaultDiscovery
  calibration: Calibrated | undefined
}

/** One scenario's entry: planned, or (a suite) its reason for not being planned. */
async function planScenario(s: BatchScenario, b: PlannedBatch, pf: PairFacts, settings: BatchSettings): Promise<Entry> {
  const {labels} = b.pairOf(s)
  const e: Entry = {s, startedAt: now(), ...(b.spansPairs ? {calibration: pf.calibration, instances: labels} : {})}
  try {
    const scenario: FaultScenario = s.scenario ?? faultScenario(s, settings)
    e.scenario = scenario
    const on = await planOnItsHost(e, scenario, b, pf, settings)
    b.hostOf.set(e, on)
    await planOtherNodes(e, scenario, on, b, pf, settings)
    const acting = [on.name, ...(e.parts ?? []).map(x => x.host)]
    if (b.pairOf(s).session.placement.spansHosts)
      settings.say(
        `${s.name}: acts on ${acting.join(' and ')}${b.spansPairs ? ` (${labels.prefill} + ${labels.decode})` : ''}`,
      )
    noteUntouched(e.plan!, acting, pf.discovery)
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
  return e
}

/** A scenario given with raw params (a caller that did not parse them): parsed here, named as its caller names them. */
function faultScenario(s: BatchScenario, settings: BatchSettings): FaultScenario {
  const fault = getFault(s.fault)
  return {fault, params: parseFaultParams(fault, s.params, settings.paramsSource)}
}

/**
 * The plan on the host that owns what the fault targets. SGLang's own timeouts that could release its pins: one firing
 * before the window closes means the experiment cannot exercise the watchdog. Refused before anything is injected,
 * unless the caller allows it (its pins are then unverified by construction).
 */
async function planOnItsHost(
  e: Entry,
  sc: FaultScenario,
  b: PlannedBatch,
  pf: PairFacts,
  settings: BatchSettings,
): Promise<PlacedHost> {
  const {placement} = b.pairOf(e.s).session
  const on = hostForFault(placement, sc.params as Record<string, unknown>, pf.discovery.ranks, e.s.gpuHost)
  const seen = onHost(pf.discovery, on, placement)
  const facts = await abortable(
    sc.fault.gather(on.host, seen, sc.params, {timeoutMs: PROBE_TIMEOUT_MS}),
    settings.signal,
    `planning ${e.s.name}`,
  )
  const leaseId = newLeaseId(e.s.fault)
  const {contract} = b
  e.plan = sc.fault.plan({discovery: seen, params: sc.params, leaseId, facts, calibration: pf.calibration, contract})
  const competing = competingTimeoutsFor(sc.fault.pins, e.plan.mechanism, pf.discovery.sglangTimeouts)
  if (competing) e.competing = competing
  const firing = firingInWindow(competing, contract)
  if (firing.length > 0) {
    if (!settings.allowCompetingTimeout) throw competingRefusal(e.s.fault, firing, contract)
    e.competingAllowed = true
    e.plan.notes = [
      ...(e.plan.notes ?? []),
      `allowed to run although ${firing.map(c => competingText(c, contract)).join('; ')}: a pin released ` +
        `inside the window is unverified, never a pass`,
    ]
  }
  return on
}

/**
 * A fault on all of a role's ranks, on an instance over several nodes: the same fault on each other node's ranks, each
 * with its own plan and lease on its own host. (The twin's failure point is set through node 0's API for the ranks it
 * names: it stays one plan.)
 */
async function planOtherNodes(
  e: Entry,
  sc: FaultScenario,
  on: PlacedHost,
  b: PlannedBatch,
  pf: PairFacts,
  settings: BatchSettings,
): Promise<void> {
  const every = sc.fault.onEveryNode?.(sc.params)
  if (!every || e.s.gpuHost !== undefined || e.plan!.mechanism === 'twin-failpoint') return
  const {placement} = b.pairOf(e.s).session
  const others = [
    ...new Set(
      pf.discovery.ranks
        .filter(r => r.service === every && r.host !== undefined && r.host !== on.name)
        .map(r => r.host!),
    ),
  ]
  for (const name of others) {
    const at = placement.named(name)
    const seenThere = onHost(pf.discovery, at, placement)
    const factsThere = await abortable(
      sc.fault.gather(at.host, seenThere, sc.params, {timeoutMs: PROBE_TIMEOUT_MS}),
      settings.signal,
      `planning ${e.s.name}`,
    )
    const part: EntryPart = {
      host: name,
      plan: sc.fault.plan({
        discovery: seenThere,
        params: sc.params,
        leaseId: newLeaseId(e.s.fault),
        facts: factsThere,
        calibration: pf.calibration,
        contract: b.contract,
      }),
    }
    e.parts ??= []
    e.parts.push(part)
    b.partHost.set(part, at)
  }
}

/** A multi-node instance: a fault on some of its ranks; the plan says which of the instance's are untouched. */
function noteUntouched(plan: PlanBase, acting: string[], discovery: FaultDiscovery): void {
  const untouched = discovery.ranks.filter(
    r =>
      r.host !== undefined &&
      !acting.includes(r.host) &&
      plan.targets.some(t => t.service === r.service) &&
      r.nodeRank !== undefined,
  )
  if (untouched.length > 0)
    plan.notes = [
      ...(plan.notes ?? []),
      `acts on ${acting.join(' and ')} only: ${untouched.map(r => `${r.service} TP${r.tpRank}`).join(', ')} ` +
        `on ${[...new Set(untouched.map(r => r.host))].join(', ')} (other node ranks of the instance) are not ` +
        `touched, and the all-reduce (MIN over every rank) still holds the request by the ranks it touches`,
    ]
}
