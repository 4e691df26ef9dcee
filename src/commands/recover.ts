import {Flags} from '@oclif/core'

import {renderRecover} from '../cli/recover-text.js'
import {TargetCommand} from '../cli/target-command.js'
import {engineFlags} from '../cli/engine-target.js'
import {everyHostOf} from '../cli/target.js'
import {openVllmHost, vllmFileNoStart} from '../cli/vllm-hosts.js'
import {ExitCode} from '../exit-codes.js'
import {describeUnsafe} from '../faults/lease/host-safety.js'
import {combinedRecovery, recoverAll, type RecoverReport} from '../faults/lease/recover.js'

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
    '<%= config.bin %> recover --sim --engine vllm',
  ]
  static override flags = {
    ...TargetCommand.targetFlags,
    engine: engineFlags.engine,
    all: Flags.boolean({summary: 'Also revert leases held by a pdchaos still running on this machine.'}),
  }

  /** Every host of the deployment, each from its own state dir, side by side; a vLLM file's one host. */
  private async recoverEach(): Promise<{report: RecoverReport & {hosts?: RecoverReport[]}; parts: RecoverReport[]}> {
    const vllm = await vllmFileNoStart(this.flags)
    if (vllm) {
      const h = await openVllmHost(vllm, {
        ...(this.flags['accept-new-host-key'] ? {acceptNewHostKey: true} : {}),
        ...(this.stopSignal ? {signal: this.stopSignal} : {}),
      })
      try {
        const report = await recoverAll(h.host, h.stateDir, {all: this.flags.all})
        return {report, parts: [report]}
      } finally {
        await h.close()
      }
    }
    return this.withTarget({startTwin: false}, async t => {
      const parts = await Promise.all(
        everyHostOf(t).hosts.map(h => recoverAll(h.host, h.stateDir, {all: this.flags.all})),
      )
      return {report: parts.length === 1 ? parts[0]! : {...combinedRecovery(parts), hosts: parts}, parts}
    })
  }

  async run(): Promise<RecoverReport & {hosts?: RecoverReport[]}> {
    // Never start the twin to recover it: a twin that is not running has nothing of ours to revert.
    const {report, parts} = await this.recoverEach()
    if (!this.jsonEnabled()) this.log(parts.map(p => renderRecover(p)).join('\n'))
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
