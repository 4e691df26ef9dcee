import {type Trend, verdictLetter} from '../model/trend.js'

/** The plain-text trend (`pdchaos report --trend`): drift first, then each scenario's check verdicts run by run. */
export function renderTrend(t: Trend): string {
  const lines: string[] = []
  const first = t.runs[0]
  const last = t.runs.at(-1)
  const span = first && last ? `${iso(first.startedAt)} … ${iso(last.startedAt)}` : 'no runs'
  const deployments = `deployment${t.deployments.length > 1 ? 's' : ''} ${t.deployments.join(', ')}`
  lines.push(`Trend over ${t.runs.length} run(s) (${span}), ${deployments}`)
  if (t.drifts.length === 0) {
    lines.push(`No drift: no eviction margin fell by ${t.driftMs} ms or more beyond the runs' noise.`)
  } else {
    lines.push(`Drift (${t.drifts.length}):`)
    for (const d of t.drifts) lines.push(`  ${d.text}`)
  }
  const named = (d: string, s: string) => (t.deployments.length > 1 ? `${d} · ${s}` : s)
  if (t.latest.length > 0) {
    lines.push('Smallest eviction margin in the newest run (to deadline / to deadline + poll):')
    for (const l of t.latest) {
      const both = `${Math.round(l.earlyMs)} ms / ${Math.round(l.lateMs)} ms`
      lines.push(`  ${named(l.deployment, l.scenario)}: ${both} (run ${l.run + 1})`)
    }
  }
  if (t.checks.length > 0) {
    lines.push('Verdicts per run, oldest first (P passed, F failed, U unverified, - not judged):')
    const label = (c: Trend['checks'][number]) => `${named(c.deployment, c.scenario)} ${c.check}`
    const width = Math.max(...t.checks.map(c => label(c).length))
    for (const c of t.checks) lines.push(`  ${label(c).padEnd(width)}  ${c.perRun.map(verdictLetter).join('')}`)
  }
  const passed = t.runs.filter(r => r.passed).length
  lines.push(`Runs: ${t.runs.map(r => (r.passed ? 'P' : 'F')).join('')} (${passed}/${t.runs.length} passed)`)
  return lines.join('\n')
}

/** The trend's --json document. */
export function trendJson(t: Trend): Record<string, unknown> {
  return {trend: t}
}

const iso = (ms: number) => new Date(ms).toISOString().replace(/\.\d+Z$/, 'Z')
