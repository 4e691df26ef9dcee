import type {Deployment} from '../deployment/config.js'
import type {InstancePair} from '../deployment/single-host.js'
import {oneLine, PdError} from '../errors.js'
import {type BatchOutcome, type BatchSettings, runBatch} from '../experiment/batch.js'
import {RunSession} from '../experiment/session.js'
import type {PlacedHost, Placement} from '../experiment/placement.js'
import {type FaultScenario, followsDataPath} from '../faults/fault.js'
import {classifyDataPath} from '../faults/mechanisms/data-path.js'
import type {Host} from '../hosts/host.js'
import type {ScenarioRun, SuiteRun} from '../model/run.js'
import type {RestartResult} from '../model/restart.js'
import {coRestart, type RestartTarget, roleTargets, type ServiceName} from '../restart/co-restart.js'
import {ALONE_DEFAULTS, aloneProbePlan, restartAlone} from '../restart/role-restart.js'
import {now} from '../workload/recorder.js'
import {evaluateGate} from './gate.js'
import {
  type Batch,
  expand,
  faultScenarioOf,
  lagLimit,
  pairOfScenario,
  type PlannedScenario,
  type PlanOptions,
  planBatchesInTurns,
  planConflicts,
  renderPlanText,
} from './planner.js'
import {startStopWatch, type StopWatch} from './stop.js'
import type {GateSpec, SuiteFile} from './suite-file.js'

/**
 * A run: plan the batches (and check them for conflicts) before any injection, print the plan, run the batches in
 * order under the stop conditions, and return the run model the reports render and the journal holds. `inject` is
 * a run of one scenario in one batch. A stopped run reverts what it holds, runs nothing more and is never resumed.
 */

export interface RunOptions {
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
  /** How each batch runs; the suite's defaults otherwise (see SUITE_BATCH). */
  batch?: Partial<
    Pick<
      BatchSettings,
      'mode' | 'pinPacing' | 'pinPath' | 'ttlMs' | 'paramsSource' | 'planErrors' | 'allowCompetingTimeout'
    >
  >
  /** A co-restart's steps where the file lists several instances of a role (each restarted); default: one per role. */
  restartTargets?: (order: ServiceName[]) => RestartTarget[]
  /**
   * Where the file lists several instances of a role: the pair of a scenario that names none (the one `deployment`
   * and `on` are the view of), and the view of any pair a scenario names. Absent: one pair, the one given.
   */
  pairs?: {default: InstancePair; viewOf: (pair: InstancePair) => PairView}
}

/** One instance pair as a run acts on it: its single-host view, its hosts, and where the file states the two. */
export interface PairView {
  deployment: Deployment
  placement: Placement
  paths: {prefill: string; decode: string}
}

/** The suite's batches: pins paced 10 every 50 ms, params named as the file's keys, a scenario that cannot be
 * planned recorded as its error while the others run. */
const SUITE_BATCH = {
  mode: 'run',
  pinPacing: {burst: 10, gapMs: 50},
  paramsSource: 'file',
  planErrors: 'record',
} as const

export async function runSuite(
  deployment: Deployment,
  on: Host | Placement,
  suite: SuiteFile,
  opts: RunOptions,
): Promise<SuiteRun> {
  const startedAt = Date.now()
  const r = await planRun(deployment, on, suite, opts)
  const watch = await startStopWatch(deployment, r.hosts, suite.stop, {say: opts.say})
  const onOuter = () => watch.stop(String(opts.signal?.reason ?? 'interrupted'))
  opts.signal?.addEventListener('abort', onOuter, {once: true})
  // A SIGINT during calibration or discovery (before the listener) fired no event: the run stops before its first
  // batch.
  if (opts.signal?.aborted) onOuter()
  for (const n of watch.notes) opts.say(n)
  const done: Done = {runs: [], batchStats: [], floorMs: 0}
  try {
    for (const b of r.batches) {
      if (watch.signal.aborted) break
      await runOneBatch(r, b, watch, done)
    }
  } finally {
    opts.signal?.removeEventListener('abort', onOuter)
    await watch.close()
  }
  return finishRun(r, done, watch, startedAt)
}

