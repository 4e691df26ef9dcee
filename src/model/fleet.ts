import {ExitCode} from '../exit-codes.js'
import {runExitCode, type SuiteRun} from './run.js'

/**
 * A fleet: several deployments, each run on its own (its own host lock, journal and verdicts), combined into one
 * report and one exit code. Built by `suite --fleet` as the runs end, or by `pdchaos report` from their journals; plain
 * JSON like the run model, so the reports render either the same way.
 */

/** What became of one deployment. `unreachable`: it never got to a verdict because its host or a service did not
 * answer; `error`: pdchaos refused or failed to run it (a lock held by another run, a crash); `not-run`: the fleet
 * was stopped before its turn. */
export type MemberStatus = 'pass' | 'fail' | 'stopped' | 'cleanup-unverified' | 'unreachable' | 'error' | 'not-run'

export interface FleetMember {
  /** The fleet file's name for it (or, from a journal, its --label or deployment name). */
  name: string
  status: MemberStatus
  /** Its own exit code, as `pdchaos suite` alone would have exited. */
  exitCode: number
  /** Why it reached no verdict, one line (unreachable, refused, crashed, not run). */
  reason?: string
  suggestion?: string
  /** The deployment's own name, the host pdchaos reached, the deployment file, the suite's name. */
  deployment?: string
  target?: string
  config?: string
  suite?: string
  /** Its journal file. */
  journal?: string
  /** When it began and ended (epoch ms): its run's, or for one that reached no verdict, its attempt's. */
  startedAt?: number
  finishedAt?: number
  run?: SuiteRun
}

export interface FleetRun {
  name: string
  runId?: string
  startedAt: number
  finishedAt: number
  /** The bound on deployments run at once (a fleet run; absent when combined from journals). */
  maxParallel?: number
  members: FleetMember[]
  /** The combined exit code (fleetExitCode). */
  exitCode: number
}

/**
 * The combined exit code when deployments differ: the most urgent first. 4, a host may still be faulted (someone must
 * run `pdchaos recover` there); 3, a run was stopped (interrupted, or a stop condition saw the deployment hurt);
 * 1, a check failed (the finding the fleet exists for, never hidden behind another deployment's infrastructure
 * trouble); 5, a deployment was unreachable or its run failed for infrastructure; 2, a run was refused (its lock
 * held by another run, a bad file); 0 only when every deployment passed.
 */
export const FLEET_EXIT_PRECEDENCE: readonly number[] = [
  ExitCode.cleanupUnverified,
  ExitCode.stopped,
  ExitCode.checkFailed,
  ExitCode.unreachable,
  ExitCode.badInput,
  ExitCode.ok,
]

/** The combined exit code of member exit codes (an unknown code counts as infrastructure, 5). */
export function fleetExitCode(codes: readonly number[]): number {
  const known = codes.map(c => (FLEET_EXIT_PRECEDENCE.includes(c) ? c : ExitCode.unreachable))
  return FLEET_EXIT_PRECEDENCE.find(c => known.includes(c)) ?? ExitCode.ok
}

/** A member's status from its exit code, and whether it has a run (5 with a run: it ran and nothing reached a
 * verdict; 5 without one: it never got that far). */
export function statusOf(exitCode: number, hasRun: boolean): MemberStatus {
  switch (exitCode) {
    case ExitCode.ok:
      return 'pass'
    case ExitCode.checkFailed:
      return 'fail'
    case ExitCode.stopped:
      return 'stopped'
    case ExitCode.cleanupUnverified:
      return 'cleanup-unverified'
    case ExitCode.unreachable:
      return hasRun ? 'error' : 'unreachable'
    default:
      return 'error'
  }
}

/** A deployment whose run came back: its status and exit code are the run's own. */
export function memberOfRun(name: string, run: SuiteRun, more: Partial<FleetMember> = {}): FleetMember {
  const exitCode = runExitCode(run)
  return {
    name,
    deployment: run.deployment,
    ...(run.target ? {target: run.target} : {}),
    suite: run.name,
    ...more,
    startedAt: run.startedAt,
    finishedAt: run.finishedAt,
    status: statusOf(exitCode, true),
    exitCode,
    run,
  }
}

/** A deployment that reached no verdict: the error it ended with decides its status (exit 5 is unreachable unless the
 * error was pdchaos's own, E_INTERNAL: an error, not the deployment's fault). */
export function memberOfFailure(
  name: string,
  failure: {exitCode: number; reason: string; suggestion?: string; code?: string},
  more: Partial<FleetMember> = {},
): FleetMember {
  const status = failure.code === 'E_INTERNAL' ? 'error' : statusOf(failure.exitCode, false)
  return {
    name,
    ...more,
    status,
    exitCode: failure.exitCode,
    reason: failure.reason,
    ...(failure.suggestion ? {suggestion: failure.suggestion} : {}),
  }
}

/** The member with the worse of its own exit code and another (its process's, when the two disagree). */
export function worseExit(m: FleetMember, exitCode: number): FleetMember {
  const worst = fleetExitCode([m.exitCode, exitCode])
  return worst === m.exitCode ? m : {...m, exitCode: worst, status: statusOf(worst, m.run !== undefined)}
}

export function fleetOf(o: {
  name: string
  runId?: string
  startedAt: number
  finishedAt: number
  maxParallel?: number
  members: FleetMember[]
}): FleetRun {
  return {...o, exitCode: fleetExitCode(o.members.map(m => m.exitCode))}
}

/** A fleet's run id (Pushgateway grouping, each deployment's `--run-id` prefix), from its start. */
export function fleetRunId(startedAt: number): string {
  return `fleet-${new Date(startedAt)
    .toISOString()
    .replace(/[-:]/g, '')
    .replace(/\.\d+Z$/, 'Z')}`
}
