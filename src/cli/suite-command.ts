import {resolve} from 'node:path'

import {Args, Flags} from '@oclif/core'

import {badInput} from '../errors.js'
import {runLockTtlMs} from '../faults/lease/lease.js'
import {fleetRunId} from '../model/fleet.js'
import {failedChecks, runCounts, type SuiteRun} from '../model/run.js'
import {renderSuite} from '../report/suite-text.js'
import {loadFleet} from '../suite/fleet-file.js'
import {runSuite} from '../suite/runner.js'
import {defaultSuite, GateSchema, loadSuite, type SuiteFile} from '../suite/suite-file.js'
import {throwIfStopped} from '../util/stop.js'
import {engineFlags, type VllmTarget, vllmTarget} from './engine-target.js'
import {checkFleetOutputs, finishFleet} from './fleet-outputs.js'
import {checkFleet, runFleetHere} from './fleet-run.js'
import {instanceFlags} from './flags.js'
import {Progress} from './progress.js'
import {suiteTwin, type TwinStart} from './sim-flags.js'
import {TargetCommand} from './target-command.js'
import {vllmSuiteRun} from './vllm-suite.js'
import {VLLM_BUILTIN_SUITE, type VllmSuite} from '../engines/vllm/experiments/builtin-suite.js'
import {loadVllmSuite, suiteFileEngine} from '../engines/vllm/experiments/suite-file.js'
import {
  checkScenarioPairs,
  pairOf,
  pairViews,
  placementOf,
  restartTargetsOf,
  scenarioPairViews,
  type Target,
} from './target.js'

/**
 * `pdchaos suite`'s flags and its two runs: one deployment (runSuite under the target, its report and outputs), or a
 * fleet (each deployment its own run, cli/fleet-run.ts). commands/suite.ts holds its help and calls these.
 */
export abstract class SuiteCommand extends TargetCommand<typeof SuiteCommand> {
  static override args = {
    file: Args.string({
      description: 'Suite file (YAML); `pdchaos schema suite` prints its shape. Default: the built-in suite.',
    }),
  }
  static override flags = {
    ...TargetCommand.targetFlags,
    ...engineFlags,
    ...instanceFlags,
    ...TargetCommand.disturbFlags,
    gate: Flags.boolean({
      summary:
        "Make the exit code the release verdict (0 pass, 1 fail); thresholds from the file's gate section or: no " +
        'failed check, no fault left behind.',
    }),
    journal: Flags.string({
      summary: 'Write the run journal (JSON: every pin, lease, verdict and timeline) to this file.',
    }),
    junit: Flags.string({summary: 'Write JUnit XML (one testcase per check and per pin) to this file.'}),
    html: Flags.string({summary: 'Write the single-file HTML report (a timeline per scenario) to this file.'}),
    push: Flags.string({summary: "Push the run's metrics to this Prometheus Pushgateway URL."}),
    'allow-competing-timeout': Flags.boolean({
      summary:
        "As the suite file's allowCompetingTimeout: run a scenario although one of SGLang's own timeouts fires " +
        'before its window closes (its pins are then unverified).',
    }),
    'one-at-a-time': Flags.boolean({
      summary: 'Run every scenario in a batch of its own (no concurrency), e.g. to measure what batching saves.',
    }),
    'run-id': Flags.string({
      summary: 'Name of this run (Pushgateway grouping, reports). Default: derived from the start time.',
    }),
    'sim-deadline': Flags.string({
      summary: 'With --sim, when the suite starts the twin itself: its watchdog deadline in seconds (default 3).',
    }),
    'sim-poll': Flags.string({
      summary:
        'With --sim, when the suite starts the twin itself: its watchdog poll interval in seconds (default 0.5).',
    }),
    label: Flags.string({
      summary: "Name this deployment in a combined report (`pdchaos report`); default: the deployment file's name.",
    }),
    fleet: Flags.string({
      helpGroup: 'FLEET',
      summary:
        'Run every deployment of this fleet file (`pdchaos schema fleet`), each as its own run with its own lock ' +
        'and journal; one combined summary, JUnit, HTML, push and exit code.',
      exclusive: [
        'config',
        'sim',
        'state-dir',
        'journal',
        'label',
        'sim-deadline',
        'sim-poll',
        'prefill-instance',
        'decode-instance',
      ],
    }),
    'max-parallel': Flags.integer({
      helpGroup: 'FLEET',
      min: 1,
      max: 64,
      dependsOn: ['fleet'],
      summary: "Deployments run at once at most (default: the fleet file's maxParallel, 4 unless it says).",
    }),
    'journal-dir': Flags.string({
      helpGroup: 'FLEET',
      dependsOn: ['fleet'],
      summary:
        "Keep each deployment's journal as DIR/NAME.json (`pdchaos report DIR/*.json` rebuilds the combined report).",
    }),
  }

