import type {VllmDeployment} from '../deployment-file.js'
import {discoverVllm, type VllmStatusReport} from '../discover.js'
import {oneLine, PdError} from '../../../errors.js'
import {ExitCode} from '../../../exit-codes.js'
import type {Host} from '../../../hosts/host.js'
import type {ScenarioRun, SuiteRun} from '../../../model/run.js'
import {vllmCoRestart, vllmRestartPlan, type VllmRestartOptions} from '../../../restart/vllm-co-restart.js'
import {evaluateGate} from '../../../suite/gate.js'
import {restartScenario} from '../../../suite/runner.js'
import type {GateSpec} from '../../../suite/suite-file.js'
import {abortable} from '../../../util/stop.js'
import type {VllmSuite, VllmSuiteEntry} from './builtin-suite.js'
import type {VllmContext, VllmExperiment, VllmPrepared} from './experiment.js'
import {getVllmExperiment} from './registry.js'

/**
 * A vLLM suite run (issue 31): the host opened once by the caller, P and D discovered once, every entry's experiment
 * prepared first (reads only: the plan is printed before anything is sent), then each run in order, then the
 * co-restart; the scenarios collected into one run (model/run.ts) with `engine: vllm`, which the suite command renders
 * and writes as SGLang's (text, journal, JUnit, HTML, Pushgateway). An entry that cannot be planned or run is recorded
 * as that scenario's error and the others run; a stop (SIGINT, a halt) ends the run where it is, its scenarios so far
 * kept and the run marked stopped (exit 3).
 */

export interface VllmSuiteOptions {
  /** The deployment file's path, as given. */
  file: string
  signal: AbortSignal
  progress: (line: string) => void
  /** The plan, before anything is sent. */
  onPlan?: (lines: string[]) => void
  runId?: string
  gate?: GateSpec
  /** The co-restart's deadlines and canaries. */
  restart: Omit<VllmRestartOptions, 'signal' | 'onProgress'>
  /** The experiments by fault name (default: the registry's). */
  experiments?: Record<string, VllmExperiment>
}

interface Planned {
  entry: VllmSuiteEntry
  name: string
  prepared?: Extract<VllmPrepared, {lines: string[]}>
  error?: string
}

export async function runVllmSuite(
  d: VllmDeployment,
  host: Host,
  suite: VllmSuite,
  o: VllmSuiteOptions,
): Promise<SuiteRun> {
  const startedAt = Date.now()
  const timeoutMs = (d.probeTimeoutSeconds ?? 5) * 1000
  const discovery = await abortable(discoverVllm(d, host, {timeoutMs}), o.signal, 'discovery')
  const p = discovery.servers.find(s => s.role === 'prefill')!
  if (!p.health.ok) throw new PdError(`prefill is not healthy: ${p.health.detail}`, {exit: ExitCode.unreachable})
  const ctx: VllmContext = {file: o.file, deployment: d, host, discovery, signal: o.signal, progress: o.progress}
  return runVllmSuiteIn(ctx, suite, o, startedAt)
}

/** The run once P and D are discovered: plan every entry, print the plan, run each, then the co-restart. */
export async function runVllmSuiteIn(
  ctx: VllmContext,
  suite: VllmSuite,
  o: VllmSuiteOptions,
  startedAt = Date.now(),
): Promise<SuiteRun> {
  const {deployment: d, host, discovery} = ctx
  const planned = await planEntries(suite, ctx, o.experiments)
  const plan = planLines(d, suite, planned, o)
  o.onPlan?.(plan)
  const run: SuiteRun = {
    name: suite.name,
    ...(o.runId ? {runId: o.runId} : {}),
    engine: 'vllm',
    startedAt,
    finishedAt: startedAt,
    deployment: d.name ?? 'vllm',
    target: d.host.kind === 'ssh' ? `ssh ${d.host.alias ?? d.host.hostname ?? ''}`.trim() : d.host.kind,
    scenarios: [],
    plan,
    batches: [],
    notes: ['engine: vllm', ...leaseNotes(discovery)],
  }
  const contract = leaseContract(discovery)
  for (const x of planned) {
    if (o.signal.aborted) break
    await timed(run, () => runEntry(x, contract, o))
  }
  if (suite.coRestart && !o.signal.aborted) await timed(run, () => runCoRestart(d, host, contract, o))
  if (o.signal.aborted) run.stopped = {reason: stopReason(o.signal)}
  run.finishedAt = Date.now()
  if (o.gate) run.gate = evaluateGate(run, o.gate)
  return run
}

