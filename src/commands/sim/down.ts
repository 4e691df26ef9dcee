import {BaseCommand} from '../../cli/base-command.js'
import {stateDirFlag} from '../../cli/sim-flags.js'
import {simDown} from '../../cli/twin.js'
import type {SimDownResult} from '../../sim/lifecycle/index.js'

export default class SimDown extends BaseCommand<typeof SimDown> {
  static override summary = "Stop the twin's processes (only its own); safe to run when nothing runs."
  static override examples = ['<%= config.bin %> <%= command.id %> --state-dir /tmp/twin']
  static override flags = {'state-dir': stateDirFlag}

  async run(): Promise<SimDownResult> {
    const result = await simDown(this.flags['state-dir'])
    if (result.stopped.length === 0) this.log(`No twin was running in ${result.stateDir}.`)
    else this.log(`Stopped ${result.stopped.map(s => `${s.service} (pid ${s.pid})`).join(', ')}.`)
    return result
  }
}
