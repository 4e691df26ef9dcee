import {Flags} from '@oclif/core'

import {BaseCommand} from '../cli/base-command.js'
import {acquireHostLock} from '../faults/lease/host-lock.js'
import {assertMayDisturb} from '../deployment/protection.js'
import {ExitCode} from '../exit-codes.js'
import {targetFlags} from '../cli/flags.js'
import {renderRestart} from '../report/restart-text.js'
import {coRestart, type RestartResult, type ServiceName} from '../restart/co-restart.js'
import {resolveTarget} from '../cli/target.js'
import {writeJournal} from '../report/journal.js'

export default class Restart extends BaseCommand<typeof Restart> {
  static override summary = 'Co-restart prefill → decode → router behind health gates, send canaries, then watch for pins.'
  static override description = 'Each service is restarted by the restart command of the deployment file and must pass its health gate (GET /health = 200; /readiness for the router) before the next starts. Exit 1 when a gate, a canary or the pin watch fails.'
  static override examples = ['<%= config.bin %> restart --sim', '<%= config.bin %> restart -c pdchaos.yaml --service prefill --watch 120']
  static override flags = {
    ...targetFlags,
    service: Flags.option({options: ['prefill', 'decode', 'router'] as const, multiple: true, summary: 'Restart only these services, in the order given (repeatable). Default: prefill, decode, router.'})(),
    'health-timeout': Flags.integer({summary: 'Seconds each service has to become healthy after its restart.', default: 300, min: 1}),
    'command-timeout': Flags.integer({summary: 'Deadline of each restart command, in seconds.', default: 600, min: 1}),
    canaries: Flags.integer({summary: 'Canary requests end to end after the restart.', default: 3, min: 0, max: 100}),
    watch: Flags.integer({summary: 'Seconds of pin watch after the canaries.', default: 60, min: 0, max: 86_400}),
    settle: Flags.integer({summary: 'Seconds to wait after the last health gate before the canaries (one decode heartbeat interval).', default: 5, min: 0, max: 600}),
    sample: Flags.integer({summary: 'Seconds between pin-watch samples.', default: 1, min: 1, max: 60}),
    journal: Flags.string({summary: 'Write the run journal (JSON) to this file.'}),
    'allow-production': Flags.boolean({summary: 'Allow restarting a deployment labelled environment: production.'}),
    'accept-new-host-key': Flags.boolean({summary: 'Trust and record the host key of a host not yet in known_hosts.'}),
  }

  async run(): Promise<RestartResult> {
    const target = await resolveTarget(this.flags, {onProgress: (l) => this.progress(l)})
    try {
      assertMayDisturb(target.deployment, this.flags['allow-production'], 'restart')
      const order = (this.flags.service ?? ['prefill', 'decode', 'router']) as ServiceName[]
      const ttlMs = (order.length * (this.flags['health-timeout'] + this.flags['command-timeout']) + this.flags.watch + 120) * 1000
      const lock = await acquireHostLock(target.host, target.deployment.stateDir, {command: `restart ${order.join(' ')}`, ttlMs})
      let result: RestartResult
      try {
        result = await coRestart(target.deployment, target.host, {
          order, healthTimeoutS: this.flags['health-timeout'], commandTimeoutS: this.flags['command-timeout'],
          canaries: this.flags.canaries, watchS: this.flags.watch, sampleS: this.flags.sample, settleS: this.flags.settle, onProgress: (l) => this.progress(l),
        })
      } finally {
        await lock.release()
      }
      if (this.flags.journal) writeJournal(this.flags.journal, {command: 'restart', deployment: target.deployment.name, result})
      if (!this.jsonEnabled()) this.log(renderRestart(result))
      if (result.verdicts.some((v) => v.verdict === 'fail')) process.exitCode = ExitCode.checkFailed
      return result
    } finally {
      await target.host.close()
    }
  }
}
