import {describeUnsafe} from '../faults/lease/host-safety.js'
import {describeExpiry} from '../faults/lease/lease.js'
import type {RecoverOutcome, RecoverReport} from '../faults/lease/recover.js'

/** `pdchaos recover`'s text: each lease's outcome on a line, then the host's state. */
export function renderRecover(r: RecoverReport): string {
  if (r.alreadyClean) return `nothing to recover on ${r.host} (${r.stateDir})`
  const lines = r.recovered.map(o => line(o))
  const named = new Set(r.recovered.map(o => o.why ?? ''))
  for (const f of r.refused)
    if (![...named].some(w => w.includes(f.path))) lines.push(`REFUSED   ${describeUnsafe(f)}; not read, not run`)
  const left = r.remaining.length
  const refused = r.recovered.filter(o => o.action === 'refused').length
  const held = left - refused
  lines.push(
    r.clean
      ? left === 0
        ? `${r.host} is clean: no lease left in ${r.stateDir}`
        : [
            held > 0 ? `${held} lease(s) left to the runs holding them` : '',
            refused > 0 ? `${refused} lease(s) refused: another user's files, not run` : '',
          ]
            .filter(Boolean)
            .join('; ')
            .replace(/^/, `${r.host}: `)
      : `cleanup unverified on ${r.host}: ${left} lease(s) still active (${r.remaining.join(', ') || 'unknown'}); ` +
          `the host may still be faulted`,
  )
  return lines.join('\n')
}

function line(o: RecoverOutcome): string {
  const name = `${o.id} (${o.fault ?? 'unknown fault'})`
  switch (o.action) {
    case 'reverted':
      return (
        `${o.clean ? 'reverted ' : 'FAILED   '} ${name} in ${o.ms} ms, revert script ` +
        `exit ${o.exitCode}${o.why ? `: ${o.why}` : ''}`
      )
    case 'already-reverted':
      return `already   ${name} was reverted by ${o.revertedBy ?? 'someone'} (exit ${o.exitCode})`
    case 'gone':
      return `gone      ${name} disappeared while recovering`
    case 'skipped':
      return `skipped   ${name}: ${o.why}; it reverts itself ${describeExpiry(o.expiresAt ?? undefined)}`
    case 'in-progress':
      return `BUSY      ${name}: ${o.why}`
    case 'failed':
      return `FAILED    ${name}: ${o.why}; the host reverts it by itself ${describeExpiry(o.expiresAt ?? undefined)}`
    case 'refused':
      return `REFUSED   ${name}: ${o.why}`
  }
}
