import {failedChecks, runCounts, runPassed, type SuiteRun} from '../model/run.js'

/** The suite's human summary: per scenario, then exactly which checks failed with their evidence line, then the verdict. */
export function renderSuite(run: SuiteRun, o: {wallMs: number; twin?: string}): string {
  const c = runCounts(run)
  const lines: string[] = []
  if (o.twin) lines.push(o.twin)
  lines.push(`suite ${run.name} on ${run.deployment}: ${c.scenarios} scenario(s) in ${run.batches?.length ?? 0} batch(es), ${(o.wallMs / 1000).toFixed(1)}s (floor ${((run.floorMs ?? 0) / 1000).toFixed(1)}s)`)
  for (const s of run.scenarios) {
    const failed = s.verdicts.filter((v) => v.verdict === 'fail').length
    const mark = s.error !== undefined ? 'ERROR' : failed > 0 ? 'FAIL ' : 'PASS '
    const pins = s.pins.length > 0 ? `, ${s.pins.filter((p) => p.verdict === 'pass').length}/${s.pins.length} pins evicted in window` : ''
    lines.push(`  ${mark} ${s.name}: ${s.verdicts.length - failed}/${s.verdicts.length} checks passed${pins}${s.error ? ` — ${s.error}` : ''}`)
  }
  const failed = failedChecks(run)
  if (failed.length > 0) {
    lines.push('failed checks:')
    for (const f of failed.slice(0, 50)) lines.push(`  ${f.verdict.check} [${f.scenario}] ${f.verdict.subject}: ${f.verdict.summary}`)
    if (failed.length > 50) lines.push(`  … and ${failed.length - 50} more (see the journal)`)
  }
  if (c.faultsLeftBehind > 0) lines.push(`${c.faultsLeftBehind} fault(s) NOT verified clean: run \`pdchaos recover\``)
  if (run.stopped) lines.push(`STOPPED: ${run.stopped.reason}. Everything held was reverted; a stopped run is never resumed (run the suite again from the start).`)
  if (run.gate) {
    lines.push(run.gate.passed ? 'release gate: PASS' : 'release gate: FAIL')
    for (const r of run.gate.reasons) lines.push(`  ${r}`)
  } else {
    lines.push(runPassed(run) ? `all ${c.passed} checks passed` : `${c.failed} of ${c.verdicts} checks failed`)
  }
  return lines.join('\n')
}