/** Each entry's experiment prepared (reads only); one that refuses or cannot be read is that scenario's error. */
async function planEntries(
  suite: VllmSuite,
  ctx: VllmContext,
  experiments?: Record<string, VllmExperiment>,
): Promise<Planned[]> {
  const out: Planned[] = []
  for (const entry of suite.entries) {
    const name = `${entry.fault} (vllm)`
    try {
      const experiment = experiments ? experiments[entry.fault] : getVllmExperiment(entry.fault)
      if (!experiment) throw new Error(`${entry.fault} is not a registered vLLM experiment`)
      const prepared = await experiment.prepare(ctx, entry.options)
      if ('refusal' in prepared) out.push({entry, name, error: `${prepared.refusal} (${prepared.hint})`})
      else out.push({entry, name, prepared})
    } catch (error) {
      if (ctx.signal.aborted) throw error
      out.push({entry, name, error: `could not be planned: ${oneLine(error)}`})
    }
  }
  return out
}

function planLines(d: VllmDeployment, suite: VllmSuite, planned: Planned[], o: VllmSuiteOptions): string[] {
  const lines = planned.flatMap((x, i) => [
    `${i + 1}. ${x.name}${x.error ? `: NOT RUN: ${x.error}` : ''}`,
    ...(x.prepared?.lines ?? []).map(l => `   ${l}`),
  ])
  if (suite.coRestart)
    lines.push(`${planned.length + 1}. co-restart (vllm)`, ...vllmRestartPlan(d, {...o.restart}).map(l => `   ${l}`))
  return lines
}

/** One step of the run: its scenarios added, and its own batch (one scenario at a time) with its duration. */
async function timed(run: SuiteRun, step: () => Promise<ScenarioRun>): Promise<void> {
  const t0 = Date.now()
  const s = await step()
  run.scenarios.push(s)
  run.batches!.push({index: run.batches!.length, scenarios: [s.name], ms: Date.now() - t0, floorMs: 0})
}

async function runEntry(x: Planned, contract: ScenarioRun['contract'], o: VllmSuiteOptions): Promise<ScenarioRun> {
  const t0 = Date.now()
  if (!x.prepared) return errored(x, contract, t0, x.error ?? 'not planned')
  o.progress(`${x.name}: running`)
  try {
    return await x.prepared.run()
  } catch (error) {
    return errored(x, contract, t0, oneLine(error))
  }
}

async function runCoRestart(
  d: VllmDeployment,
  host: Host,
  contract: ScenarioRun['contract'],
  o: VllmSuiteOptions,
): Promise<ScenarioRun> {
  const name = 'co-restart (vllm)'
  const startedAt = Date.now()
  try {
    const res = await vllmCoRestart(d, host, {
      ...o.restart,
      signal: o.signal,
      onProgress: l => o.progress(`${name}: ${l}`),
    })
    return {
      ...restartScenario(name, res, {contract, startedAt, finishedAt: Date.now()}),
      description: 'engine vllm: prefill, decode, then the proxy behind their health gates; canaries through the proxy',
    }
  } catch (error) {
    return {
      ...restartScenario(name, emptyRestart(), {contract, startedAt, finishedAt: Date.now()}),
      error: oneLine(error),
    }
  }
}

const emptyRestart = (): Parameters<typeof restartScenario>[1] => ({
  steps: [],
  totalMs: 0,
  canaries: [],
  watch: {samples: [], requests: []},
  verdicts: [],
  observations: [],
})

function errored(x: Planned, contract: ScenarioRun['contract'], t: number, error: string): ScenarioRun {
  return {
    name: x.name,
    kind: 'inject',
    fault: x.entry.fault,
    params: {...x.entry.options},
    startedAt: t,
    finishedAt: Date.now(),
    verdicts: [],
    pins: [],
    leases: [],
    contract,
    error,
    notes: ['engine: vllm'],
  }
}

/** The guard a vLLM scenario is judged by: P's KV lease as discovery read it (its duration as the deadline). */
function leaseContract(r: VllmStatusReport): ScenarioRun['contract'] {
  const lease = r.servers.find(s => s.role === 'prefill')?.lease
  return {scope: 'all', deadlineSeconds: lease?.leaseDurationS.value ?? 0, pollSeconds: 1}
}

function leaseNotes(r: VllmStatusReport): string[] {
  const lease = r.servers.find(s => s.role === 'prefill')?.lease
  if (!lease) return ["P's lease settings were not read"]
  const d = lease.leaseDurationS
  return [`P's kv_lease_duration ${d.value} s (${d.source}: ${d.detail})`]
}

const stopReason = (signal: AbortSignal): string =>
  typeof signal.reason === 'string'
    ? signal.reason
    : signal.reason instanceof Error
      ? signal.reason.message
      : 'interrupted'
