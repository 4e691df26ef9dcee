import {pinMargin} from '../model/margins.js'
import {blockingUnverified, failedChecks, faultsLeftBehind, type SuiteRun} from '../model/run.js'
import type {GateSpec} from './suite-file.js'

/**
 * The release gate: the run passes when at most maxFailedChecks checks failed, at most maxFaultsLeftBehind faults
 * were left on the host, every required check ran and never failed, no check the gate names stayed unverified
 * (eviction by default), no scenario errored, the run was not stopped and, with minMarginMs, every eviction landed at
 * least that far from the deadline and from deadline + poll. Each reason names the scenario, the check, its subject and
 * the evidence's one line.
 */
export function evaluateGate(run: SuiteRun, spec: GateSpec): {passed: boolean; reasons: string[]} {
  const reasons: string[] = []
  const failed = failedChecks(run)
  if (failed.length > spec.maxFailedChecks) {
    reasons.push(`${failed.length} check(s) failed (allowed ${spec.maxFailedChecks})`)
    for (const f of failed)
      reasons.push(`FAILED ${f.verdict.check} [${f.scenario}] ${f.verdict.subject}: ${f.verdict.summary}`)
  }
  for (const u of blockingUnverified(run, spec.unverifiedBlocks)) {
    reasons.push(`UNVERIFIED ${u.verdict.check} [${u.scenario}] ${u.verdict.subject}: ${u.verdict.summary}`)
  }
  const left = faultsLeftBehind(run)
  if (left > spec.maxFaultsLeftBehind)
    reasons.push(`${left} fault(s) left behind on the host (allowed ${spec.maxFaultsLeftBehind})`)
  for (const check of spec.requiredChecks) {
    const all = run.scenarios.flatMap(s => s.verdicts.filter(v => v.check === check).map(v => ({s: s.name, v})))
    if (all.length === 0) reasons.push(`required check ${check} never ran`)
    const bad = all.filter(x => x.v.verdict === 'fail')
    if (bad.length > 0 && failed.length <= spec.maxFailedChecks) {
      for (const b of bad) reasons.push(`FAILED required ${check} [${b.s}] ${b.v.subject}: ${b.v.summary}`)
    } else if (bad.length > 0) {
      reasons.push(`required check ${check} failed ${bad.length} time(s)`)
    }
  }
  if (spec.minMarginMs !== undefined) reasons.push(...marginReasons(run, spec.minMarginMs))
  for (const s of run.scenarios)
    if (s.error !== undefined) reasons.push(`scenario ${s.name} did not reach a verdict: ${s.error}`)
  if (run.stopped) reasons.push(`the run was stopped: ${run.stopped.reason}`)
  return {passed: reasons.length === 0, reasons}
}

/** Each eviction closer than minMs to a bound of its contract (one that crossed it fails its check as well). */
function marginReasons(run: SuiteRun, minMs: number): string[] {
  const out: string[] = []
  for (const s of run.scenarios) {
    for (const p of s.pins) {
      const m = pinMargin(p, s.contract)
      if (!m) continue
      const [bound, ms] =
        m.lateMs <= m.earlyMs ? (['deadline + poll', m.lateMs] as const) : (['the deadline', m.earlyMs] as const)
      if (ms < minMs) {
        out.push(
          `MARGIN eviction [${s.name}] ${p.rid}: evicted after ${m.evictionSeconds} s, ${Math.round(ms)} ms from` +
            ` ${bound} (gate.minMarginMs ${minMs})`,
        )
      }
    }
  }
  return out
}
