import {Flags} from '@oclif/core'

import {TargetCommand} from '../cli/target-command.js'
import {everyHostOf} from '../cli/target.js'
import {ExitCode} from '../exit-codes.js'
import {describeUnsafe} from '../faults/lease/host-safety.js'
import {describeExpiry} from '../faults/lease/lease.js'
import {combinedRecovery, recoverAll, type RecoverOutcome, type RecoverReport} from '../faults/lease/recover.js'

export default class Recover extends TargetCommand<typeof Recover> {
  static override summary = 'Revert every fault pdchaos left on the host, from the lease files alone.'
  static override description =
    "Reads the leases in the deployment's stateDir on the host, runs each revert script (the same one its reverter " +
    'would run at expiry), then lists the state dir again to verify none is left. Needs no local state; running it ' +
    'twice is safe. Without --all, leases held by a pdchaos still running on this machine are left to it. A lease ' +
    'file that another user owns or can write is never run: it is named with its owner and the exit is 2. Exits 4 ' +
    'when a lease could not be reverted cleanly.'
  static override examples = [
    '<%= config.bin %> recover -c pdchaos.yaml',
    '<%= config.bin %> recover --sim --all --json',
  ]
  static override flags = {
    ...TargetCommand.targetFlags,
    all: Flags.boolean({summary: 'Also revert leases held by a pdchaos still running on this machine.'}),
  }

  async run(): Promise<RecoverReport & {hosts?: RecoverReport[]}> {
    // Never start the twin to recover it: a twin that is not running has nothing of ours to revert.
    const {report, parts} = await this.withTarget({startTwin: false}, async t => {
      // Every host of the deployment, each from its own state dir, side by side.
      const parts = await Promise.all(
        everyHostOf(t).hosts.map(h => recoverAll(h.host, h.stateDir, {all: this.flags.all})),
      )
      return {report: parts.length === 1 ? parts[0]! : {...combinedRecovery(parts), hosts: parts}, parts}
    })
    if (!this.jsonEnabled()) this.log(parts.map(p => render(p)).join('\n'))
    if (!report.clean) process.exitCode = ExitCode.cleanupUnverified
    else if (report.refused.length > 0) {
      // Planted or tampered lease files: bad input on the host, named in one line with the owner.
      process.exitCode = ExitCode.badInput
      if (!this.jsonEnabled()) {
        process.stderr.write(
          `Error: refusing ${report.refused.length} lease file(s) in ${report.stateDir} ` +
            `on ${report.host}: ${describeUnsafe(report.refused[0]!)}\n`,
        )
        process.stderr.write(
          'Try this: remove what another user put in the state dir (it was not run), and make the state dir ' +
            'writable only by the user pdchaos runs as\n',
        )
      }
    }
    return report
  }
}

function render(r: RecoverReport): string {
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