/** A run once planned: its session, scenarios, batches, the plan's text, and each scenario's own pair. */
interface PlannedRun {
  deployment: Deployment
  suite: SuiteFile
  opts: RunOptions
  session: RunSession
  scenarios: PlannedScenario[]
  batches: Batch[]
  plan: string[]
  hosts: PlacedHost[]
  sessionOf: (s: PlannedScenario) => {session: RunSession; paths?: PairView['paths']}
  /** Every pair's session made so far (a co-restart makes each measure and discover again). */
  pairSessions: () => Iterable<{session: RunSession}>
}

/** What the batches gave so far. */
interface Done {
  runs: ScenarioRun[]
  batchStats: NonNullable<SuiteRun['batches']>
  floorMs: number
}

/** Plan the batches (checked for conflicts) before any injection, and show the plan. */
async function planRun(
  deployment: Deployment,
  on: Host | Placement,
  suite: SuiteFile,
  opts: RunOptions,
): Promise<PlannedRun> {
  const {say} = opts
  const scenarios = expand(suite.scenarios)
  const session = new RunSession(deployment, on)
  const planned = await planOptions(session, scenarios, {
    promptTokens: suite.load.promptTokens,
    say,
    ...(opts.signal ? {signal: opts.signal} : {}),
  })
  const planLimitWhy = planned.limitWhy
  delete planned.limitWhy
  const pairs = opts.pairs
  const planOpts: PlanOptions = {...planned, ...(pairs ? {defaultPair: pairs.default, showPairs: true} : {})}
  const {sessionOf, pairSessions} = pairSessionsOf(session, planOpts, pairs)
  // The stop conditions watch every host a scenario acts on (the kernel log of each), whichever pair it belongs to.
  const hosts = unionOfHosts([
    session.placement.hosts,
    ...scenarios.filter(s => !s.spec.restart).map(s => sessionOf(s).session.placement.hosts),
  ])
  const batches = await batchesOf(scenarios, planOpts, opts)
  const conflicts = planConflicts(batches, planOpts)
  if (conflicts.length > 0)
    throw new PdError(`the batch plan has conflicts: ${conflicts.join('; ')}`, {
      exit: 5,
      suggestion: 'report this: the planner must never batch conflicting scenarios',
    })
  const plan = renderPlanText(batches, planOpts)
  if (planOpts.maxPerBatch !== undefined && !opts.oneAtATime) plan.push(`batch size: ${planLimitWhy ?? ''}`)
  if (batches.length > 0) opts.onPlan?.(plan)
  return {deployment, suite, opts, session, scenarios, batches, plan, hosts, sessionOf, pairSessions}
}

/** A session per instance pair (its clients, calibration and discovery), made when a batch first acts on it. */
function pairSessionsOf(
  session: RunSession,
  planOpts: PlanOptions,
  pairs: RunOptions['pairs'],
): Pick<PlannedRun, 'sessionOf' | 'pairSessions'> {
  const known = new Map<string, {session: RunSession; paths: PairView['paths']}>()
  const pairKey = (p: InstancePair) => `${p.prefill}/${p.decode}`
  const sessionOf = (s: PlannedScenario): {session: RunSession; paths?: PairView['paths']} => {
    if (!pairs) return {session}
    const pair = pairOfScenario(s, planOpts)
    let k = known.get(pairKey(pair))
    if (!k) {
      const v = pairs.viewOf(pair)
      k = {
        session: pairKey(pair) === pairKey(pairs.default) ? session : new RunSession(v.deployment, v.placement),
        paths: v.paths,
      }
      known.set(pairKey(pair), k)
    }
    return k
  }
  return {sessionOf, pairSessions: () => known.values()}
}

/** The batches: one scenario each (--one-at-a-time), or planned in turns so that a stop is heard. */
async function batchesOf(scenarios: PlannedScenario[], planOpts: PlanOptions, opts: RunOptions): Promise<Batch[]> {
  // Planning compares every pair of scenarios: a large suite (up to MAX_PLANNED_SCENARIOS) says so and hears a stop.
  if (scenarios.length > 50) opts.say(`planning ${scenarios.length} scenarios into batches`)
  // A stop before or while planning: no plan, and the run stops before its first batch (every scenario "not run").
  if (opts.signal?.aborted) return []
  if (opts.oneAtATime) return scenarios.map((s, i) => ({index: i + 1, scenarios: [s]}))
  return planBatchesInTurns(scenarios, planOpts, {
    ...(opts.signal ? {signal: opts.signal} : {}),
    onProgress: (n, of) => opts.onPhase?.(`planning: ${n} of ${of} scenarios placed`),
  }).catch((error: unknown) => {
    if (opts.signal?.aborted) return []
    throw error
  })
}

