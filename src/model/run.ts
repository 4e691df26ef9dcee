import {ExitCode, type ExitCodeValue} from '../exit-codes.js'
import type {CompetingTimeout} from './competing.js'
import type {Calibration, PinState, Timeline} from './timeline.js'
import {type CheckName, type Outcome, UNVERIFIED_BLOCKS_BY_DEFAULT, type Verdict} from './verdict.js'

/**
 * The run model: one run (a suite, or an inject as a suite of one scenario), its scenarios, and everything each one
 * judged. It is plain JSON (numbers, strings, arrays, objects; times are epoch ms) because it is also the journal,
 * so a report can be rendered again later from the journal alone. The runner writes it; reports only read it.
 */

/** One pin as the eviction check judged it (the journal's per-pin record: the README's Outputs list these fields). */
export interface PinRecord {
  rid: string
  fault?: string
  sentAt: number
  evictedAt: number | null
  evictionSeconds: number | null
  bounds: [number, number]
  verdict: Outcome
  evidence: Record<string, unknown>
  /** Its measured time is within ε of a bound (checks/epsilon.ts edgeOf): judged as it is, but the risk is shown. */
  atEdge?: {bound: 'low' | 'high'; marginMs: number}
}

/** Where an abort met its request, as the request's own answer tells it (its error text names the queue). */
export type ReleasedFrom = 'inflight' | 'bootstrap' | 'waiting' | 'unknown'

/**
 * One abort trial as the abort check judged it (the journal's per-trial record, beside the pins). Times are epoch ms.
 */
/**
 * What released an abort trial's request: prefill's own abort (/abort_request on prefill), decode's ABORT reaching
 * prefill over ZMQ (decode's abort or its timeouts), the watchdog, an SGLang timeout, something else (a transport
 * error, the revert, the gateway), not released (completed, or still held), or unknown.
 */
export type ReleasePath =
  | 'prefill-abort'
  | 'decode-abort'
  | 'watchdog'
  | 'timeout'
  | 'other'
  | 'completed'
  | 'not-released'
  | 'unknown'

/** Entry into prefill before the abort: shown before, after (the abort arrived first) or unknown; and by what. */
export interface AbortEntry {
  shown: 'before' | 'after' | 'unknown'
  source: 'answer' | 'watchdog' | 'calibration' | 'none'
  /** The entry read from the watchdog's count, ms after the send. */
  atMs?: number
  evidence: string
}

export interface AbortRecord {
  rid: string
  fault?: string
  sentAt: number
  /** When the trial's first abort was fired. */
  abortedAt: number
  /** abortedAt - sentAt, ms: where in the window the abort was fired. */
  offsetMs: number
  /** The offset the plan asked for, ms (a busy host fires timers late); null when the plan's sweep was not recorded. */
  plannedOffsetMs: number | null
  /** When the request's answer arrived; null if it never did. */
  releasedAt: number | null
  releaseStatus: number | null
  /** Where the abort was aimed: the queue and KVPoll state inside the transfer window. */
  targeted: PinState
  /** Where the request's answer says it was released from (its error text), when it says. */
  releasedFrom: ReleasedFrom
  /**
   * honourBySeconds: after the abort, by when an honoured abort releases the request (one poll + ε); watchdog: the
   * eviction window [low, high] in seconds after the send, for an abort that was lost.
   */
  bounds: {honourBySeconds: number; watchdog: [number, number]}
  /** Where its aborts went: prefill, decode or both (`--side`). */
  sides?: Array<'prefill' | 'decode'>
  /** Which path released it, from the answer's words, the logs and the counters (unknown where none shows it). */
  releasedBy?: {path: ReleasePath; evidence: string[]}
  /** Whether its request is shown to have entered prefill before the abort (only then does the trial count). */
  entry?: AbortEntry
  /** The abort demonstrably landed inside the transfer window; when not, why not. */
  inWindow: boolean
  notInWindow?: string
  verdict: Outcome
  /** honoured, lost-then-evicted, pinned, late, completed, unexplained, ambiguous, raced, released-before-abort. */
  outcome: string
  evidence: Record<string, unknown>
}

