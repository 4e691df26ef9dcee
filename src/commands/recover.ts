import {Flags} from '@oclif/core'

import {TargetCommand} from '../cli/target-command.js'
import {ExitCode} from '../exit-codes.js'
import {describeExpiry} from '../faults/lease/lease.js'
import {recoverAll, type RecoverOutcome, type RecoverReport} from '../faults/lease/recover.js'

export default class Recover extends TargetCommand<typeof Recover> {
  static override summary = 'Revert every fault pdchaos left on the host, from the lease files alone.'
  static override description = 'Reads the leases in the deployment\'s stateDir on the host, runs each revert script (the same one its reverter would run at expiry), then lists the state dir again to verify none is left. Needs no local state; running it twice is safe. Without --all, leases held by a pdchaos still running on this machine are left to it. Exits 4 when a lease could not be reverted cleanly.'
  static override examples = ['<%= config.bin %> recover -c pdchaos.yaml', '<%= config.bin %> recover --sim --all --json']
  static override flags = {
    ...TargetCommand.targetFlags,
    all: Flags.boolean({summary: 'Also revert leases held by a pdchaos still running on this machine.'}),
  }

  async run(): Promise<RecoverReport> {
    // Never start the twin to recover it: a twin that is not running has nothing of ours to revert.
    const report = await this.withTarget({startTwin: false}, (t) => recoverAll(t.host, t.deployment.stateDir, {all: this.flags.all}))
    if (!this.jsonEnabled()) this.log(render(report))
    if (!report.clean) process.exitCode = ExitCode.cleanupUnverified
    return report
  }
}

function render(r: RecoverReport): string {
  if (r.alreadyClean) return `nothing to recover on ${r.host} (${r.stateDir})`
  const lines = r.recovered.map((o) => line(o))
  const left = r.remaining.length
  lines.push(r.clean
    ? (left === 0 ? `${r.host} is clean: no lease left in ${r.stateDir}` : `${r.host}: ${left} lease(s) left to the runs holding them`)
    : `cleanup unverified on ${r.host}: ${left} lease(s) still active (${r.remaining.join(', ') || 'unknown'}); the host may still be faulted`)
  return lines.join('\n')
}

function line(o: RecoverOutcome): string {
  const name = `${o.id} (${o.fault ?? 'unknown fault'})`
  switch (o.action) {
    case 'reverted': return `${o.clean ? 'reverted ' : 'FAILED   '} ${name} in ${o.ms} ms, revert script exit ${o.exitCode}${o.why ? `: ${o.why}` : ''}`
    case 'already-reverted': return `already   ${name} was reverted by ${o.revertedBy ?? 'someone'} (exit ${o.exitCode})`
    case 'gone': return `gone      ${name} disappeared while recovering`
    case 'skipped': return `skipped   ${name}: ${o.why}; it reverts itself ${describeExpiry(o.expiresAt ?? undefined)}`
    case 'in-progress': return `BUSY      ${name}: ${o.why}`
    case 'failed': return `FAILED    ${name}: ${o.why}; the host reverts it by itself ${describeExpiry(o.expiresAt ?? undefined)}`
  }
}