/** One batch: a co-restart, or faults through runBatch; its scenarios' runs (or errors) added to `done`. */
async function runOneBatch(r: PlannedRun, b: Batch, watch: StopWatch, done: Done): Promise<void> {
  const {opts, session} = r
  const t0 = now()
  const names = b.scenarios.map(s => s.name)
  const label = `batch ${b.index}/${r.batches.length}`
  opts.onPhase?.(`${label}: ${names.join(', ')}`)
  opts.say(`${label}: ${names.join(', ')}`)
  const only = b.scenarios[0]!
  try {
    const out = only.spec.restart
      ? await runRestart(session, only, watch, opts.say, opts.restartTargets)
      : await runFaults(r, b, watch, label)
    done.runs.push(...out.scenarios)
    done.floorMs += out.floorMs
    done.batchStats.push({index: b.index, scenarios: names, ms: Math.round(now() - t0), floorMs: out.floorMs})
  } catch (error) {
    // Cleanup that cannot be verified (exit 4) ends the run: nothing more is injected into a host that may be
    // faulted. A single-scenario run (inject) gives its errors to the caller as they are.
    if (error instanceof PdError && (error.exitCode === 4 || opts.batch?.planErrors === 'throw')) throw error
    const t = Date.now()
    for (const s of b.scenarios) {
      const paths = s.spec.restart ? undefined : r.sessionOf(s).paths
      done.runs.push({...errored(s, r.deployment.watchdog, t, oneLine(error)), ...(paths ? {pair: paths} : {})})
    }
  } finally {
    // A co-restart replaced every instance's processes: each pair measures and discovers again.
    if (only.spec.restart) for (const known of r.pairSessions()) known.session.forget()
  }
}

/** A batch of faults: each scenario acts through its own pair's session (pairs whose footprints do not overlap). */
async function runFaults(r: PlannedRun, b: Batch, watch: StopWatch, label: string): Promise<BatchOutcome> {
  const {opts, suite} = r
  const out = await runBatch(
    r.session,
    b.scenarios.map(s => {
      const on = r.sessionOf(s)
      return {
        name: s.name,
        fault: s.spec.fault!,
        params: s.spec.params,
        pins: s.spec.pins,
        ...withParsed(s),
        ...(s.spec.gpuHost === undefined ? {} : {gpuHost: s.spec.gpuHost}),
        session: on.session,
        ...(on.paths ? {pair: on.paths} : {}),
      }
    }),
    {
      ...SUITE_BATCH,
      allowCompetingTimeout: suite.allowCompetingTimeout,
      ...opts.batch,
      promptTokens: suite.load.promptTokens,
      loadIntervalMs: suite.load.intervalMs,
      canaries: suite.load.canaries,
      signal: watch.signal,
      // A caller that passes a signal stops the run on SIGINT itself (and writes its journal).
      callerStopsOnSignal: opts.signal !== undefined,
      say: opts.say,
      onRecorder: rec => watch.setRecorder(rec),
      onDeadline: (what, at) => opts.onPhase?.(`${label}: ${what}`, at),
    },
  )
  // The journal names each scenario's own pair.
  for (const run of out.scenarios) {
    const paths = r.sessionOf(b.scenarios.find(s => s.name === run.name) ?? b.scenarios[0]!).paths
    if (paths) run.pair = paths
  }
  return out
}

/** The run model: every scenario's run, those a stop left unrun, and the gate. */
function finishRun(r: PlannedRun, done: Done, watch: StopWatch, startedAt: number): SuiteRun {
  const {deployment, session, opts} = r
  const contract = deployment.watchdog
  const runs = done.runs
  const run: SuiteRun = {
    name: r.suite.name,
    runId: opts.runId,
    startedAt,
    finishedAt: Date.now(),
    deployment: deployment.name,
    target: session.placement.spansHosts
      ? r.hosts.map(h => `${h.name} (${h.host.describe()})`).join(', ')
      : session.host.describe(),
    scenarios: runs,
    plan: r.plan,
    batches: done.batchStats,
    floorMs: done.floorMs,
    notes: watch.notes,
  }
  const reason = watch.reason()
  if (reason !== undefined) {
    run.stopped = {reason}
    const ran = new Set(runs.map(x => x.name))
    for (const s of r.scenarios)
      if (!ran.has(s.name))
        runs.push(
          errored(s, contract, run.finishedAt, 'not run: the suite was stopped (a stopped run is never resumed)'),
        )
  }
  if (opts.gate) run.gate = evaluateGate(run, opts.gate)
  return run
}

