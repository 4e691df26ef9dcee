import {resolve} from 'node:path'

import {Args, Flags} from '@oclif/core'

import {badInput} from '../errors.js'
import {runLockTtlMs} from '../faults/lease/lease.js'
import {FAULT_NAMES} from '../faults/registry.js'
import {VLLM_FAULT_NAMES} from '../engines/vllm/experiments/registry.js'
import {renderInject} from '../report/inject-text.js'
import {injectFields, runJournal} from '../report/journal-fields.js'
import {runSuite} from '../suite/runner.js'
import {oneScenarioSuite} from '../suite/suite-file.js'
import {faultFlags} from './fault-flags.js'
import {instanceFlags} from './flags.js'
import {engineFlags} from './engine-target.js'
import {TargetCommand} from './target-command.js'
import {pairOf, placementOf} from './target.js'
import {checkRunTtl} from './ttl.js'
import {renderVllmRun, vllmInject} from './vllm-inject.js'
import {vllmFaultOptions} from './vllm-fault-options.js'

/**
 * `pdchaos inject`'s flags and its run: a suite of one scenario (suite-file.ts oneScenarioSuite) under the target,
 * its verdict printed, then its journal. commands/inject.ts holds its help and validates its input.
 */
export abstract class InjectCommand extends TargetCommand<typeof InjectCommand> {
  static override args = {
    fault: Args.string({
      required: true,
      // SGLang's faults and vLLM's (an `engine: vllm` file): a name only one engine has is refused for the other.
      options: [...new Set([...FAULT_NAMES, ...VLLM_FAULT_NAMES()])],
      description: 'The fault to inject.',
    }),
  }
  static override flags = {
    ...TargetCommand.targetFlags,
    ...engineFlags,
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

  /** The one scenario as a suite (--gpu-host needs --gpu). */
  protected injectSuite(params: unknown): ReturnType<typeof oneScenarioSuite> {
    const f = this.flags
    if (f['gpu-host'] !== undefined && (params as {gpu?: unknown}).gpu === undefined) {
      throw badInput(
        `--gpu-host names the host of --gpu, and ${this.args.fault} was given no --gpu`,
        'drop --gpu-host, or add --gpu N',
      )
    }
    return oneScenarioSuite({
      fault: this.args.fault,
      params: params as Record<string, unknown>,
      pins: f.pins,
      ...(f['gpu-host'] === undefined ? {} : {gpuHost: f['gpu-host']}),
      load: {intervalMs: f['load-interval'], promptTokens: f['prompt-tokens'], canaries: f.canaries},
    })
  }

  protected async injectRun(
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

  /** A fault on an `engine: vllm` file (cli/vllm-inject.ts): the plan, or the run and its journal. */
  protected async vllmRun(file: string): Promise<Record<string, unknown>> {
    const f = this.flags
    const fault = this.args.fault
    if (f.hold) throw badInput(`--hold is not built for ${fault} on vLLM`, 'drop --hold')
    const pinsGiven = this.argv.some(a => a === '--pins' || a.startsWith('--pins='))
    const faultOptions = vllmFaultOptions(f, fault, pinsGiven)
    const t0 = Date.now()
    const r = await this.withStopSignal(({signal}) =>
      vllmInject(file, {
        fault,
        faultOptions,
        dryRun: f['dry-run'],
        signal,
        progress: l => this.progress(l),
        ...(this.stopRun ? {stop: this.stopRun} : {}),
        allowProduction: f['allow-production'],
      }),
    ).catch((error: unknown) => {
      this.writeFailureJournal(
        f.journal,
        'inject',
        {name: `${fault} (vllm)`, config: resolve(file), startedAt: t0},
        error,
      )
      throw error
    })
    if (r.kind === 'dry-run') {
      if (!this.jsonEnabled()) this.log(r.lines.join('\n'))
      return {engine: 'vllm', fault, dryRun: true, plan: r.plan}
    }
    if (!this.jsonEnabled()) this.log(renderVllmRun(r.run))
    this.setRunExitCode(r.run)
    const {outputErrors} = await this.writeRunOutputs(r.run, 'inject', {journal: f.journal}, {engine: 'vllm'})
    return {...runJournal(r.run, 'inject', {engine: 'vllm'}), ...(outputErrors ? {outputErrors} : {})}
  }
}
