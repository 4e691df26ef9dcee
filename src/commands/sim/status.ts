import {BaseCommand} from '../../cli/base-command.js'
import {stateDirFlag} from '../../cli/sim-flags.js'
import {simStatus} from '../../cli/twin.js'
import type {SimStatusResult} from '../../sim/lifecycle/index.js'

export default class SimStatus extends BaseCommand<typeof SimStatus> {
  static override summary = "The twin's own view: which services run, pids, health, ports, ranks and GPUs."
  static override examples = ['<%= config.bin %> <%= command.id %> --state-dir /tmp/twin --json']
  static override flags = {'state-dir': stateDirFlag}

  async run(): Promise<SimStatusResult> {
    const s = await simStatus(this.flags['state-dir'])
    if (!s.running) {
      this.log(`No twin is running in ${s.stateDir}.`)
      return s
    }
    for (const svc of s.services) {
      const state = svc.running ? `pid ${svc.pid}, health ${svc.health || 'no answer'}` : 'stopped'
      this.log(`${svc.service.padEnd(8)} ${svc.url.padEnd(24)} ${state}`)
      for (const r of svc.ranks) {
        this.log(
          `  TP${r.tpRank} ` +
            `pid ${r.pid}${r.alive ? '' : ' (gone)'}${r.gpu === undefined ? '' : `, GPU ${r.gpu}`}` +
            `${r.zmqPort ? `, zmq ${r.zmqPort}` : ''}`,
        )
      }
    }
    return s
  }
}