/**
 * A footprint that follows the data path (an `auto` mechanism, a widening where the path allows one: faults/fault.ts
 * followsDataPath): the planner must know the path. The session's
 * calibration and discovery serve the first batch too (calibration first: a fresh deployment opens its routes and
 * KV connections on first use).
 */
async function planOptions(
  session: RunSession,
  scenarios: PlannedScenario[],
  o: {promptTokens: number; say: (l: string) => void; signal?: AbortSignal},
): Promise<PlanOptions & {limitWhy?: string}> {
  // One scenario has nothing to batch with: no need to know (and a dry run must not calibrate).
  // Several faults may share a window: the lags decide how many at once (lagLimit), so calibrate first as well.
  const followsPath = scenarios.some(s => {
    const fs = parsedOrNot(s)
    return fs !== undefined && followsDataPath(fs.fault, fs.params)
  })
  const needs = scenarios.length > 1 && (scenarios.filter(s => !s.spec.restart).length > 1 || followsPath)
  if (!needs) return {}
  let limit: ReturnType<typeof lagLimit>
  try {
    // The lags it measures size the batches (planner.ts lagLimit): ε must stay well under the poll.
    limit = lagLimit(await session.calibration(o), session.deployment.watchdog.pollSeconds)
  } catch (error) {
    // Stopped while calibrating: nothing is planned, and the run stops before its first batch (runSuite).
    if (o.signal?.aborted) return {}
    // Only the batch size hangs on the lags here: plan without that limit. The first batch calibrates again before
    // it injects anything, and stops the run there the same way (exit 5), as before plan-time calibration.
    if (!followsPath) {
      o.say(`calibration before planning failed (${oneLine(error)}); the first batch measures again`)
      return {}
    }
    throw error
  }
  let d: Awaited<ReturnType<RunSession['discovery']>>
  try {
    d = await session.discovery(o.say, o.signal)
  } catch (error) {
    // Stopped while discovering: as while calibrating, the run stops before its first batch.
    if (o.signal?.aborted) return {}
    throw error
  }
  return {
    autoMechanism: classifyDataPath(d.transport).kind === 'tcp' ? 'packet-filter' : 'nic',
    ...(limit ? {maxPerBatch: limit.maxPerBatch, limitWhy: limit.why} : {}),
  }
}

/** A co-restart step: it replaces the processes, so the session measures and discovers again afterwards. */
async function runRestart(
  session: RunSession,
  s: PlannedScenario,
  watch: StopWatch,
  say: (l: string) => void,
  targets?: RunOptions['restartTargets'],
): Promise<{scenarios: ScenarioRun[]; floorMs: number}> {
  const r = s.spec.restart!
  const startedAt = Date.now()
  watch.setRestarting(true)
  try {
    if (r.only) return await runAlone(session, s, r.only, watch, say, targets)
    // One decode heartbeat interval, as discovery read it, unless the file says (decode notices a new prefill then).
    const discovered =
      r.settleSeconds === undefined
        ? await session.discovery(l => say(`${s.name}: ${l}`)).catch(() => undefined)
        : undefined
    const settleS = r.settleSeconds ?? discovered?.heartbeat?.intervalSeconds ?? DEFAULT_SETTLE_S
    const res = await coRestart(session.deployment, service => session.placement.of(service).host, {
      order: r.services as ServiceName[],
      healthTimeoutS: r.healthTimeoutSeconds,
      commandTimeoutS: r.commandTimeoutSeconds,
      canaries: r.canaries,
      watchS: r.watchSeconds,
      sampleS: 1,
      settleS,
      onProgress: l => say(`${s.name}: ${l}`),
      signal: watch.signal,
      ...(targets ? {targets: targets(r.services as ServiceName[])} : {}),
    })
    const healthWaits = res.steps.reduce((a, step) => a + (step.healthyAfterMs ?? 0), 0)
    // The restart's floor: its health waits, the settle and the watch it was told to hold.
    return {
      scenarios: [
        restartScenario(s.name, res, {contract: session.deployment.watchdog, startedAt, finishedAt: Date.now()}),
      ],
      floorMs: healthWaits + (settleS + r.watchSeconds) * 1000,
    }
  } finally {
    session.forget()
    watch.setRestarting(false)
  }
}