  /** One deployment: the suite file (or the built-in suite) run under the target; the summary, exit code, outputs. */
  protected async runOne(signal: AbortSignal): Promise<Record<string, unknown>> {
    const f = this.flags
    // The suite file is judged before any target is read: a bad file names itself, whatever -c points at.
    const suiteFile = this.args.file ? resolve(this.args.file) : undefined
    const fileEngine = suiteFile ? await suiteFileEngine(suiteFile) : undefined
    const sglangSuite = suiteFile && fileEngine === 'sglang' ? await loadSuite(suiteFile) : undefined
    // An `engine: vllm` file, or the vLLM twin (--sim --engine vllm): the built-in vLLM suite (issue 31).
    let vllmSuite: VllmSuite = VLLM_BUILTIN_SUITE
    const vllm = await vllmTarget(f, {
      ...VLLM_SUITE_TWIN,
      say: l => this.progress(l),
      before: async () => {
        this.checkVllmFlags()
        if (this.args.file) vllmSuite = await loadVllmSuite(resolve(this.args.file))
      },
    })
    if (vllm) return this.runVllm(vllm, vllmSuite, signal)
    if (suiteFile && fileEngine === 'vllm')
      throw badInput(
        `${suiteFile} is a vLLM suite file (engine: vllm), and the target is an SGLang deployment`,
        'run it with --sim --engine vllm, or -c a deployment file with engine: vllm',
      )
    const suite = sglangSuite ?? defaultSuite()
    throwIfStopped(signal, suiteFile ? `reading ${suiteFile}` : 'the start')
    const twin = suiteTwin(f)
    // Every output checked before the run: a long run must not end in a write that was bound to fail.
    this.checkRunOutputs(f)
    const progress = new Progress({json: this.jsonEnabled()})
    const where: Where = {config: f.sim ? undefined : resolve(f.config)}
    const t0 = Date.now()
    try {
      const run = await this.withTarget(this.suiteTarget(suite, suiteFile, twin, progress, where), t =>
        this.runUnder(t, suite, signal, progress, where),
      )
      const twinNote = where.started && this.twinNote(twin, where.started)
      return await this.reportRun(run, {wallMs: Date.now() - t0, progress, where, twinNote: twinNote || undefined})
    } catch (error) {
      const {config, deployment} = where
      this.writeFailureJournal(
        f.journal,
        'suite',
        {name: suite.name, runId: f['run-id'], label: f.label, config, deployment, startedAt: t0},
        error,
      )
      throw error
    } finally {
      progress.stop()
    }
  }

  /** How the suite takes its target: the twin it may start, the checks, the preflight and the run lock. */
  private suiteTarget(suite: SuiteFile, suiteFile: string | undefined, twin: TwinStart, progress: Progress, w: Where) {
    const f = this.flags
    return {
      twin,
      say: progress.say,
      disturb: 'run a suite against',
      check: (d: {name: string}, m: Parameters<typeof checkScenarioPairs>[0]) => {
        w.deployment = d.name
        checkScenarioPairs(m, suite, suiteFile ?? 'the built-in suite', {
          prefill: f['prefill-instance'],
          decode: f['decode-instance'],
        })
      },
      // A co-restart may bring back a dead service; a fault scenario needs all three answering first, on every
      // instance pair the fault scenarios act on.
      preflight: suite.scenarios.some(s => s.fault !== undefined) && ((t: Target) => scenarioPairViews(t, suite)),
      lock: ({deployment: d}: {deployment: {watchdog: {deadlineSeconds: number; pollSeconds: number}}}) => ({
        command: `suite ${suite.name}`,
        ttlMs: runLockTtlMs({...d.watchdog, scenarios: suite.scenarios.length}),
      }),
      pair: {prefill: f['prefill-instance'], decode: f['decode-instance']},
    }
  }

