import type promClient from 'prom-client'
import type {Registry} from 'prom-client'
import {oneLine, PdError} from '../errors.js'
import {ExitCode} from '../exit-codes.js'
import {lazyRequire} from '../util/lazy-require.js'
import type {FleetRun} from '../model/fleet.js'
import {scenarioMargins, smallestMargins} from '../model/margins.js'
import {faultsLeftBehind, runIdOf, runPassed, type SuiteRun} from '../model/run.js'

// prom-client only when metrics are pushed (src/util/lazy-require.ts).
const prom = lazyRequire<typeof promClient>('prom-client')

/**
 * The run's numbers pushed to a Prometheus Pushgateway, for dashboards and alerts across nights: eviction seconds
 * (a histogram per scenario and fault), the smallest margin of an eviction to each bound, pass/fail per check and
 * subject, abort trials in the transfer window, faults left
 * behind, run duration, run passed.
 * One grouping per run (job + run_id), replaced as a whole (PUT), so a re-push never mixes two runs.
 */

export interface PushOptions {
  jobName?: string
  groupings?: Record<string, string>
  /** Deadline of the whole exchange with the gateway, ms. */
  timeoutMs?: number
}

export interface PushResult {
  url: string
  jobName: string
  groupings: Record<string, string>
  /** Metric series pushed (a histogram counts once per label set). */
  series: number
}

/** Around the watchdog deadlines people set (SGLang's waiting timeout is minutes by default; test rigs use seconds). */
export const EVICTION_BUCKETS = [0.5, 1, 2, 3, 5, 10, 15, 20, 30, 45, 60, 90, 120, 180, 300, 450, 600, 900]

/**
 * The standard buckets plus each scenario's own deadline and deadline + poll, so pass/fail edges are exact bucket
 * bounds.
 */
export function evictionBuckets(run: SuiteRun): number[] {
  const set = new Set(EVICTION_BUCKETS)
  for (const s of run.scenarios) {
    if (s.contract.deadlineSeconds > 0) set.add(s.contract.deadlineSeconds)
    if (s.contract.deadlineSeconds + s.contract.pollSeconds > 0)
      set.add(s.contract.deadlineSeconds + s.contract.pollSeconds)
  }
  return [...set].filter(b => Number.isFinite(b) && b > 0).sort((a, b) => a - b)
}

/** The run as a registry of metrics (exported for tests and for a `--metrics-file` one day). */
export function runRegistry(run: SuiteRun): {registry: Registry; series: number} {
  const {registry, series, add} = metricsFor([], evictionBuckets(run))
  return {registry, series: series + add(run, {})}
}

/**
 * A fleet as one registry: every run's metrics with a `deployment` label, and per deployment its exit code and whether
 * it was reached (an unreachable one has no run: its run_passed is 0), and the fleet's exit code.
 */
export function fleetRegistry(fleet: FleetRun): {registry: Registry; series: number} {
  const buckets = [...new Set(fleet.members.flatMap(m => (m.run ? evictionBuckets(m.run) : EVICTION_BUCKETS)))].sort(
    (a, b) => a - b,
  )
  const {registry, series: base, add, passed} = metricsFor(['deployment'], buckets)
  const {Gauge} = prom()
  const exit = new Gauge({
    name: 'pdchaos_deployment_exit_code',
    help: "The exit code the deployment's own run ended with (README: 0 passed ... 5 unreachable).",
    labelNames: ['deployment'] as const,
    registers: [registry],
  })
  const reached = new Gauge({
    name: 'pdchaos_deployment_reachable',
    help: "1 when the deployment's run reached it, 0 when it was unreachable or never ran.",
    labelNames: ['deployment'] as const,
    registers: [registry],
  })
  const fleetExit = new Gauge({
    name: 'pdchaos_fleet_exit_code',
    help: "The fleet's combined exit code.",
    registers: [registry],
  })
  let series = base + 1
  for (const m of fleet.members) {
    const labels = {deployment: m.name}
    if (m.run) series += add(m.run, labels)
    else {
      passed.set(labels, 0)
      series++
    }
    exit.set(labels, m.exitCode)
    reached.set(labels, m.run ? 1 : 0)
    series += 2
  }
  fleetExit.set(fleet.exitCode)
  return {registry, series}
}

/** The metrics of runs, each labelled with `extra` label names (none for a single run, as dashboards have it). */
function metricsFor(extra: string[], buckets: number[]) {
  const {Registry} = prom()
  const registry = new Registry()
  const names = (...own: string[]) => [...extra, ...own]
  // Registered in this order, which is the order of the pushed text.
  const m: RunMetrics = {...scenarioMetrics(registry, names, buckets), ...runMetrics(registry, names)}
  /** Add one run's metrics under these labels; returns the series it added. */
  const add = (run: SuiteRun, labels: Record<string, string>): number => addRun(m, run, labels)
  return {registry, series: 0, add, passed: m.passed}
}

