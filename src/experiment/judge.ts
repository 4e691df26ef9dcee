import {checkCollateral} from '../checks/collateral.js'
import {checkRecovery} from '../checks/recovery.js'
import {WATCHDOG_EVICTED_TOTAL} from '../engines/sglang/sglang-metrics.js'
import {renderPlan} from '../faults/fault.js'
import type {LeaseRecord, ScenarioRun} from '../model/run.js'
import type {Observation, Timeline} from '../model/timeline.js'
import {fail, pass, type Verdict} from '../model/verdict.js'
import {type Entry, injectedEverywhere, leasesOf} from './entry.js'
import {type JudgeContext, kindOf} from './observers.js'
import type {Calibrated} from './session.js'

export type {Entry, EntryPart} from './entry.js'
export {injectedEverywhere, leasesOf} from './entry.js'

/**
 * Judging a batch (pure: a timeline in, scenario runs out). Each pin is judged by its own scenario, on a view of
 * the timeline without the other scenarios' pins; the batch-wide checks (recovery, collateral) are judged once on
 * the whole timeline and reported on the batch's first injected scenario, so that a failure is counted once.
 */

/** A scenario's record before judging: what was planned and leased. */
export function scenarioShell(
  e: Entry,
  contract: ScenarioRun['contract'],
  calibration: Calibrated | undefined,
  finishedAt: number,
): ScenarioRun {
  return {
    name: e.s.name,
    kind: 'inject',
    fault: e.s.fault,
    params: e.s.params,
    startedAt: Math.round(e.startedAt),
    finishedAt: Math.round(finishedAt),
    verdicts: [],
    pins: [],
    leases: leasesOf(e),
    contract,
    ...(e.error ? {error: e.error} : {}),
    ...(e.plan
      ? {
          mechanism: e.plan.mechanism,
          description: e.plan.description,
          plan: renderPlan(e.plan),
          ...(e.plan.refusals?.length ? {refusals: e.plan.refusals} : {}),
          // The other nodes' parts: what each does there (their commands are in their leases).
          ...(e.plan.notes?.length || e.parts?.length
            ? {
                notes: [
                  ...(e.plan.notes ?? []),
                  ...(e.parts ?? []).map(x => `also on ${x.host}: ${x.plan.description}`),
                ],
              }
            : {}),
        }
      : {}),
    ...(calibration ? {calibration} : {}),
    ...(e.competing?.length ? {competingTimeouts: e.competing} : {}),
  }
}

export interface BatchTimeline {
  entries: Entry[]
  observations: Observation[]
  contract: Timeline['contract']
  calibration: Calibrated
  /** The observation delay measured under the pins' load, when it was (ε uses the larger). */
  loadedObserveMs?: number
  /** The batch stopped before its window closed: no eviction verdict. */
  stoppedEarly: boolean
  /** The batch stopped after its window, before recovery was proven: no recovery verdict. */
  recoveryStopped?: boolean
  loadIntervalMs: number
  finishedAt: number
}

export function judgeBatch(b: BatchTimeline): ScenarioRun[] {
  const loaded = (c: Calibrated): Calibrated =>
    b.loadedObserveMs === undefined ? c : {...c, loadedObserveMs: b.loadedObserveMs}
  const calibration = loaded(b.calibration)
  const whole: Timeline = {contract: b.contract, calibration, observations: b.observations}
  const batchVerdicts = judgeBatchWide(b, whole)
  // Every request of the batch the watchdog could have evicted: its counter names the watchdog only by moving for all.
  const j: JudgeContext = {batchPins: b.observations.filter(o => o.kind === 'request-sent' && o.role === 'pin').length}
  const names = b.entries.map(e => e.s.name)
  const label = names.length > 1 ? ` (batch: ${names.join(', ')})` : ''
  let batchAttached = false
  return b.entries.map((e): ScenarioRun => {
    const own = e.calibration ? loaded(e.calibration) : calibration
    const run = scenarioShell(e, b.contract, own, b.finishedAt)
    run.timeline = viewFor({...whole, calibration: own}, e.s.name, e.instances)
    if (e.error) return run
    if (!e.lease) return {...run, error: 'not injected: the run stopped first'}
    const leases = leasesOf(e)
    for (const l of leases) run.verdicts.push(...faultEffect(l, e.plan!.fault))
    const injected = injectedEverywhere(e)
    // Each scenario by its fault's observation kind (observers.ts).
    if (injected && !b.stoppedEarly) kindOf(e).judge(run, e, j)
    for (const l of leases) run.verdicts.push(cleanup(l))
    if (!batchAttached && injected) {
      batchAttached = true
      run.verdicts.push(...batchVerdicts.map(v => ({...v, subject: v.subject + label})))
    }
    if (b.stoppedEarly) run.error = 'stopped before its window closed: no eviction verdict'
    else if (b.recoveryStopped) run.error = 'stopped before recovery was proven: no recovery verdict'
    return run
  })
}

