import {resolve} from 'node:path'

import {Args, Flags} from '@oclif/core'

import {faultFlags, faultParamsFromFlags} from '../cli/fault-flags.js'
import {TargetCommand} from '../cli/target-command.js'
import {instanceFlags} from '../cli/flags.js'
import {pairOf, placementOf} from '../cli/target.js'
import {checkRunTtl} from '../cli/ttl.js'
import {runLockTtlMs} from '../faults/lease/lease.js'
import {badInput} from '../errors.js'
import {parseFaultParams} from '../faults/params.js'
import {FAULT_NAMES, getFault} from '../faults/registry.js'
import {renderInject} from '../report/inject-text.js'
import {injectFields, runJournal} from '../report/journal-fields.js'
import {runSuite} from '../suite/runner.js'
import {oneScenarioSuite} from '../suite/suite-file.js'

export default class Inject extends TargetCommand<typeof Inject> {
  static override summary =
    'One experiment: inject a fault under a lease, drive pins, observe, revert, verify clean, judge the watchdog.'
  static override description = [
    'Faults: drop-dest-info (decode destination info never reaches prefill; pins sit in Bootstrapping),',
    "stall-kv --gpu N (one rank's KV transfer stalls; pins sit in Transferring),",
    'abort-mid-transfer (aborts fired inside the transfer window, N trials).',
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
  static override args = {
    fault: Args.string({required: true, options: FAULT_NAMES, description: 'The fault to inject.'}),
  }
  static override flags = {
    ...TargetCommand.targetFlags,
    ...instanceFlags,
    ...TargetCommand.disturbFlags,
    ...faultFlags(),
    pins: Flags.integer({summary: 'Pinned requests to create.', default: 3, min: 1, max: 10_000}),
    'gpu-host': Flags.string({
      summary:
        "The host (its name in the deployment file's hosts:) whose GPU --gpu names, where ranks on several hosts " +
        'use that index (the node ranks of a multi-node instance).',
      helpValue: 'NAME',
    }),
    'pin-path': Flags.option({
      options: ['direct', 'router'] as const,
      default: 'direct' as const,
      summary:
        'direct: each pin is one prefill request, sent to prefill and decode once (the verdict is about the ' +
        'watchdog). router: as a client sends it; a retrying gateway re-sends an evicted pin, so the verdicts then ' +
        'describe the router, not the watchdog.',
    })(),
    'pin-interval': Flags.integer({
      summary:
        "Milliseconds between pin sends; spacing keeps each pin's queue entry close to its send time (0: all at once).",
      default: 20,
      min: 0,
      max: 10_000,
    }),
    hold: Flags.boolean({
      summary: 'Inject, verify, and leave the fault in place until its lease expires (explore by hand).',
      exclusive: ['dry-run'],
    }),
    'dry-run': Flags.boolean({summary: 'Show the plan and run only its read-only probes; change nothing.'}),
    ttl: Flags.integer({
      summary:
        'Lease TTL in seconds (default: deadline + poll + hold + margin; at most 3600). A run refuses one shorter ' +
        'than the watchdog deadline + poll + margin.',
      min: 1,
      max: 3600,
    }),
    'prompt-tokens': Flags.integer({
      summary: 'Prompt length of every request, in tokens.',
      default: 128,
      min: 1,
      max: 131_072,
    }),
    'load-interval': Flags.integer({
      summary: 'Milliseconds between steady-load requests (0: no load).',
      default: 500,
      min: 0,
      max: 60_000,
    }),
    canaries: Flags.integer({summary: 'Requests after the revert that must succeed.', default: 3, min: 1, max: 100}),
    journal: Flags.string({summary: 'Write the run journal (JSON) to this file.'}),
    'allow-competing-timeout': Flags.boolean({
      summary:
        "Run although one of SGLang's own timeouts (bootstrap, waiting, heartbeat), read from the servers, fires " +
        "before the watchdog's window closes; its pins are then unverified, never passed. Without it such a run is " +
        'refused (exit 2).',
    }),
  }

  async run(): Promise<Record<string, unknown>> {
    const f = this.flags
    // Validated before anything is reached: a flag that does not apply to this fault is bad input.
    const params = parseFaultParams(getFault(this.args.fault), faultParamsFromFlags(f, this.args.fault), 'flags')
    const mode = f['dry-run'] ? 'dry-run' : f.hold ? 'hold' : 'run'
    this.checkRunOutputs({journal: f.journal})
    if (f['gpu-host'] !== undefined && (params as {gpu?: unknown}).gpu === undefined) {
      throw badInput(
        `--gpu-host names the host of --gpu, and ${this.args.fault} was given no --gpu`,
        'drop --gpu-host, or add --gpu N',
      )
    }
    const suite = oneScenarioSuite({
      fault: this.args.fault,
      params,
      pins: f.pins,
      ...(f['gpu-host'] === undefined ? {} : {gpuHost: f['gpu-host']}),
      load: {intervalMs: f['load-interval'], promptTokens: f['prompt-tokens'], canaries: f.canaries},
    })
    const holdMs = (f.ttl ?? 60) * 1000
    // Ctrl-C (or SIGTERM) stops the run in any phase: its faults are reverted through the run's own flow and the
    // verdicts so far, the journal included, are kept (exit 3); a second signal is the lease guard's.
    const t0 = Date.now()
    try {
      return await this.withStopSignal(({signal}) => this.injectRun(mode, suite, holdMs, signal))
    } catch (error) {
      // A run that reached no verdict (an unreachable target) still leaves its journal, as suite's does.
      this.writeFailureJournal(
        f.journal,
        'inject',
        {name: suite.name, ...(f.sim ? {} : {config: resolve(f.config)}), startedAt: t0},
        error,
      )
      throw error
    }
  }

  private async injectRun(
    mode: 'run' | 'hold' | 'dry-run',
    suite: ReturnType<typeof oneScenarioSuite>,
    holdMs: number,
    signal: AbortSignal,
  ): Promise<Record<string, unknown>> {
    const f = this.flags
    let pair: ReturnType<typeof pairOf>
    const run = await this.withTarget(
      {
        disturb: 'inject a fault into',
        pair: {prefill: f['prefill-instance'], decode: f['decode-instance']},
        check: d => checkRunTtl(f.ttl, d.watchdog, mode),
        preflight: true,
        lock:
          mode === 'dry-run'
            ? undefined
            : ({deployment: d}) => ({
                command: `inject ${this.args.fault}${f.hold ? ' --hold' : ''}`,
                untilExpiry: f.hold,
                ttlMs: runLockTtlMs({...d.watchdog, scenarios: 1, ...(f.hold ? {holdMs} : {})}),
              }),
      },
      t => {
        // Where the file lists several instances of a role, the run acts on one pair of them and says which.
        pair = pairOf(t)
        if (pair) {
          this.progress(
            `acting on the instance pair ${pair.prefill} and ${pair.decode}: faults on their hosts, pins to them`,
          )
        }
        return runSuite(t.deployment, placementOf(t), suite, {
          say: l => this.progress(l),
          signal,
          batch: {
            mode,
            pinPacing: {burst: 1, gapMs: f['pin-interval']},
            pinPath: f['pin-path'],
            paramsSource: 'flags',
            planErrors: 'throw',
            allowCompetingTimeout: f['allow-competing-timeout'],
            ...(f.ttl === undefined ? {} : {ttlMs: f.ttl * 1000}),
          },
        })
      },
    )
    const fields = {...injectFields(run), ...(pair ? {pair} : {})}
    // The verdict first (printed, exit code decided), then the journal: a failed write cannot lose it.
    if (!this.jsonEnabled()) this.log(renderInject(run.scenarios[0]!))
    this.setRunExitCode(run)
    const {outputErrors} = await this.writeRunOutputs(run, 'inject', {journal: f.journal}, fields)
    const {scenarios: _s, ...rest} = runJournal(run, 'inject', fields) as {scenarios: unknown}
    return {...rest, scenarios: run.scenarios.map(({timeline: _t, ...s}) => s), ...(outputErrors ? {outputErrors} : {})}
  }
}
