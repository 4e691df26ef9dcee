import type {RestartResult} from '../model/restart.js'
import {renderVerdicts} from './verdicts-text.js'

/** "gpu-b: exit 1", or "gpu-a: ok". */
function nodeExit(n: {host: string; exitCode: number | null}): string {
  return `${n.host}: ${n.exitCode === 0 ? 'ok' : `exit ${n.exitCode}`}`
}

export function renderRestart(r: RestartResult): string {
  const out: string[] = []
  for (const s of r.steps) {
    // An instance of a role with several is named as the file has it (prefill[1]).
    const name = s.instance?.replace(/^services\./, '') ?? s.service
    // A multi-node instance: the command ran on every node at once; each node's exit is named where one failed.
    const nodes = s.nodes
      ? ` on ${s.nodes.length} ` +
        `nodes${s.nodes.some(n => n.exitCode !== 0) ? ` (${s.nodes.map(nodeExit).join(', ')})` : ''}`
      : ''
    out.push(
      `${name.padEnd(10)} restart ${s.exitCode === 0 ? 'ok' : `exit ${s.exitCode}`}${nodes} ` +
        `in ${(s.commandMs / 1000).toFixed(2)}s, ` +
        (s.healthyAfterMs === null ? 'NEVER HEALTHY' : `healthy after ${(s.healthyAfterMs / 1000).toFixed(2)}s`),
    )
  }
  if (r.alone) {
    const a = r.alone
    const by = (path: string) => a.canaries.filter(c => c.path === path)
    const okOf = (cs: typeof a.canaries) =>
      cs.filter(c => c.status !== null && c.status >= 200 && c.status < 300).length
    out.push(
      `canaries  after ${a.role} was healthy: router ${okOf(by('router'))}/${by('router').length} ok, ` +
        `direct ${okOf(by('direct'))}/${by('direct').length} ok; ` +
        (a.heartbeat
          ? `heartbeat bound ${a.heartbeat.intervalSeconds}s x ${a.heartbeat.maxFailure} = ${a.heartbeat.boundSeconds}s`
          : 'heartbeat bound unknown'),
    )
    if (a.repaired) out.push(`repair    co-restart ${a.repaired.join(' → ')} to bring the deployment back`)
  }
  out.push(`total ${(r.totalMs / 1000).toFixed(1)}s`)
  out.push('')
  out.push(renderVerdicts(r.verdicts))
  return out.join('\n')
}
