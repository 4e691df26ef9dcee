import {failedChecks, runCounts, runPassed, type SuiteRun, unverifiedChecks} from '../model/run.js'
import {coverageShort} from './abort-text.js'

/**
 * The suite's human summary: per scenario, then exactly which checks failed with their evidence line, then the verdict.
 */
export function renderSuite(run: SuiteRun, o: {wallMs: number; twin?: string}): string {
  const c = runCounts(run)
  const lines: string[] = []
  if (o.twin) lines.push(o.twin)
  // A vLLM run names its engine; it has no floor (its waits are each experiment's lease windows).
  const engine = run.engine ? ` (engine ${run.engine})` : ''
  const floor = run.engine && run.floorMs === undefined ? '' : ` (floor ${((run.floorMs ?? 0) / 1000).toFixed(1)}s)`
  lines.push(
    `suite ${run.name} on ${run.deployment}${engine}: ${c.scenarios} scenario(s) in ${run.batches?.length ?? 0} ` +
      `batch(es), ${(o.wallMs / 1000).toFixed(1)}s${floor}`,
  )
  for (const s of run.scenarios) {
    const failed = s.verdicts.filter(v => v.verdict === 'fail').length
    const unverified = s.verdicts.filter(v => v.verdict === 'unverified').length
    const mark = s.error !== undefined ? 'ERROR' : failed > 0 ? 'FAIL ' : unverified > 0 ? 'UNVR ' : 'PASS '
    if (s.status === 'halted') lines.push(`  HALT  ${s.name}: halted before it finished (pdchaos halt)`)
    if (s.status === 'halted') continue
    const pins =
      s.pins.length > 0
        ? `, ${s.pins.filter(p => p.verdict === 'pass').length}/${s.pins.length} pins evicted in window`
        : ''
    const aborts = s.abortCoverage ? `, ${coverageShort(s.abortCoverage)}` : ''
    const passed = s.verdicts.length - failed - unverified
    const pair = s.pair
      ? ` (on ${s.pair.prefill.replace(/^services\./, '')} + ${s.pair.decode.replace(/^services\./, '')})`
      : ''
    lines.push(
      `  ${mark} ${s.name}${pair}: ${passed}/${s.verdicts.length} checks ` +
        `passed${unverified ? `, ${unverified} unverified` : ''}${pins}${aborts}${s.error ? ` — ${s.error}` : ''}`,
    )
  }
  const failed = failedChecks(run)
  if (failed.length > 0) {
    lines.push('failed checks:')
    for (const f of failed.slice(0, 50))
      lines.push(`  ${f.verdict.check} [${f.scenario}] ${f.verdict.subject}: ${f.verdict.summary}`)
    if (failed.length > 50) lines.push(`  … and ${failed.length - 50} more (see the journal)`)
  }
  const unverified = unverifiedChecks(run)
  if (unverified.length > 0) {
    lines.push('unverified checks (no pass, no fail: the data was missing):')
    for (const u of unverified.slice(0, 50))
      lines.push(
        `  ${u.verdict.check} [${u.scenario}] ${u.verdict.subject}: ${u.verdict.summary} ` +
          `— ${String(u.verdict.evidence.why)}; to verify: ${String(u.verdict.evidence.toVerify)}`,
      )
    if (unverified.length > 50) lines.push(`  … and ${unverified.length - 50} more (see the journal)`)
  }
  if (c.faultsLeftBehind > 0) lines.push(`${c.faultsLeftBehind} fault(s) NOT verified clean: run \`pdchaos recover\``)
  if (run.stopped)
    lines.push(
      `STOPPED: ${run.stopped.reason}. Everything held was reverted; a stopped run is never resumed (run the suite ` +
        `again from the start).`,
    )
  if (run.gate) {
    lines.push(run.gate.passed ? 'release gate: PASS' : 'release gate: FAIL')
    for (const r of run.gate.reasons) lines.push(`  ${r}`)
  } else {
    lines.push(
      runPassed(run)
        ? `all ${c.passed} checks passed${c.unverified ? ` (${c.unverified} unverified, not blocking)` : ''}`
        : `${c.failed} of ${c.verdicts} checks ` +
            `failed${
              c.unverified ? `, ${c.unverified} ` + `unverified` : ''
            }${c.errored ? `, ${c.errored} scenario(s) reached no verdict` : ''}`,
    )
  }
  return lines.join('\n')
}