/** Whether a scenario's abort trials covered the transfer window: without coverage no abort passes. */
export interface AbortCoverage {
  trials: number
  /** Trials whose abort demonstrably landed in the window. */
  inWindow: number
  /** Trials that must land there before any abort can pass. */
  required: number
  /** The window swept, ms after each send, and what held it open; null when the run did not record it. */
  window: {startMs: number; endMs: number; why: string; widening: 'packet-filter' | 'twin-failpoint' | 'none'} | null
  /** Packets the widening filter matched while in place; null without a filter or when its count was not read. */
  filterMatchedPackets: number | null
  /** Offsets planned, and offsets the aborts were really fired at (ms after send, in trial order). */
  offsets: {plannedMs: number[]; firedMs: number[]}
  verified: boolean
  /** One line: "aborts in window: 5/6, filter matched 312 packets". */
  summary: string
  /** When unverified: why, and what would make it verifiable. */
  why?: string
  toVerify?: string
}

/** A fault's lease as the run saw it: injected, verified in place, reverted, verified clean. */
export interface LeaseRecord {
  id: string
  fault: string
  mechanism: string
  /** The host the lease (and the fault) is on, by its name in the deployment file: a deployment over several hosts. */
  host?: string
  injectedAt: number | null
  revertedAt: number | null
  verifiedInjected: boolean
  verifiedClean: boolean
  expiresAt: number
  evidence: {injected: string[]; clean: string[]}
}

/** A fault plan's commands as people read them (every argument through the one quoting function). */
export interface RenderedPlan {
  inject: string[]
  revert: string[]
  verifyInjected: string[]
  verifyClean: string[]
  readOnlyProbes: string[]
}

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
  /** abort-mid-transfer: each trial as judged, and whether the trials covered the transfer window. */
  aborts?: AbortRecord[]
  abortCoverage?: AbortCoverage
  leases: LeaseRecord[]
  timeline?: Timeline
  contract: Contract
  /** The scenario could not run to a verdict (infrastructure, stop condition): one line. */
  error?: string
  /** `halted`: the run was halted (`pdchaos halt`) before this scenario finished (model/halt.ts). */
  status?: 'halted'
  /** Where the deployment lists several instances of a role: the pair the fault acted on, as the file states them. */
  pair?: {prefill: string; decode: string}
  /** The fault's mechanism and plan, as injected (or as a dry run would). */
  mechanism?: string
  description?: string
  plan?: RenderedPlan
  /** Why the asked-for variant was not used, and other facts about the plan. */
  refusals?: string[]
  notes?: string[]
  /** The calibration the scenario was judged with. */
  calibration?: Calibration & {routerMs: number}
  /** SGLang's own timeouts that could release its pins, each with where it was read (a pass must exclude them). */
  competingTimeouts?: CompetingTimeout[]
  /** --dry-run: the read-only probes and what they printed. */
  dryRun?: {probes: Array<{argv: string; code: number | null; stdout: string; stderr: string}>}
  /** --hold: the lease left armed, and when the host reverts it. */
  held?: {leaseId: string; expiresAt: string}
}

export interface SuiteRun {
  name: string
  /** Names the run in the Pushgateway grouping and in file names; defaults to one derived from startedAt. */
  runId?: string
  /** The engine of the deployment, where it is not SGLang's (`vllm`: src/engines/vllm/experiments/suite.ts). */
  engine?: 'sglang' | 'vllm'
  startedAt: number
  finishedAt: number
  /** The deployment's name. */
  deployment: string
  /** The host as pdchaos reached it (`ssh user@host:22`, `local`): a combined report names where each run went. */
  target?: string
  /** The release gate's verdict, when the run was a gate. */
  gate?: {passed: boolean; reasons: string[]}
  /** `halt`: stopped by `pdchaos halt` (model/halt.ts): who, when and why. */
  stopped?: {reason: string; halt?: {by: string; at: number; reason: string; host?: string}}
  scenarios: ScenarioRun[]
  /** The batch plan, as printed before any injection. */
  plan?: string[]
  batches?: Array<{index: number; scenarios: string[]; ms: number; floorMs: number}>
  /** Sum over batches of the longest deadline + poll, plus the restarts' health waits (ms). */
  floorMs?: number
  /** Conditions that could not be watched, and other facts about the run. */
  notes?: string[]
}

