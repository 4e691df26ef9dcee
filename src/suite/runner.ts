import type {Deployment} from '../deployment/config.js'
import {oneLine, PdError} from '../errors.js'
import {classifyDataPath} from '../faults/mechanisms/data-path.js'
import {discover} from '../discovery/discover.js'
import type {Host} from '../hosts/host.js'
import {type ScenarioRun, scenarioFromRestart, type SuiteRun} from '../model/run.js'
import {coRestart, type ServiceName} from '../restart/co-restart.js'
import {now} from '../workload/recorder.js'
import {runBatch} from './batch.js'
import {evaluateGate} from './gate.js'
import {type Batch, expand, type PlanOptions, planBatches, planConflicts, renderPlanText} from './planner.js'
import {startStopWatch} from './stop.js'
import type {GateSpec, SuiteFile} from './suite-file.js'

/**
 * The suite run: plan the batches (and check them for conflicts) before any injection, print the plan, run the
 * batches in order under the stop conditions, and assemble the SuiteRun the reports render. A stopped run reverts
 * what it holds, runs nothing more and is never resumed: a later run starts from the beginning.
 */

export interface SuiteOptions {
  /** Gate thresholds: from the file, or the defaults when --gate is given. */
  gate?: GateSpec
  say: (line: string) => void
  onPlan?: (lines: string[]) => void
  onPhase?: (phase: string, deadlineAt?: number) => void
  /** Extra stop (SIGINT). */
  signal?: AbortSignal
  runId?: string
  /** Every scenario in a batch of its own (no concurrency): the baseline the batching is measured against. */
  oneAtATime?: boolean
}

export interface SuiteOutcome {
  run: SuiteRun
  plan: string[]
  batches: Array<{index: number; scenarios: string[]; ms: number; floorMs: number}>
  /** Sum over batches of the longest deadline + poll, plus the restarts' health waits (ms). */
  floorMs: number
  notes: string[]
}

export async function runSuite(deployment: Deployment, host: Host, suite: SuiteFile, opts: SuiteOptions): Promise<SuiteOutcome> {
  const say = opts.say
  const startedAt = Date.now()
  const scenarios = expand(suite.scenarios)
  // stall-kv's `auto` follows the data path: the planner must know which mechanism it will be.
  let planOpts: PlanOptions = {}
  if (scenarios.some((s) => s.spec.fault === 'stall-kv' && (s.spec.params.mechanism ?? 'auto') === 'auto')) {
    const report = await discover(deployment, host, {timeoutMs: 5000})
    planOpts = {autoMechanism: classifyDataPath(report.transport).kind === 'tcp' ? 'packet-filter' : 'sigstop'}
  }
  const batches: Batch[] = opts.oneAtATime ? scenarios.map((s, i) => ({index: i + 1, scenarios: [s]})) : planBatches(scenarios, planOpts)
  const conflicts = planConflicts(batches, planOpts)
  if (conflicts.length > 0) throw new PdError(`the batch plan has conflicts: ${conflicts.join('; ')}`, {exit: 5, suggestion: 'report this: the planner must never batch conflicting scenarios'})
  const plan = renderPlanText(batches, planOpts)
  opts.onPlan?.(plan)

  const watch = await startStopWatch(deployment, host, suite.stop, {say})
  const onOuter = () => watch.stop(String(opts.signal?.reason ?? 'interrupted'))
  opts.signal?.addEventListener('abort', onOuter, {once: true})
  for (const n of watch.notes) say(n)
  const runs: ScenarioRun[] = []
  const batchStats: SuiteOutcome['batches'] = []
  let floorMs = 0
  const contract = deployment.watchdog
  // One calibration serves every batch until a restart replaces the processes it measured.
  let calibration: Awaited<ReturnType<typeof runBatch>>['calibration'] | undefined
  try {
    for (const b of batches) {
      if (watch.signal.aborted) break
      const t0 = now()
      const names = b.scenarios.map((s) => s.name)
      opts.onPhase?.(`batch ${b.index}/${batches.length}: ${names.join(', ')}`)
      say(`batch ${b.index}/${batches.length}: ${names.join(', ')}`)
      const only = b.scenarios[0]
      if (only.spec.restart) {
        const r = only.spec.restart
        const restartStart = Date.now()
        watch.setRestarting(true)
        try {
          const res = await coRestart(deployment, host, {
            order: r.services as ServiceName[], healthTimeoutS: r.healthTimeoutSeconds, commandTimeoutS: r.commandTimeoutSeconds,
            canaries: r.canaries, watchS: r.watchSeconds, sampleS: 1, settleS: r.settleSeconds, onProgress: (l) => say(`${only.name}: ${l}`), signal: watch.signal,
          })
          calibration = undefined
          runs.push(scenarioFromRestart(only.name, res, {contract, startedAt: restartStart, finishedAt: Date.now()}))
          const healthWaits = res.steps.reduce((a, s) => a + (s.healthyAfterMs ?? 0), 0)
          // The restart's floor: its health waits, the settle and the watch it was told to hold.
          const restartFloor = healthWaits + (r.settleSeconds + r.watchSeconds) * 1000
          floorMs += restartFloor
          batchStats.push({index: b.index, scenarios: names, ms: Math.round(now() - t0), floorMs: restartFloor})
        } catch (error) {
          runs.push({name: only.name, kind: 'restart', startedAt: restartStart, finishedAt: Date.now(), verdicts: [], pins: [], leases: [], contract, error: oneLine(error)})
        } finally {
          watch.setRestarting(false)
        }
        continue
      }
      try {
        const out = await runBatch(deployment, host, b.scenarios, {
          promptTokens: suite.load.promptTokens, loadIntervalMs: suite.load.intervalMs, canaries: suite.load.canaries, signal: watch.signal,
          calibration, say, onRecorder: (rec) => watch.setRecorder(rec), onDeadline: (label, at) => opts.onPhase?.(`batch ${b.index}/${batches.length}: ${label}`, at),
        })
        runs.push(...out.scenarios)
        calibration = out.calibration
        floorMs += out.floorMs
        batchStats.push({index: b.index, scenarios: names, ms: Math.round(now() - t0), floorMs: out.floorMs})
      } catch (error) {
        // A cleanup that cannot be verified (exit 4) ends the run: nothing more is injected into a host that may be faulted.
        if (error instanceof PdError && error.exitCode === 4) throw error
        const t = Date.now()
        for (const s of b.scenarios) runs.push({name: s.name, kind: 'inject', fault: s.spec.fault, params: s.spec.params, startedAt: t, finishedAt: t, verdicts: [], pins: [], leases: [], contract, error: oneLine(error)})
      }
    }
  } finally {
    opts.signal?.removeEventListener('abort', onOuter)
    await watch.close()
  }
  const run: SuiteRun = {name: suite.name, runId: opts.runId, startedAt, finishedAt: Date.now(), deployment: deployment.name, scenarios: runs}
  const reason = watch.reason()
  if (reason !== undefined) {
    run.stopped = {reason}
    const ran = new Set(runs.map((r) => r.name))
    for (const s of scenarios) if (!ran.has(s.name)) runs.push({name: s.name, kind: s.spec.restart ? 'restart' : 'inject', fault: s.spec.fault, params: s.spec.params, startedAt: run.finishedAt, finishedAt: run.finishedAt, verdicts: [], pins: [], leases: [], contract, error: 'not run: the suite was stopped (a stopped run is never resumed)'})
  }
  if (opts.gate) run.gate = evaluateGate(run, opts.gate)
  return {run, plan, batches: batchStats, floorMs, notes: watch.notes}
}
