import {oneLine, PdError} from '../errors.js'
import {ExitCode} from '../exit-codes.js'
import {type FleetMember, type FleetRun, fleetOf, memberOfFailure} from '../model/fleet.js'
import {entryDeploymentName, type FleetEntry, type FleetPlan} from './fleet-file.js'

/**
 * Run a fleet: every deployment on its own, at most maxParallel at once, in the fleet file's order. How one deployment
 * runs is the caller's (the CLI runs each as its own `pdchaos suite` process, cli/fleet-member.ts); this only bounds,
 * orders, stops and collects. A deployment that fails in any way becomes a member with its reason; it never stops the
 * others. After the signal, no deployment starts: those not started are reported as not run (exit 3).
 */

export interface MemberContext {
  /** The fleet is stopping: the member should stop too (revert, journal, exit 3). */
  signal: AbortSignal
}

export type RunMember = (entry: FleetEntry, ctx: MemberContext) => Promise<FleetMember>

export interface FleetOptions {
  runMember: RunMember
  /** Overrides the fleet file's maxParallel. */
  maxParallel?: number
  runId?: string
  signal?: AbortSignal
  onStart?: (entry: FleetEntry, running: number) => void
  onEnd?: (member: FleetMember, running: number) => void
}

export async function runFleet(plan: FleetPlan, o: FleetOptions): Promise<FleetRun> {
  const startedAt = Date.now()
  const maxParallel = Math.max(1, Math.min(o.maxParallel ?? plan.maxParallel, plan.entries.length))
  const signal = o.signal ?? new AbortController().signal
  const members: Array<FleetMember | undefined> = plan.entries.map(() => undefined)
  let next = 0
  let running = 0
  const lane = async (): Promise<void> => {
    while (!signal.aborted && next < plan.entries.length) {
      const i = next++
      const entry = plan.entries[i]!
      running++
      o.onStart?.(entry, running)
      const member = await o.runMember(entry, {signal}).catch((error: unknown) =>
        memberOfFailure(
          entry.name,
          {
            exitCode: error instanceof PdError ? error.exitCode : ExitCode.unreachable,
            reason: oneLine(error),
            ...(error instanceof PdError ? {} : {code: 'E_INTERNAL'}),
            ...(error instanceof PdError && error.suggestion ? {suggestion: error.suggestion} : {}),
          },
          describeEntry(entry),
        ),
      )
      running--
      members[i] = member
      o.onEnd?.(member, running)
    }
  }
  await Promise.all(Array.from({length: maxParallel}, lane))
  const all = members.map((m, i) => m ?? notRun(plan.entries[i]!))
  return fleetOf({
    name: plan.name,
    ...(o.runId ? {runId: o.runId} : {}),
    startedAt,
    finishedAt: Date.now(),
    maxParallel,
    members: all,
  })
}

/** What the fleet file says about a deployment, for its member record. */
export function describeEntry(e: FleetEntry): Partial<FleetMember> {
  return {deployment: entryDeploymentName(e), config: e.deploymentFile, suite: e.suite.name}
}

function notRun(e: FleetEntry): FleetMember {
  return {
    ...memberOfFailure(
      e.name,
      {exitCode: ExitCode.stopped, reason: 'not run: the fleet was stopped before its turn'},
      describeEntry(e),
    ),
    status: 'not-run',
  }
}
