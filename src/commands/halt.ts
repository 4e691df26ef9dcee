import {Flags} from '@oclif/core'

import {failedDeployments, onEveryDeployment, whoAmI} from '../cli/halt-run.js'
import {TargetCommand} from '../cli/target-command.js'
import {engineFlags} from '../cli/engine-target.js'
import {writeHalt} from '../halt/host-halt.js'
import {haltLine, newHalt} from '../model/halt.js'

export default class Halt extends TargetCommand<typeof Halt> {
  static override summary = 'Stop all chaos on a deployment now, and keep it stopped until `pdchaos resume`.'
  static override description =
    'Writes a halt file in the state dir on every host of the deployment (or of every deployment of a fleet file). ' +
    'Every pdchaos run acting on it, from any machine, stops within a second, reverts its faults and exits 3 naming ' +
    'who halted it; the host-side reverters take out the faults of a run that cannot (killed, cut off); every new ' +
    'run refuses (exit 2) until `pdchaos resume`. Safe to run twice: the first halt is kept. Starts nothing and ' +
    'probes no service.'
  static override examples = [
    '<%= config.bin %> halt -c pdchaos.yaml --reason "INC-4411: prefill OOMs"',
    '<%= config.bin %> halt --fleet fleet.yaml --reason "all hands: outage"',
    '<%= config.bin %> halt --sim --engine vllm --reason "INC-4412"',
  ]
  static override flags = {
    ...TargetCommand.targetFlags,
    engine: engineFlags.engine,
    reason: Flags.string({summary: 'Why (shown to every run it stops and every run it refuses).'}),
    fleet: Flags.string({
      summary: 'Halt every deployment of this fleet file.',
      exclusive: ['config', 'sim', 'state-dir', 'engine'],
    }),
  }

  async run(): Promise<Record<string, unknown>> {
    const halt = newHalt(whoAmI(), Date.now(), this.flags.reason)
    const outcomes = await onEveryDeployment(
      this.flags,
      h => writeHalt(h, halt),
      l => this.progress(l),
    )
    for (const o of outcomes)
      for (const h of o.hosts ?? [])
        this.log(
          `${o.deployment} on ${h.name} (${h.host}): ${h.result.written ? '' : 'already '}${haltLine(h.result.halt)}`,
        )
    if (!this.jsonEnabled() && outcomes.some(o => o.hosts))
      this.log(
        'runs on it stop within a second and revert their faults (exit 3); armed leases are reverted on the hosts; ' +
          'new runs refuse until `pdchaos resume` with the same target',
      )
    const failed = failedDeployments(outcomes, 'halt')
    if (failed) throw failed
    return {halt, deployments: outcomes}
  }
}
