import type {FleetMember, FleetRun, MemberStatus} from '../model/fleet.js'
import {failedChecks, runCounts, runIdOf} from '../model/run.js'

/** The fleet's human summary and its --json document: one line per deployment, every failed check, the exit code. */

const MEANING: Record<number, string> = {
  0: 'every deployment passed',
  1: 'a check failed',
  2: 'a run was refused',
  3: 'stopped',
  4: 'cleanup unverified: a host may still be faulted',
  5: 'a deployment was unreachable or its run failed',
}

const STATUSES: MemberStatus[] = ['pass', 'fail', 'stopped', 'cleanup-unverified', 'unreachable', 'error', 'not-run']

function memberLine(m: FleetMember, width: number): string {
  const mark = m.status.toUpperCase().padEnd(width)
  const where = [m.deployment, m.target && `(${m.target})`].filter(Boolean).join(' ')
  if (!m.run)
    return (
      `  ${mark} ${m.name}${where ? ` [${where}]` : ''}: ${m.reason ?? 'no run'}` +
      `${m.suggestion ? ` — try this: ${m.suggestion}` : ''}`
    )
  const c = runCounts(m.run)
  const checks =
    c.failed > 0 || c.unverified > 0
      ? `${c.failed} of ${c.verdicts} checks failed${c.unverified ? `, ${c.unverified} unverified` : ''}`
      : `${c.passed}/${c.verdicts} checks passed`
  const more = [
    c.errored && `${c.errored} scenario(s) reached no verdict`,
    c.faultsLeftBehind && `${c.faultsLeftBehind} fault(s) NOT verified clean`,
    m.run.stopped && `stopped: ${m.run.stopped.reason}`,
    m.run.gate && `release gate ${m.run.gate.passed ? 'PASS' : 'FAIL'}`,
    m.reason,
  ].filter(Boolean)
  return (
    `  ${mark} ${m.name}: suite ${m.run.name} on ${where}: ${c.scenarios} ` +
    `scenario(s), ${checks}${more.length ? `; ${more.join('; ')}` : ''}`
  )
}

export function renderFleet(fleet: FleetRun, o: {wallMs?: number} = {}): string {
  const lines: string[] = []
  const wall = ((o.wallMs ?? fleet.finishedAt - fleet.startedAt) / 1000).toFixed(1)
  lines.push(
    `${fleetTitle(fleet)}: ${fleet.members.length} ` +
      `deployment(s)${fleet.maxParallel ? `, at most ${fleet.maxParallel} at a time` : ''}, ${wall}s`,
  )
  const width = Math.max(...fleet.members.map(m => m.status.length))
  for (const m of fleet.members) lines.push(memberLine(m, width))
  const failed = fleet.members.flatMap(m => (m.run ? failedChecks(m.run).map(f => ({m, ...f})) : []))
  if (failed.length > 0) {
    lines.push('failed checks:')
    for (const f of failed.slice(0, 50))
      lines.push(`  [${f.m.name}] ${f.verdict.check} [${f.scenario}] ${f.verdict.subject}: ${f.verdict.summary}`)
    if (failed.length > 50) lines.push(`  … and ${failed.length - 50} more (see each deployment's journal)`)
  }
  for (const m of fleet.members) {
    if (m.run?.gate && !m.run.gate.passed)
      for (const r of m.run.gate.reasons.slice(0, 10)) lines.push(`  [${m.name}] gate: ${r}`)
    if (m.status === 'cleanup-unverified')
      lines.push(`  [${m.name}] faults NOT verified clean: run \`pdchaos recover -c ${m.config ?? 'DEPLOYMENT.yaml'}\``)
  }
  const counts = STATUSES.map(s => [s, fleet.members.filter(m => m.status === s).length] as const)
    .filter(([, n]) => n > 0)
    .map(([s, n]) => `${n} ${s}`)
  lines.push(`fleet: exit ${fleet.exitCode} (${MEANING[fleet.exitCode] ?? 'unknown'}); ${counts.join(', ')}`)
  return lines.join('\n')
}

/** "fleet nightly", or just "fleet" for the default name. */
export function fleetTitle(fleet: FleetRun): string {
  return fleet.name === 'fleet' ? 'fleet' : `fleet ${fleet.name}`
}

/** The --json document of a fleet (`suite --fleet`, `report`): the scenarios' details stay in each journal. */
export function fleetJson(fleet: FleetRun): Record<string, unknown> {
  return {
    fleet: fleet.name,
    ...(fleet.runId ? {runId: fleet.runId} : {}),
    startedAt: fleet.startedAt,
    finishedAt: fleet.finishedAt,
    ...(fleet.maxParallel ? {maxParallel: fleet.maxParallel} : {}),
    exitCode: fleet.exitCode,
    counts: Object.fromEntries(STATUSES.map(s => [s, fleet.members.filter(m => m.status === s).length])),
    deployments: fleet.members.map(m => {
      const {run, ...rest} = m
      if (!run) return rest
      return {
        ...rest,
        runId: runIdOf(run),
        summary: runCounts(run),
        ...(run.gate ? {gate: run.gate} : {}),
        ...(run.stopped ? {stopped: run.stopped} : {}),
        failedChecks: failedChecks(run).map(x => ({
          scenario: x.scenario,
          check: x.verdict.check,
          subject: x.verdict.subject,
          summary: x.verdict.summary,
        })),
      }
    }),
  }
}
