import {Args, Flags} from '@oclif/core'

import {BaseCommand} from '../../cli/base-command.js'
import {seconds, stateDirFlag} from '../../cli/sim-flags.js'
import {simRestart} from '../../cli/twin.js'
import type {SimRestartResult} from '../../sim/lifecycle/index.js'

export default class SimRestart extends BaseCommand<typeof SimRestart> {
  static override summary = "Restart one of the twin's services as an operator's restart command would."
  static override examples = ['<%= config.bin %> <%= command.id %> prefill --state-dir /tmp/twin']
  static override args = {
    service: Args.string({
      required: true,
      options: ['prefill', 'decode', 'router'],
      description: 'The service to restart.',
    }),
  }

  static override flags = {
    'state-dir': stateDirFlag,
    wait: Flags.string({summary: 'Deadline in seconds for the service to become healthy again.', default: '30'}),
  }

  async run(): Promise<SimRestartResult> {
    const spinner = this.spinner(`Restarting ${this.args.service}`)
    let r: SimRestartResult
    try {
      r = await simRestart(this.flags['state-dir'], this.args.service, seconds('--wait', this.flags.wait))
    } finally {
      spinner?.stop()
    }
    this.log(
      `${r.service} restarted: pid ${r.previousPid ?? '-'} -> ${r.pid}, healthy ` +
        `in ${(r.healthyMs / 1000).toFixed(1)} s`,
    )
    if (r.rankPorts.length > 0)
      this.log(`  rank ZMQ ports: ${r.rankPorts.map(p => `TP${p.tpRank}=${p.zmqPort}`).join(' ')}`)
    return r
  }
}
