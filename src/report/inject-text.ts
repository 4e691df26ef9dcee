import type {ScenarioRun} from '../model/run.js'
import {abortTrialLines, coverageLines} from './abort-text.js'
import {OUTCOME_MARK, renderVerdicts} from './verdicts-text.js'

/** One fault scenario for people: the plan, then (dry run) the probes, (hold) the lease, or the pins and verdicts. */
export function renderInject(r: ScenarioRun): string {
  const out: string[] = [`${r.fault} via ${r.mechanism}: ${r.description}`]
  if (r.dryRun && r.plan) {
    out.push(
      '',
      'would inject:',
      ...r.plan.inject.map(c => `  ${c}`),
      'would revert:',
      ...r.plan.revert.map(c => `  ${c}`),
      'read-only probes:',
    )
    for (const p of r.dryRun.probes)
      out.push(`  ${p.code === 0 ? 'ok  ' : 'FAIL'} ${p.argv}${p.code === 0 ? '' : `: ${p.stderr}`}`)
    return out.join('\n')
  }
  if (r.held)
    return [
      ...out,
      `held under lease ${r.held.leaseId}: the host reverts it at ${r.held.expiresAt} (or run \`pdchaos recover\`)`,
    ].join('\n')
  const loaded = r.calibration?.loadedObserveMs
  if (r.calibration)
    out.push(
      `calibration: prefill ${r.calibration.prefillMs.toFixed(1)} ms ` +
        `(spread ${r.calibration.prefillSpreadMs.toFixed(1)}), observation ` +
        `p99 ${r.calibration.observeMs.toFixed(1)} ms over ${r.calibration.samples} ` +
        `requests${loaded === undefined ? '' : `, ${loaded.toFixed(1)} ms while the pins were out`}`,
    )
  if (r.pins.length > 0) {
    out.push('', 'pins:')
    for (const p of r.pins) {
      out.push(
        `  ${OUTCOME_MARK[p.verdict]} ${p.rid}  ` +
          `evicted ${p.evictionSeconds === null ? 'never' : `${p.evictionSeconds.toFixed(3)}s`}  window ` +
          `[${p.bounds[0].toFixed(3)}, ${p.bounds[1].toFixed(3)}]s${
            p.atEdge
              ? `  at the edge ` + `(${p.atEdge.bound === 'high' ? 'close' : 'opening'}, ${p.atEdge.marginMs} ms)`
              : ''
          }`,
      )
    }
  }
  const aimed = r.aborts?.[0]?.targeted
  if (r.aborts && aimed)
    out.push(
      '',
      `abort trials (aimed at ${aimed.queue}/${aimed.kvPoll}; offsets after send):`,
      ...abortTrialLines(r.aborts),
    )
  if (r.abortCoverage) out.push('', ...coverageLines(r.abortCoverage))
  if (r.error) out.push('', `error: ${r.error}`)
  if (r.status === 'halted') out.push('', 'HALTED before it finished (pdchaos halt): its fault was reverted')
  out.push('', renderVerdicts(r.verdicts))
  return out.join('\n')
}