export interface RunCounts {
  verdicts: number
  passed: number
  failed: number
  /** Checks that lacked their data: neither passed nor failed. */
  unverified: number
  scenarios: number
  /** Scenarios with an error (no verdict could be reached). */
  errored: number
  /** Leases injected but not verified clean afterwards: the host may still be faulted. */
  faultsLeftBehind: number
}

export function runCounts(run: SuiteRun): RunCounts {
  let passed = 0
  let failed = 0
  let unverified = 0
  for (const s of run.scenarios) {
    for (const v of s.verdicts) {
      if (v.verdict === 'pass') passed++
      else if (v.verdict === 'fail') failed++
      else unverified++
    }
  }
  return {
    verdicts: passed + failed + unverified,
    passed,
    failed,
    unverified,
    scenarios: run.scenarios.length,
    errored: run.scenarios.filter(s => s.error !== undefined).length,
    faultsLeftBehind: faultsLeftBehind(run),
  }
}

export function faultsLeftBehind(run: SuiteRun): number {
  let n = 0
  for (const s of run.scenarios) for (const l of s.leases) if (l.injectedAt !== null && !l.verifiedClean) n++
  return n
}

/** The run's overall verdict: the gate's when there was one, else no check failed, no blocking check stayed
 * unverified (the watchdog's own by default), nothing errored, stopped or was left faulted. */
export function runPassed(run: SuiteRun): boolean {
  if (run.gate) return run.gate.passed
  const c = runCounts(run)
  return (
    c.failed === 0 &&
    blockingUnverified(run).length === 0 &&
    c.errored === 0 &&
    c.faultsLeftBehind === 0 &&
    run.stopped === undefined
  )
}

/** Every unverified verdict with the scenario it belongs to, in run order. */
export function unverifiedChecks(run: SuiteRun): Array<{scenario: string; verdict: Verdict}> {
  return run.scenarios.flatMap(s =>
    s.verdicts.filter(v => v.verdict === 'unverified').map(verdict => ({scenario: s.name, verdict})),
  )
}

/** The unverified verdicts that block: of the given checks (by default the watchdog's eviction check). */
export function blockingUnverified(
  run: SuiteRun,
  blocks: readonly CheckName[] = UNVERIFIED_BLOCKS_BY_DEFAULT,
): Array<{scenario: string; verdict: Verdict}> {
  return unverifiedChecks(run).filter(x => blocks.includes(x.verdict.check))
}

export function runIdOf(run: SuiteRun): string {
  return (
    run.runId ??
    `r-${new Date(run.startedAt)
      .toISOString()
      .replace(/[-:]/g, '')
      .replace(/\.\d+Z$/, 'Z')}`
  )
}

/** Every failing verdict with the scenario it belongs to, in run order. */
export function failedChecks(run: SuiteRun): Array<{scenario: string; verdict: Verdict}> {
  return run.scenarios.flatMap(s =>
    s.verdicts.filter(v => v.verdict === 'fail').map(verdict => ({scenario: s.name, verdict})),
  )
}

/** The README's exit codes for a run: stopped 3; a gate decides 0 or 1; a fault left behind 4; nothing judged and every
 * scenario errored 5 (the target or the host failed, not a check); a failed check, a blocking unverified one (the
 * watchdog's eviction check by default) or a scenario without a verdict 1; else 0. */
export function runExitCode(run: SuiteRun): ExitCodeValue {
  const c = runCounts(run)
  if (run.stopped) return ExitCode.stopped
  if (run.gate) return run.gate.passed ? ExitCode.ok : ExitCode.checkFailed
  if (c.faultsLeftBehind > 0) return ExitCode.cleanupUnverified
  if (c.verdicts === 0 && c.scenarios > 0 && c.errored === c.scenarios) return ExitCode.unreachable
  if (c.failed > 0 || c.errored > 0 || blockingUnverified(run).length > 0) return ExitCode.checkFailed
  return ExitCode.ok
}