  /** The run itself, on the resolved target. */
  private runUnder(t: Target, suite: SuiteFile, signal: AbortSignal, progress: Progress, w: Where): Promise<SuiteRun> {
    const f = this.flags
    w.started = t.startedTwin
    w.config = t.file
    // Where the file lists several instances of a role, the faults act on one pair of them; a co-restart restarts
    // all.
    const pair = pairOf(t)
    if (pair) {
      const others = suite.scenarios.some(s => s.pair) ? ' (scenarios with pair: act on theirs)' : ''
      progress.say(
        `acting on the instance pair ${pair.prefill} and ${pair.decode}${others}: faults on their hosts, ` +
          `pins to them; a co-restart restarts every instance`,
      )
    }
    const pairs = pairViews(t)
    return runSuite(t.deployment, placementOf(t), suite, {
      restartTargets: order => restartTargetsOf(t, order),
      ...(pairs ? {pairs} : {}),
      gate: suite.gate ?? (f.gate ? GateSchema.parse({}) : undefined),
      say: progress.say,
      signal,
      runId: f['run-id'],
      oneAtATime: f['one-at-a-time'],
      ...(f['allow-competing-timeout'] ? {batch: {allowCompetingTimeout: true}} : {}),
      onPlan: lines =>
        progress.print(['plan (checked: no two scenarios in a batch interfere):', ...lines.map(x => `  ${x}`)]),
      onPhase: progress.setPhase,
    })
  }

  /** What the report says of a twin the suite started. */
  private twinNote(twin: TwinStart, started: string): string {
    return (
      `started the twin in ${started} with a short watchdog (deadline ${twin.deadlineS}s, poll ${twin.pollS}s), ` +
      `a circuit breaker that half-opens after ${twin.cbTimeoutS}s and decode's heartbeat ` +
      `at ${twin.heartbeatIntervalS}s x ${twin.heartbeatMaxFailure} so the suite is quick; ` +
      `it keeps running: \`pdchaos sim down${this.flags['state-dir'] ? ` --state-dir ${started}` : ''}\` stops it`
    )
  }

  /** The summary and the exit code first, then the outputs: a failed write or push is reported, the verdict kept. */
  private async reportRun(
    run: SuiteRun,
    o: {wallMs: number; progress: Progress; where: Where; twinNote?: string},
  ): Promise<Record<string, unknown>> {
    const f = this.flags
    const {wallMs, twinNote} = o
    if (twinNote) run.notes = [...(run.notes ?? []), twinNote]
    o.progress.stop()
    if (!this.jsonEnabled()) this.log(renderSuite(run, {wallMs, twin: twinNote}))
    this.setRunExitCode(run)
    const {pushed, outputErrors} = await this.writeRunOutputs(run, 'suite', f, {
      wallMs,
      ...(f.label ? {label: f.label} : {}),
      config: o.where.config,
    })
    return {
      ...summaryOf(run, this.runId(run)),
      plan: run.plan,
      batches: run.batches,
      floorMs: run.floorMs,
      wallMs,
      notes: run.notes,
      ...(pushed ? {pushed} : {}),
      ...(outputErrors ? {outputErrors} : {}),
      scenarios: run.scenarios.map(({timeline: _t, ...s}) => s),
    }
  }

  /** Flags of the SGLang suite that a vLLM run cannot honour: exit 2 before anything is reached or started. */
  private checkVllmFlags(): void {
    const f = this.flags
    for (const flag of ['sim-deadline', 'sim-poll', 'allow-competing-timeout'] as const)
      if (f[flag] !== undefined && f[flag] !== false)
        throw badInput(
          `--${flag} is SGLang's (a watchdog and its competing timeouts); a vLLM deployment's guard is its KV lease`,
          `drop --${flag}` +
            (flag === 'allow-competing-timeout' ? '' : '; with --sim --engine vllm, --sim-lease sets the lease'),
        )
    if (f['prefill-instance'] !== 0 || f['decode-instance'] !== 0)
      throw badInput(
        'a vLLM deployment file has one prefill and one decode',
        'drop --prefill-instance/--decode-instance',
      )
  }

