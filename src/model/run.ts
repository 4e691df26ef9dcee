import type {PinRecord} from '../checks/eviction.js'
import type {Observation, Timeline} from './timeline.js'
import type {Verdict} from './verdict.js'
import type {InjectResult, LeaseRecord} from '../experiment/inject.js'
import type {RestartResult} from '../restart/co-restart.js'

/**
 * The run model the reports render: one suite run, its scenarios, and everything each one judged. It is plain
 * JSON (numbers, strings, arrays, objects; times are epoch ms) because it is also the suite's journal, so a report
 * can be rendered again later from the journal alone.
 */

export type {LeaseRecord} from '../experiment/inject.js'

/** The watchdog contract a scenario was judged by (the deployment's `watchdog`). */
export interface Contract {
  scope: 'all' | 'inflight' | 'off'
  deadlineSeconds: number
  pollSeconds: number
}

export interface ScenarioRun {
  name: string
  kind: 'inject' | 'restart'
  fault?: string
  params?: Record<string, unknown>
  /** Epoch ms. */
  startedAt: number
  finishedAt: number
  verdicts: Verdict[]
  pins: PinRecord[]
  leases: LeaseRecord[]
  timeline?: Timeline
  contract: Contract
  /** The scenario could not run to a verdict (infrastructure, stop condition): one line. */
  error?: string
}

export interface SuiteRun {
  name: string
  /** Names the run in the Pushgateway grouping and in file names; defaults to one derived from startedAt. */
  runId?: string
  startedAt: number
  finishedAt: number
  /** The deployment's name. */
  deployment: string
  /** The release gate's verdict, when the run was a gate. */
  gate?: {passed: boolean; reasons: string[]}
  stopped?: {reason: string}
  scenarios: ScenarioRun[]
}

export interface RunCounts {
  verdicts: number
  passed: number
  failed: number
  scenarios: number
  /** Scenarios with an error (no verdict could be reached). */
  errored: number
  /** Leases injected but not verified clean afterwards: the host may still be faulted. */
  faultsLeftBehind: number
}

export function runCounts(run: SuiteRun): RunCounts {
  let passed = 0
  let failed = 0
  for (const s of run.scenarios) {
    for (const v of s.verdicts) v.verdict === 'pass' ? passed++ : failed++
  }
  return {
    verdicts: passed + failed, passed, failed, scenarios: run.scenarios.length,
    errored: run.scenarios.filter((s) => s.error !== undefined).length,
    faultsLeftBehind: faultsLeftBehind(run),
  }
}

export function faultsLeftBehind(run: SuiteRun): number {
  let n = 0
  for (const s of run.scenarios) for (const l of s.leases) if (l.injectedAt !== null && !l.verifiedClean) n++
  return n
}

/** The run's overall verdict: the gate's when there was one, else every check passed, nothing errored, stopped or left faulted. */
export function runPassed(run: SuiteRun): boolean {
  if (run.gate) return run.gate.passed
  const c = runCounts(run)
  return c.failed === 0 && c.errored === 0 && c.faultsLeftBehind === 0 && run.stopped === undefined
}

export function runIdOf(run: SuiteRun): string {
  return run.runId ?? `r-${new Date(run.startedAt).toISOString().replace(/[-:]/g, '').replace(/\.\d+Z$/, 'Z')}`
}

/** Every failing verdict with the scenario it belongs to, in run order. */
export function failedChecks(run: SuiteRun): Array<{scenario: string; verdict: Verdict}> {
  return run.scenarios.flatMap((s) => s.verdicts.filter((v) => v.verdict === 'fail').map((verdict) => ({scenario: s.name, verdict})))
}

/** An inject experiment as a scenario of the run. */
export function scenarioFromInject(name: string, r: InjectResult, opts: {contract: Contract; params?: Record<string, unknown>; startedAt: number; finishedAt: number}): ScenarioRun {
  return {
    name, kind: 'inject', fault: r.fault, params: opts.params, startedAt: opts.startedAt, finishedAt: opts.finishedAt,
    verdicts: r.verdicts, pins: r.pins, leases: r.lease ? [r.lease] : [], timeline: r.timeline, contract: opts.contract,
  }
}

/** A co-restart as a scenario of the run; its observations become the timeline (canaries and watch requests). */
export function scenarioFromRestart(name: string, r: RestartResult, opts: {contract: Contract; startedAt: number; finishedAt: number}): ScenarioRun {
  const observations: Observation[] = [...r.observations].sort((a, b) => a.t - b.t)
  return {
    name, kind: 'restart', startedAt: opts.startedAt, finishedAt: opts.finishedAt, verdicts: r.verdicts, pins: [], leases: [],
    timeline: {contract: opts.contract, calibration: {prefillMs: 0, prefillSpreadMs: 0, observeMs: 0, samples: 0}, observations},
    contract: opts.contract,
  }
}
