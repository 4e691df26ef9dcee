import {BaseCommand} from '../../cli/base-command.js'
import {simUpFlags, simUpOptions} from '../../cli/sim-up-flags.js'
import {simUpLines} from '../../cli/sim-up-text.js'
import {simUp} from '../../cli/twin.js'
import {vllmSimUp} from '../../cli/vllm-twin.js'
import {vllmSimDir} from '../../cli/engine-target.js'
import type {SimUpResult} from '../../sim/lifecycle/index.js'

export default class SimUp extends BaseCommand<typeof SimUp> {
  static override summary = 'Start the twin: an SGLang-like PD deployment (prefill, decode, router) on this machine.'
  static override description =
    'Starts the services detached (they outlive this command), waits until they are healthy, prints the endpoints ' +
    'and writes a deployment file for pdchaos into the state dir.'

  static override examples = [
    '<%= config.bin %> <%= command.id %>',
    '<%= config.bin %> <%= command.id %> --deadline 30 --poll 1 --bug late-evict --state-dir /tmp/twin --json',
  ]

  static override flags = simUpFlags

  async run(): Promise<Omit<SimUpResult, 'config'>> {
    // The vLLM twin's own default state dir (the SGLang twin's + -vllm), where `--sim --engine vllm` looks for it.
    const dirGiven = this.argv.some(a => a === '--state-dir' || a.startsWith('--state-dir='))
    if (this.flags.engine === 'vllm')
      return (await vllmSimUp(dirGiven ? this.flags : {...this.flags, 'state-dir': vllmSimDir()}, l =>
        this.log(l),
      )) as unknown as Omit<SimUpResult, 'config'>
    const spinner = this.spinner('Starting the twin')
    let result: SimUpResult
    try {
      result = await simUp(simUpOptions(this.flags))
    } finally {
      spinner?.stop()
    }
    for (const line of simUpLines(result)) this.log(line)
    const {config, ...out} = result
    return out
  }
}