  /** The built-in vLLM suite on an `engine: vllm` file (cli/vllm-suite.ts), reported and written as SGLang's. */
  private async runVllm(v: VllmTarget, suite: VllmSuite, signal: AbortSignal): Promise<Record<string, unknown>> {
    const f = this.flags
    this.checkRunOutputs(f)
    const progress = new Progress({json: this.jsonEnabled()})
    const where: Where = {config: v.file, ...(v.startedTwin ? {started: v.startedTwin} : {})}
    const t0 = Date.now()
    try {
      const run = await vllmSuiteRun(v.file, suite, {
        signal,
        ...(this.stopRun ? {stop: this.stopRun} : {}),
        say: progress.say,
        onPlan: lines => progress.print(['plan (one scenario at a time):', ...lines.map(x => `  ${x}`)]),
        allowProduction: f['allow-production'],
        ...(f['accept-new-host-key'] ? {acceptNewHostKey: true} : {}),
        ...(f['run-id'] ? {runId: f['run-id']} : {}),
        ...(f.gate ? {gate: GateSchema.parse({})} : {}),
        onDeployment: name => {
          where.deployment = name
        },
      })
      const twinNote =
        v.startedTwin &&
        `started the vLLM twin in ${v.startedTwin} with a short KV lease (kv_lease_duration ${v.leaseS}s) so the ` +
          `suite is quick, and NIXL's READ stall timeout on (${v.xferStallTimeoutS}s; opt-in upstream) as a ` +
          `hardened deployment runs; it keeps running: \`pdchaos sim down --state-dir ${v.startedTwin}\` stops it`
      return await this.reportRun(run, {wallMs: Date.now() - t0, progress, where, twinNote: twinNote || undefined})
    } catch (error) {
      const fields = {name: suite.name, runId: f['run-id'], label: f.label, config: v.file, startedAt: t0}
      this.writeFailureJournal(f.journal, 'suite', {...fields, deployment: where.deployment}, error)
      throw error
    } finally {
      progress.stop()
    }
  }

  protected async runFleet(file: string, signal: AbortSignal): Promise<Record<string, unknown>> {
    const f = this.flags
    if (this.args.file !== undefined)
      throw badInput(
        `with --fleet the suite of each deployment comes from the fleet file, not ${this.args.file}`,
        'name it as `suite:` in the fleet file (for one deployment, or for all)',
      )
    const plan = await loadFleet(resolve(file))
    throwIfStopped(signal, `reading ${resolve(file)}`)
    checkFleet(plan, {allowProduction: f['allow-production'], journalDir: f['journal-dir']})
    checkFleetOutputs(f)
    const progress = new Progress({json: this.jsonEnabled()})
    const runId = f['run-id'] ?? fleetRunId(Date.now())
    try {
      const fleet = await runFleetHere(plan, {
        maxParallel: f['max-parallel'],
        journalDir: f['journal-dir'],
        runId,
        progress,
        pass: {
          gate: f.gate,
          oneAtATime: f['one-at-a-time'],
          allowProduction: f['allow-production'],
          acceptNewHostKey: f['accept-new-host-key'],
        },
      })
      progress.stop()
      return await finishFleet(fleet, {json: this.jsonEnabled(), log: t => this.log(t), files: f, runId})
    } finally {
      progress.stop()
    }
  }
}

/** What the run learns of where it ran, for its report and for the failure journal. */
interface Where {
  config?: string
  deployment?: string
  started?: string
}

/**
 * A vLLM twin the suite starts itself: a short lease (`--sim-lease` overrides) so the suite is quick, and NIXL's READ
 * stall timeout on (nixl PR #2047, off by default upstream), as a deployment hardened against a stalled READ runs:
 * without it a READ stalled while D heartbeats pins P's blocks for as long as D lives (stall-kv's finding; run it on a
 * twin started by `sim up --engine vllm` without --xfer-stall-timeout to see it).
 */
const VLLM_SUITE_TWIN = {leaseS: 4, xferStallTimeoutS: 2}

function summaryOf(run: SuiteRun, runId: string) {
  return {
    name: run.name,
    runId,
    ...(run.engine ? {engine: run.engine} : {}),
    deployment: run.deployment,
    startedAt: run.startedAt,
    finishedAt: run.finishedAt,
    summary: runCounts(run),
    gate: run.gate,
    stopped: run.stopped,
    failedChecks: failedChecks(run).map(x => ({
      scenario: x.scenario,
      check: x.verdict.check,
      subject: x.verdict.subject,
      summary: x.verdict.summary,
    })),
  }
}