/** A co-restart's settle where neither the file nor decode's environment says: SGLang's default heartbeat interval. */
const DEFAULT_SETTLE_S = 5

/** A role restarted alone (`restart: {only: prefill}`): canaries judged against decode's heartbeat bound. */
async function runAlone(
  session: RunSession,
  s: PlannedScenario,
  role: 'prefill' | 'decode',
  watch: StopWatch,
  say: (l: string) => void,
  targets?: RunOptions['restartTargets'],
): Promise<{scenarios: ScenarioRun[]; floorMs: number}> {
  const r = s.spec.restart!
  const startedAt = Date.now()
  const tell = (l: string) => say(`${s.name}: ${l}`)
  const d = await session.discovery(tell)
  const shape = {role, ...(d.heartbeat ? {heartbeat: d.heartbeat} : {}), ...ALONE_DEFAULTS}
  for (const l of aloneProbePlan(shape)) tell(l)
  const hosts = (service: ServiceName) => session.placement.of(service).host
  const of = (order: ServiceName[]) => (targets ? targets(order) : roleTargets(session.deployment, hosts, order))
  const res = await restartAlone(session.deployment, hosts, {
    ...shape,
    healthTimeoutS: r.healthTimeoutSeconds,
    commandTimeoutS: r.commandTimeoutSeconds,
    onProgress: tell,
    signal: watch.signal,
    targets: of([role]),
    repairTargets: of(['prefill', 'decode', 'router']),
  })
  const healthWaits = res.steps.reduce((a, step) => a + (step.healthyAfterMs ?? 0), 0)
  const run = restartScenario(s.name, res, {contract: session.deployment.watchdog, startedAt, finishedAt: Date.now()})
  // The floor: the health waits and the canaries' span, which the heartbeat bound sets.
  const spanS = (d.heartbeat?.boundSeconds ?? 10) + ALONE_DEFAULTS.epsilonS + ALONE_DEFAULTS.tailS
  return {scenarios: [run], floorMs: healthWaits + spanS * 1000}
}

/** A scenario's parsed fault and params; undefined where they do not parse (the batch then records why). */
function parsedOrNot(s: PlannedScenario): FaultScenario | undefined {
  try {
    return faultScenarioOf(s)
  } catch {
    return undefined
  }
}

const withParsed = (s: PlannedScenario): {scenario?: FaultScenario} => {
  const scenario = parsedOrNot(s)
  return scenario ? {scenario} : {}
}

/** Each host once, by name, in the order first seen. */
function unionOfHosts(lists: PlacedHost[][]): PlacedHost[] {
  const byName = new Map<string, PlacedHost>()
  for (const h of lists.flat()) if (!byName.has(h.name)) byName.set(h.name, h)
  return [...byName.values()]
}

function errored(s: PlannedScenario, contract: ScenarioRun['contract'], t: number, error: string): ScenarioRun {
  return {
    name: s.name,
    kind: s.spec.restart ? 'restart' : 'inject',
    fault: s.spec.fault,
    params: s.spec.params,
    startedAt: t,
    finishedAt: t,
    verdicts: [],
    pins: [],
    leases: [],
    contract,
    error,
  }
}

/** A co-restart as a scenario of the run; its observations become the timeline (canaries and watch requests). */
export function restartScenario(
  name: string,
  r: RestartResult,
  opts: {contract: ScenarioRun['contract']; startedAt: number; finishedAt: number},
): ScenarioRun {
  return {
    name,
    kind: 'restart',
    startedAt: opts.startedAt,
    finishedAt: opts.finishedAt,
    verdicts: r.verdicts,
    pins: [],
    leases: [],
    timeline: {
      contract: opts.contract,
      calibration: {prefillMs: 0, prefillSpreadMs: 0, observeMs: 0, samples: 0},
      observations: [...r.observations].sort((a, b) => a.t - b.t),
    },
    contract: opts.contract,
  }
}
