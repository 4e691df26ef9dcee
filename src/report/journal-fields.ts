import {runIdOf, type ScenarioRun, type SuiteRun} from '../model/run.js'

/**
 * The journal (and `--json` result) of a run. Every run has the suite's shape: name, runId, scenarios, each with
 * its pins, leases and verdicts. A run of one fault scenario (inject) also carries that scenario's fields at the top
 * level, where scripts have read them since the first release: fault, mechanism, plan, pins, leases, verdicts.
 */
export function runJournal(
  run: SuiteRun,
  command: string,
  extra: Record<string, unknown> = {},
): Record<string, unknown> {
  return {command, ...run, runId: runIdOf(run), ...extra}
}

/** The per-pin and per-lease fields the README promises, for the top level of an inject result. */
export function injectFields(run: SuiteRun): Record<string, unknown> {
  const s: ScenarioRun | undefined = run.scenarios[0]
  if (!s) return {}
  const count = (o: string) => s.verdicts.filter(v => v.verdict === o).length
  return {
    deployment: run.deployment,
    contract: s.contract,
    fault: s.fault,
    mechanism: s.mechanism,
    description: s.description,
    plan: s.plan,
    ...(s.dryRun ? {dryRun: s.dryRun} : {}),
    ...(s.held ? {held: s.held} : {}),
    ...(s.refusals ? {refusals: s.refusals} : {}),
    ...(s.notes ? {notes: s.notes} : {}),
    calibration: s.calibration,
    leases: s.leases,
    pins: s.pins.map(p => ({
      rid: p.rid,
      fault: p.fault,
      sentAt: p.sentAt,
      evictedAt: p.evictedAt,
      evictionSeconds: p.evictionSeconds,
      bounds: p.bounds,
      verdict: p.verdict,
      evidence: p.evidence,
      ...(p.atEdge ? {atEdge: p.atEdge} : {}),
    })),
    verdicts: s.verdicts,
    summary: {
      passed: count('pass'),
      failed: count('fail'),
      ...(count('unverified') ? {unverified: count('unverified')} : {}),
    },
    ...(s.error ? {error: s.error} : {}),
    // abort-mid-transfer: each trial (rid, sentAt, abortedAt, releasedAt, targeted, bounds, verdict, evidence) and
    // whether the trials covered the transfer window.
    ...(s.aborts ? {aborts: s.aborts} : {}),
    ...(s.abortCoverage ? {abortCoverage: s.abortCoverage} : {}),
  }
}

/**
 * The journal of a run that reached no verdict (its target unreachable, its lock held, cleanup that could not be
 * verified): what it was and the error it ended with, so a combined report (`pdchaos report`) names the deployment
 * and why instead of missing it.
 */
export function failureJournal(
  command: string,
  fields: {
    name?: string
    runId?: string
    label?: string
    config?: string
    deployment?: string
    startedAt: number
    finishedAt: number
  },
  error: {code: string; exitCode: number; message: string; suggestions?: string[]},
): Record<string, unknown> {
  return {command, ...fields, error}
}