type Names = (...own: string[]) => string[]
type RunMetrics = ReturnType<typeof scenarioMetrics> & ReturnType<typeof runMetrics>

/** Per scenario: eviction seconds, the smallest margins, and pass/unverified per check and subject. */
function scenarioMetrics(registry: Registry, names: Names, buckets: number[]) {
  const {Gauge, Histogram} = prom()
  const eviction = new Histogram({
    name: 'pdchaos_eviction_seconds',
    help: "Seconds from a pin's send to its eviction by the watchdog.",
    labelNames: names('scenario', 'fault'),
    buckets,
    registers: [registry],
  })
  // Across nights a dashboard shows this falling long before a pin fails (docs/metrics.md).
  const margin = new Gauge({
    name: 'pdchaos_eviction_margin_seconds',
    help:
      'The smallest margin of the scenario\'s evictions to a bound: bound="deadline" (eviction - deadline),' +
      ' bound="deadline_plus_poll" (deadline + poll - eviction); negative: outside.',
    labelNames: names('scenario', 'fault', 'bound'),
    registers: [registry],
  })
  const checkPassed = new Gauge({
    name: 'pdchaos_check_passed',
    help: '1 when the check passed for this subject, 0 when it failed or is unverified.',
    labelNames: names('scenario', 'check', 'subject'),
    registers: [registry],
  })
  const checkUnverified = new Gauge({
    name: 'pdchaos_check_unverified',
    help: '1 when the check lacked its data for this subject (neither passed nor failed), else 0.',
    labelNames: names('scenario', 'check', 'subject'),
    registers: [registry],
  })
  return {eviction, margin, checkPassed, checkUnverified}
}

/** Abort coverage per scenario, then the run's own: faults left behind, duration, passed. */
function runMetrics(registry: Registry, names: Names) {
  const {Gauge} = prom()
  // Abort coverage: how many trials landed in the transfer window (a dashboard tells a covered abort pass from an empty
  // one).
  const abortTrials = new Gauge({
    name: 'pdchaos_abort_trials',
    help: 'Abort trials judged in this scenario.',
    labelNames: names('scenario'),
    registers: [registry],
  })
  const abortInWindow = new Gauge({
    name: 'pdchaos_abort_trials_in_window',
    help: 'Abort trials whose abort demonstrably landed in the transfer window.',
    labelNames: names('scenario'),
    registers: [registry],
  })
  const filterMatched = new Gauge({
    name: 'pdchaos_abort_filter_matched_packets',
    help: "Packets the abort window's widening filter matched while in place (0: it held no transfer).",
    labelNames: names('scenario'),
    registers: [registry],
  })
  const left = new Gauge({
    name: 'pdchaos_faults_left_behind',
    help: 'Faults injected but not verified clean after the run: the host may still be faulted.',
    labelNames: names(),
    registers: [registry],
  })
  const duration = new Gauge({
    name: 'pdchaos_run_duration_seconds',
    help: 'Wall time of the suite run.',
    labelNames: names(),
    registers: [registry],
  })
  const passed = new Gauge({
    name: 'pdchaos_run_passed',
    help: "1 when the run passed (the gate's verdict when gated), else 0.",
    labelNames: names(),
    registers: [registry],
  })
  return {abortTrials, abortInWindow, filterMatched, left, duration, passed}
}

/** One run's metrics under these labels; returns the series it added. */
function addRun(m: RunMetrics, run: SuiteRun, labels: Record<string, string>): number {
  let series = 0
  const histograms = new Set<string>()
  for (const s of run.scenarios) series += addScenario(m, s, labels, histograms)
  m.left.set(labels, faultsLeftBehind(run))
  m.duration.set(labels, Math.max(0, (run.finishedAt - run.startedAt) / 1000))
  m.passed.set(labels, runPassed(run) ? 1 : 0)
  return series + histograms.size + 3
}

