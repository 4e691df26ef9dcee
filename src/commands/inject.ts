import {resolve} from 'node:path'

import {faultParamsFromFlags} from '../cli/fault-flags.js'
import {InjectCommand} from '../cli/inject-command.js'
import {refuseVllmOnlyFault} from '../cli/vllm-fault-options.js'
import {vllmTarget} from '../cli/engine-target.js'
import {parseFaultParams} from '../faults/params.js'
import {FAULT_NAMES, FAULTS, getFault} from '../faults/registry.js'

export default class Inject extends InjectCommand {
  static override summary =
    'One experiment: inject a fault under a lease, drive pins, observe, revert, verify clean, judge the watchdog.'
  // The faults from the registry, so the list never misses one (docs/faults.md has each in full).
  static override description = [
    `Faults: ${Object.entries(FAULTS)
      .map(([name, f]) => `${name} (${f.summary})`)
      .join('; ')}.`,
    'Every fault is installed under a lease on the host that reverts it at its TTL even if pdchaos dies.',
    'A flag that does not apply to the fault is refused (exit 2).',
    'Exit 0 all checks passed, 1 a check failed, 3 interrupted (reverted), 4 cleanup unverified.',
  ].join(' ')
  static override examples = [
    '<%= config.bin %> inject drop-dest-info --sim',
    '<%= config.bin %> inject stall-kv --gpu 2 -c pdchaos.yaml --journal run.json',
    '<%= config.bin %> inject stall-kv --gpu 5 --mechanism sigstop --side decode --dry-run',
    '<%= config.bin %> inject abort-mid-transfer --trials 20 --sim',
  ]
  async run(): Promise<Record<string, unknown>> {
    const f = this.flags
    // engine: vllm (issue 31), or --sim --engine vllm (its twin's file): the fault's vLLM experiment, its flags
    // checked there.
    const vllm = await vllmTarget(f, {
      say: l => this.progress(l),
      before: () => this.checkRunOutputs({journal: f.journal}),
    })
    if (vllm) {
      this.checkRunOutputs({journal: f.journal})
      return this.vllmRun(vllm.file)
    }
    refuseVllmOnlyFault(this.args.fault, FAULT_NAMES)
    // Validated before anything is reached: a flag that does not apply to this fault is bad input.
    const params = parseFaultParams(getFault(this.args.fault), faultParamsFromFlags(f, this.args.fault), 'flags')
    const mode = f['dry-run'] ? 'dry-run' : f.hold ? 'hold' : 'run'
    this.checkRunOutputs({journal: f.journal})
    const suite = this.injectSuite(params)
    const holdMs = (f.ttl ?? 60) * 1000
    // Ctrl-C (or SIGTERM) stops the run in any phase: its faults are reverted through the run's own flow and the
    // verdicts so far, the journal included, are kept (exit 3); a second signal is the lease guard's.
    const t0 = Date.now()
    try {
      return await this.withStopSignal(({signal}) => this.injectRun(mode, suite, holdMs, signal))
    } catch (error) {
      // A run that reached no verdict (an unreachable target) still leaves its journal, as suite's does.
      const config = f.sim ? {} : {config: resolve(f.config)}
      this.writeFailureJournal(f.journal, 'inject', {name: suite.name, ...config, startedAt: t0}, error)
      throw error
    }
  }
}
