import {Flags} from '@oclif/core'

import {checkOutputFile} from '../cli/outputs.js'
import {TargetCommand} from '../cli/target-command.js'
import {restartTargetsOf} from '../cli/target.js'
import {badInput, oneLine} from '../errors.js'
import {ExitCode} from '../exit-codes.js'
import {renderRestart} from '../report/restart-text.js'
import {coRestart, type RestartResult, type ServiceName} from '../restart/co-restart.js'
import {writeJournal} from '../report/journal.js'

export default class Restart extends TargetCommand<typeof Restart> {
  static override summary = 'Co-restart prefill → decode → router behind health gates, send canaries, then watch for pins.'
  static override description = 'Each service is restarted by the restart command of the deployment file and must pass its health gate (GET /health = 200; /readiness for the router) before the next starts. Where the deployment file lists several instances of a role, each is restarted behind its own gate, on its own host, in the file\'s order (its restartOrder: when it states one). Exit 1 when a gate, a canary or the pin watch fails.'
  static override examples = ['<%= config.bin %> restart --sim', '<%= config.bin %> restart -c pdchaos.yaml --service prefill --watch 120']
  static override flags = {
    ...TargetCommand.targetFlags,
    ...TargetCommand.disturbFlags,
    service: Flags.option({options: ['prefill', 'decode', 'router'] as const, multiple: true, summary: 'Restart only these services, in the order given (repeatable). Default: prefill, decode, router.'})(),
    'health-timeout': Flags.integer({summary: 'Seconds each service has to become healthy after its restart.', default: 300, min: 1, max: 3600}),
    'command-timeout': Flags.integer({summary: 'Deadline of each restart command, in seconds.', default: 600, min: 1, max: 3600}),
    canaries: Flags.integer({summary: 'Canary requests end to end after the restart.', default: 3, min: 0, max: 100}),
    watch: Flags.integer({summary: 'Seconds of pin watch after the canaries.', default: 60, min: 0, max: 86_400}),
    settle: Flags.integer({summary: 'Seconds to wait after the last health gate before the canaries (one decode heartbeat interval).', default: 5, min: 0, max: 600}),
    sample: Flags.integer({summary: 'Seconds between pin-watch samples.', default: 1, min: 1, max: 60}),
    journal: Flags.string({summary: 'Write the run journal (JSON) to this file.'}),
  }

  async run(): Promise<RestartResult> {
    const f = this.flags
    // --service picks roles in the order given; by default the file's order (restartOrder:, else prefill, decode, router).
    const order = (f.service ?? ['prefill', 'decode', 'router']) as ServiceName[]
    // A service named twice would be restarted twice behind two gates: a typo, not a plan.
    const twice = order.find((s, i) => order.indexOf(s) !== i)
    if (twice) {
      throw badInput(`--service ${twice} is given twice`,
        `name each service once, in the order to restart them: --service ${[...new Set(order)].join(' --service ')}`)
    }
    if (f.journal !== undefined) checkOutputFile('--journal', f.journal)
    let deployment = ''
    // Ctrl-C (or SIGTERM) in any phase ends the run within a second, exit 3: a restart command under way is killed
    // (its process group), a health gate or the watch stops waiting, and the message says what was restarted.
    const result = await this.withStopSignal(({signal}) => this.withTarget({
      disturb: 'restart',
      lock: (t) => ({command: `restart ${order.join(' ')}`, ttlMs: (restartTargetsOf(t, order).length * (f['health-timeout'] + f['command-timeout']) + f.watch + 120) * 1000}),
    }, (t) => {
      deployment = t.deployment.name
      // Every instance, where the file lists several: in its restartOrder:, else prefill[0], prefill[1], … decode's, the router.
      return coRestart(t.deployment, t.host, {
        targets: restartTargetsOf(t, order), order, healthTimeoutS: f['health-timeout'], commandTimeoutS: f['command-timeout'],
        canaries: f.canaries, watchS: f.watch, sampleS: f.sample, settleS: f.settle, onProgress: (l) => this.progress(l),
        signal,
      })
    }))
    if (!this.jsonEnabled()) this.log(renderRestart(result))
    if (result.verdicts.some((v) => v.verdict === 'fail')) process.exitCode = ExitCode.checkFailed
    // After the verdict: a journal that cannot be written is reported, the verdict and its exit code kept.
    if (f.journal) {
      try {
        writeJournal(f.journal, {command: 'restart', deployment, result})
      } catch (error) {
        process.stderr.write(`Error: could not write the journal to ${f.journal}: ${oneLine(error)} (the verdict above stands)\n`)
        return {...result, outputErrors: [`could not write the journal to ${f.journal}: ${oneLine(error)}`]} as RestartResult
      }
    }
    return result
  }
}