/** One scenario's metrics; the histograms' label sets are gathered in `histograms` (each counts once). */
function addScenario(
  m: RunMetrics,
  s: SuiteRun['scenarios'][number],
  labels: Record<string, string>,
  histograms: Set<string>,
): number {
  let series = 0
  for (const p of s.pins) {
    if (p.evictionSeconds === null) continue
    const fault = p.fault ?? s.fault ?? 'none'
    m.eviction.observe({...labels, scenario: s.name, fault}, p.evictionSeconds)
    histograms.add(`${s.name}\u0000${fault}`)
  }
  const smallest = smallestMargins(scenarioMargins(s))
  if (smallest) {
    const fault = s.fault ?? 'none'
    m.margin.set({...labels, scenario: s.name, fault, bound: 'deadline'}, smallest.earlyMs / 1000)
    m.margin.set({...labels, scenario: s.name, fault, bound: 'deadline_plus_poll'}, smallest.lateMs / 1000)
    series += 2
  }
  if (s.abortCoverage) {
    m.abortTrials.set({...labels, scenario: s.name}, s.abortCoverage.trials)
    m.abortInWindow.set({...labels, scenario: s.name}, s.abortCoverage.inWindow)
    series += 2
    if (s.abortCoverage.filterMatchedPackets !== null) {
      m.filterMatched.set({...labels, scenario: s.name}, s.abortCoverage.filterMatchedPackets)
      series++
    }
  }
  for (const v of s.verdicts) {
    m.checkPassed.set({...labels, scenario: s.name, check: v.check, subject: v.subject}, v.verdict === 'pass' ? 1 : 0)
    m.checkUnverified.set(
      {...labels, scenario: s.name, check: v.check, subject: v.subject},
      v.verdict === 'unverified' ? 1 : 0,
    )
    series += 2
  }
  return series
}

function gatewayError(url: string, what: string, error: unknown): PdError {
  return new PdError(`cannot ${what} the Pushgateway at ${url}: ${oneLine(error)}`, {
    exit: ExitCode.unreachable,
    cause: error,
    suggestion: `check that the Pushgateway runs and answers at ${url} (GET ${url.replace(/\/$/, '')}/-/ready)`,
  })
}

function withDeadline<T>(p: Promise<T>, ms: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer within ${ms} ms`)), ms)
  })
  return Promise.race([p, deadline]).finally(() => clearTimeout(timer))
}

function checkUrl(url: string): void {
  let u: URL
  try {
    u = new URL(url)
  } catch {
    throw new PdError(`not a Pushgateway URL: ${url}`, {
      exit: ExitCode.badInput,
      suggestion: 'give the gateway as http://HOST:9091',
    })
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') {
    throw new PdError(`not a Pushgateway URL: ${url} (${u.protocol} is neither http nor https)`, {
      exit: ExitCode.badInput,
      suggestion: 'give the gateway as http://HOST:9091',
    })
  }
}

/**
 * Push the run's metrics, replacing whatever the grouping held. Throws PdError exit 5 naming the gateway on any
 * failure.
 */
export async function pushRun(url: string, run: SuiteRun, opts: PushOptions = {}): Promise<PushResult> {
  // A vLLM run is grouped with its engine named (job + run_id + engine); an SGLang run's grouping is unchanged.
  const engine = run.engine && !opts.groupings ? {groupings: {run_id: runIdOf(run), engine: run.engine}} : {}
  return pushRegistry(url, runRegistry(run), runIdOf(run), {...opts, ...engine})
}

/** Push a fleet's metrics as one grouping (job + the fleet's run_id), each series labelled with its deployment. */
export async function pushFleet(
  url: string,
  fleet: FleetRun,
  runId: string,
  opts: PushOptions = {},
): Promise<PushResult> {
  return pushRegistry(url, fleetRegistry(fleet), runId, opts)
}

async function pushRegistry(
  url: string,
  metrics: {registry: Registry; series: number},
  runId: string,
  opts: PushOptions,
): Promise<PushResult> {
  checkUrl(url)
  const jobName = opts.jobName ?? 'pdchaos'
  const groupings = opts.groupings ?? {run_id: runId}
  const timeoutMs = opts.timeoutMs ?? 5000
  const gateway = new (prom().Pushgateway)(url, {timeout: timeoutMs}, metrics.registry)
  try {
    await withDeadline(gateway.push({jobName, groupings}), timeoutMs + 500)
  } catch (error) {
    throw gatewayError(url, 'push to', error)
  }
  return {url, jobName, groupings, series: metrics.series}
}

/** Delete a run's grouping from the gateway (tests, and cleaning up after a mistaken push). */
export async function deleteRun(
  url: string,
  opts: {jobName?: string; groupings: Record<string, string>; timeoutMs?: number},
): Promise<void> {
  checkUrl(url)
  const timeoutMs = opts.timeoutMs ?? 5000
  const {Pushgateway, Registry} = prom()
  const gateway = new Pushgateway(url, {timeout: timeoutMs}, new Registry())
  try {
    await withDeadline(gateway.delete({jobName: opts.jobName ?? 'pdchaos', groupings: opts.groupings}), timeoutMs + 500)
  } catch (error) {
    throw gatewayError(url, 'delete from', error)
  }
}
