import {blockingUnverified, failedChecks, faultsLeftBehind, type SuiteRun} from '../model/run.js'
import type {GateSpec} from './suite-file.js'

/**
 * The release gate: the run passes when at most maxFailedChecks checks failed, at most maxFaultsLeftBehind faults
 * were left on the host, every required check ran and never failed, no check the gate names stayed unverified
 * (eviction by default), no scenario errored and the run was not stopped. Each reason names the scenario, the
 * check, its subject and the evidence's one line.
 */
export function evaluateGate(run: SuiteRun, spec: GateSpec): {passed: boolean; reasons: string[]} {
  const reasons: string[] = []
  const failed = failedChecks(run)
  if (failed.length > spec.maxFailedChecks) {
    reasons.push(`${failed.length} check(s) failed (allowed ${spec.maxFailedChecks})`)
    for (const f of failed) reasons.push(`FAILED ${f.verdict.check} [${f.scenario}] ${f.verdict.subject}: ${f.verdict.summary}`)
  }
  for (const u of blockingUnverified(run, spec.unverifiedBlocks)) {
    reasons.push(`UNVERIFIED ${u.verdict.check} [${u.scenario}] ${u.verdict.subject}: ${u.verdict.summary}`)
  }
  const left = faultsLeftBehind(run)
  if (left > spec.maxFaultsLeftBehind) reasons.push(`${left} fault(s) left behind on the host (allowed ${spec.maxFaultsLeftBehind})`)
  for (const check of spec.requiredChecks) {
    const all = run.scenarios.flatMap((s) => s.verdicts.filter((v) => v.check === check).map((v) => ({s: s.name, v})))
    if (all.length === 0) reasons.push(`required check ${check} never ran`)
    const bad = all.filter((x) => x.v.verdict === 'fail')
    if (bad.length > 0 && failed.length <= spec.maxFailedChecks) {
      for (const b of bad) reasons.push(`FAILED required ${check} [${b.s}] ${b.v.subject}: ${b.v.summary}`)
    } else if (bad.length > 0) {
      reasons.push(`required check ${check} failed ${bad.length} time(s)`)
    }
  }
  for (const s of run.scenarios) if (s.error !== undefined) reasons.push(`scenario ${s.name} did not reach a verdict: ${s.error}`)
  if (run.stopped) reasons.push(`the run was stopped: ${run.stopped.reason}`)
  return {passed: reasons.length === 0, reasons}
}
