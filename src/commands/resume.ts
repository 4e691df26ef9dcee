import {Flags} from '@oclif/core'

import {failedDeployments, onEveryDeployment, whoAmI} from '../cli/halt-run.js'
import {TargetCommand} from '../cli/target-command.js'
import {engineFlags} from '../cli/engine-target.js'
import {removeHalt} from '../halt/host-halt.js'
import {haltLine} from '../model/halt.js'

export default class Resume extends TargetCommand<typeof Resume> {
  static override summary = 'Lift a `pdchaos halt`: chaos runs may act on the deployment again.'
  static override description =
    'Removes the halt file from the state dir on every host of the deployment (or of every deployment of a fleet ' +
    'file). Runs the halt stopped are not resumed: start them again. Safe to run twice.'
  static override examples = ['<%= config.bin %> resume -c pdchaos.yaml', '<%= config.bin %> resume --fleet fleet.yaml']
  static override flags = {
    ...TargetCommand.targetFlags,
    engine: engineFlags.engine,
    fleet: Flags.string({
      summary: 'Resume every deployment of this fleet file.',
      exclusive: ['config', 'sim', 'state-dir', 'engine'],
    }),
  }

  async run(): Promise<Record<string, unknown>> {
    const outcomes = await onEveryDeployment(
      this.flags,
      h => removeHalt(h),
      l => this.progress(l),
    )
    for (const o of outcomes)
      for (const h of o.hosts ?? [])
        this.log(
          `${o.deployment} on ${h.name} (${h.host}): ` +
            (h.result ? `resumed by ${whoAmI()}; it was ${haltLine(h.result)}` : 'was not halted'),
        )
    const failed = failedDeployments(outcomes, 'resume')
    if (failed) throw failed
    return {resumedBy: whoAmI(), deployments: outcomes}
  }
}
