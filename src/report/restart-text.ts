import type {RestartResult} from '../model/restart.js'
import {renderVerdicts} from './verdicts-text.js'

export function renderRestart(r: RestartResult): string {
  const out: string[] = []
  for (const s of r.steps) {
    // An instance of a role with several is named as the file has it (prefill[1]).
    const name = s.instance?.replace(/^services\./, '') ?? s.service
    out.push(`${name.padEnd(10)} restart ${s.exitCode === 0 ? 'ok' : `exit ${s.exitCode}`} in ${(s.commandMs / 1000).toFixed(2)}s, ` +
      (s.healthyAfterMs === null ? 'NEVER HEALTHY' : `healthy after ${(s.healthyAfterMs / 1000).toFixed(2)}s`))
  }
  out.push(`total ${(r.totalMs / 1000).toFixed(1)}s`)
  out.push('')
  out.push(renderVerdicts(r.verdicts))
  return out.join('\n')
}