/** Recovery and collateral, judged once on the whole timeline (none once the batch stopped before they were proven). */
function judgeBatchWide(b: BatchTimeline, whole: Timeline): Verdict[] {
  if (b.stoppedEarly || b.recoveryStopped) return []
  // A batch over several pairs: recovery judges every server it spans (each pair's queues and tokens, all counters).
  const instances = [
    ...new Map(
      b.entries
        .flatMap(e =>
          e.instances
            ? ([
                ['prefill', e.instances.prefill],
                ['decode', e.instances.decode],
              ] as const)
            : [],
        )
        .map(([service, instance]) => [`${service}/${instance}`, {service, instance}]),
    ).values(),
  ]
  // Only watchdog pins move the watchdog's counter: abort trials and wedges move others (their own checks judge them),
  // so the counter balance is checked only when every scenario's kind counts evictions.
  const countsOnly = b.entries.every(e => !e.plan || kindOf(e).countsEvictions)
  return [
    ...checkRecovery(whole, {
      failureCounters: countsOnly ? [WATCHDOG_EVICTED_TOTAL] : [],
      ...(instances.length > 0 ? {instances} : {}),
    }),
    ...(b.loadIntervalMs > 0 ? [checkCollateral(whole)] : []),
  ]
}

function faultEffect(lease: LeaseRecord, fault: string): Verdict[] {
  return lease.verifiedInjected
    ? [
        pass(
          'fault-effect',
          lease.id,
          `${fault} took effect: ${lease.evidence.injected.join('; ') || 'nothing to change on the host'}`,
          {lease},
        ),
      ]
    : [fail('fault-effect', lease.id, `the fault did not take effect: ${lease.evidence.injected.join('; ')}`, {lease})]
}

function cleanup(lease: LeaseRecord): Verdict {
  return lease.verifiedClean
    ? pass(
        'cleanup',
        lease.id,
        `reverted and verified clean: ${lease.evidence.clean.join('; ') || 'nothing was changed on the host'}`,
        {lease},
      )
    : fail('cleanup', lease.id, `revert not verified clean: ${lease.evidence.clean.join('; ')}`, {lease})
}

/**
 * The timeline as one scenario sees it: every observation except the other scenarios' pins (and their aborts), and,
 * where the batch spans several pairs, except what other pairs' servers said (their samples and log reads).
 */
export function viewFor(tl: Timeline, scenario: string, instances?: {prefill: string; decode: string}): Timeline {
  const others = new Set<string>()
  for (const o of tl.observations)
    if (o.kind === 'request-sent' && o.role === 'pin' && o.scenario !== undefined && o.scenario !== scenario)
      others.add(o.rid)
  const mine = (o: Observation): boolean =>
    instances === undefined ||
    !('instance' in o) ||
    o.instance === undefined ||
    o.instance === instances.prefill ||
    o.instance === instances.decode
  const keep = (o: Observation): boolean =>
    mine(o) && !('rid' in o && o.kind !== 'log' && o.rid !== undefined && others.has(o.rid))
  return {contract: tl.contract, calibration: tl.calibration, observations: tl.observations.filter(keep)}
}
