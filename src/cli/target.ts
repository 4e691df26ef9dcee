import {existsSync} from 'node:fs'
import {resolve} from 'node:path'

import type {Deployment} from '../deployment/config.js'
import {loadDeploymentModel} from '../deployment/load.js'
import type {DeploymentModel, PlacedService} from '../deployment/model.js'
import {
  acrossHosts,
  FIRST_PAIR,
  hostView,
  type InstancePair,
  type NodeRankOn,
  pairPaths,
  pairRefusal,
  singleHostView,
} from '../deployment/single-host.js'
import type {Host} from '../hosts/host.js'
import type {RestartTarget, ServiceName} from '../restart/co-restart.js'
import type {PairView} from '../suite/runner.js'
import type {SuiteFile} from '../suite/suite-file.js'
import {pairOfSpec} from '../suite/planner.js'
import {openHost} from '../hosts/open-host.js'
import {Placement} from '../experiment/placement.js'
import {defaultSimDir} from '../state-dir.js'
import {badInput} from '../errors.js'
import {abortable, throwIfStopped} from '../util/stop.js'
import {simStateDir, type TwinStart} from './sim-flags.js'

/**
 * Which deployment a command acts on, and the Host to reach it: the deployment file (-c), or with --sim the
 * twin's own generated file (starting the twin when none runs). The twin is reached like any host, through its file.
 */

export interface TargetFlags {
  config: string
  sim: boolean
  'state-dir'?: string
  'accept-new-host-key'?: boolean
}

export interface Target {
  /** The single-host view every command acts on today. */
  deployment: Deployment
  /** The file's hosts and instances, whatever its form. */
  model: DeploymentModel
  file: string
  host: Host
  /**
   * A deployment over several hosts (a command that acts across hosts): every host in use, open, with the roles that
   * run there; `host` is the router's among them. Absent for a deployment on one host.
   */
  across?: Array<{name: string; roles: Array<'prefill' | 'decode' | 'router'>; nodeRanks: NodeRankOn[]; host: Host}>
  /** Set when the twin was started for this command (so it may say so). */
  startedTwin?: string
  /** The prefill/decode instance pair a run acts on (inject, suite): `deployment` and the placement are that pair's. */
  pair?: InstancePair
}

export interface ResolveTargetOptions {
  /** The command acting on the target, named when a file spans more than it can act on yet (exit 2). */
  command?: string
  startTwin?: boolean
  /** How to start the twin when none runs: its watchdog, and its gateway's breaker (absent: upstream's 60 s). */
  twin?: TwinStart
  onProgress?: (line: string) => void
  /** Checks that need the deployment file (a TTL against its watchdog): run before the host is reached. */
  check?: (deployment: Deployment, model: DeploymentModel) => void
  /**
   * The instance pair a run acts on, where the file lists several instances of a role (exit 2 when it names none).
   */
  pair?: InstancePair
  /** The command's stop (SIGINT): reading the file and reaching the hosts end with exit 3 when it fires. */
  signal?: AbortSignal
}

export async function resolveTarget(flags: TargetFlags, opts: ResolveTargetOptions = {}): Promise<Target> {
  // --state-dir names the twin's directory: without --sim it would be silently ignored, and -c used instead.
  if (flags['state-dir'] !== undefined && !flags.sim) {
    throw badInput(
      "--state-dir applies only with --sim (it names the twin's state dir)",
      'add --sim to target the twin, or drop --state-dir and pass the deployment file with -c FILE',
    )
  }
  const {file, startedTwin} = flags.sim ? await twinDeploymentFile(flags, opts) : {file: resolve(flags.config)}
  // A twin being started is let finish (it keeps running, as after any suite that started it), then the stop is heard.
  throwIfStopped(opts.signal, 'starting the twin')
  const model = await loadDeploymentModel(file)
  throwIfStopped(opts.signal, `reading ${file}`)
  // Before any host is reached: a command never acts on one host of a deployment that spans several.
  const deployment = singleHostView(model, {
    command: opts.command ?? 'pdchaos',
    file,
    ...(opts.pair ? {pair: opts.pair} : {}),
  })
  opts.check?.(deployment, model)
  const open = (config: Deployment['host']): Promise<Host> => openTargetHost(config, deployment, flags, opts.signal)
  const placed = acrossHosts(model)
  const pair = opts.pair ? {pair: opts.pair} : {}
  if (placed.length <= 1) return {deployment, model, file, host: await open(deployment.host), startedTwin, ...pair}
  const across = await openAcross(model, placed, open)
  return {
    deployment,
    model,
    file,
    host: across.find(a => a.name === model.services.router.nodes[0])!.host,
    across,
    startedTwin,
    ...pair,
  }
}

/** --sim: the twin's deployment file, the twin started first when none runs (and the command may start it). */
async function twinDeploymentFile(
  flags: TargetFlags,
  opts: ResolveTargetOptions,
): Promise<{file: string; startedTwin?: string}> {
  // The twin's code only for --sim: a run against a deployment file does not load it (about 30 modules at start).
  const [{readLock, liveHolders}, {simPaths}, {simUp}] = await Promise.all([
    import('../sim/lifecycle/lock.js'),
    import('../sim/sim-config.js'),
    import('./twin.js'),
  ])
  const stateDir = simStateDir(flags['state-dir'] ?? defaultSimDir())
  const file = simPaths(stateDir).deploymentFile
  const lock = readLock(stateDir)
  const running = lock !== undefined && liveHolders(lock).length > 0 && existsSync(file)
  if (running || opts.startTwin === false) return {file}
  const breaker =
    opts.twin?.cbTimeoutS === undefined ? '' : `, circuit breaker half-open after ${opts.twin.cbTimeoutS}s`
  const watchdog = opts.twin ? ` (watchdog deadline ${opts.twin.deadlineS}s, poll ${opts.twin.pollS}s${breaker})` : ''
  opts.onProgress?.(`starting the twin in ${stateDir}${watchdog}`)
  const {cbTimeoutS, ...watchdogS} = opts.twin ?? {}
  await simUp({
    stateDir,
    ...watchdogS,
    ...(cbTimeoutS === undefined ? {} : {router: {cbTimeoutDurationS: cbTimeoutS}}),
  })
  return {file, startedTwin: stateDir}
}

/** Connecting has its own deadline; a stop ends the wait at once (a connection that opens later is dropped). */
function openTargetHost(
  config: Deployment['host'],
  deployment: Deployment,
  flags: TargetFlags,
  signal: AbortSignal | undefined,
): Promise<Host> {
  const opening = openHost(config, {sudo: deployment.sudo, acceptNewHostKey: flags['accept-new-host-key']})
  if (signal)
    opening.then(
      h => {
        if (signal.aborted) h.close().catch(() => {})
      },
      () => {},
    )
  const phase =
    config.kind === 'ssh' ? `connecting to ${config.alias ?? config.hostname ?? 'the host'}` : 'opening the host'
  return abortable(opening, signal, phase)
}

/** Every host, or none: one that cannot be reached closes those already open (exit 5 naming it). */
async function openAcross(
  model: DeploymentModel,
  placed: ReturnType<typeof acrossHosts>,
  open: (config: Deployment['host']) => Promise<Host>,
): Promise<NonNullable<Target['across']>> {
  const across: NonNullable<Target['across']> = []
  try {
    for (const p of placed) across.push({...p, host: await open(hostView(model, p.name).host)})
  } catch (error) {
    await Promise.all(across.map(a => a.host.close().catch(() => {})))
    throw error
  }
  return across
}

/** Close every host a target opened. */
export async function closeTarget(t: Target): Promise<void> {
  await Promise.all((t.across?.map(a => a.host) ?? [t.host]).map(h => h.close().catch(() => {})))
}

/**
 * Where the target's services run, as the runner acts on them: its one host, or each host in use; for a run on an
 * instance pair, the hosts of the pair and the router, each with the pair's roles there.
 */
export function placementOf(t: Target): Placement {
  if (!t.across) return Placement.single(t.deployment, t.host)
  if (!t.pair) return everyHostOf(t)
  const of = new Map(acrossHosts(t.model, t.pair).map(h => [h.name, h]))
  const used = t.across.filter(a => (of.get(a.name)?.roles.length ?? 0) + (of.get(a.name)?.nodeRanks.length ?? 0) > 0)
  return Placement.across(
    t.deployment,
    used.map(a => ({
      ...a,
      roles: of.get(a.name)!.roles,
      nodeRanks: of.get(a.name)!.nodeRanks,
      view: hostView(t.model, a.name, t.pair),
    })),
  )
}

/** Every host the deployment uses, whatever a run acts on: the run lock spans them, and recover visits them all. */
export function everyHostOf(t: Target): Placement {
  return t.across
    ? Placement.across(
        t.deployment,
        t.across.map(a => ({...a, view: hostView(t.model, a.name)})),
      )
    : Placement.single(t.deployment, t.host)
}

/**
 * A co-restart's steps: every service in the file's order (its restartOrder:, else prefill, decode, router), or, with
 * `roles` other than all three in that order, every instance of each role in the order given; each restarted on the
 * host of its node rank 0 (a role with one instance is one step, named by its role, as it always was).
 */
export function restartTargetsOf(t: Target, roles?: ServiceName[]): RestartTarget[] {
  const hostNamed = (name: string): Host => t.across?.find(a => a.name === name)?.host ?? t.host
  const {prefill, decode, router} = t.model.services
  const byPath = new Map([...prefill, ...decode, router].map(s => [s.path, s]))
  // The file's order (restartOrder:, else prefill, decode, router) for the whole co-restart, also when all three roles
  // are named in SGLang's order (the default of restart --service and of a suite's restart); roles named otherwise go
  // in
  // the order given, the instances of each in the file's order.
  const inFileOrder = t.model.restartOrder.map(p => byPath.get(p)!)
  const whole = roles === undefined || roles.join() === 'prefill,decode,router'
  const ordered = whole ? inFileOrder : roles.flatMap(role => inFileOrder.filter(s => s.role === role))
  return ordered.map(inst => {
    const ofRole: PlacedService<unknown>[] = inst.role === 'router' ? [router] : t.model.services[inst.role]
    const name = ofRole.length > 1 ? `${inst.role}[${ofRole.indexOf(inst)}]` : inst.role
    const nodes = inst.nodes.length > 1 ? {nodes: inst.nodes.map(n => ({name: n, host: hostNamed(n)}))} : {}
    return {name, role: inst.role, path: inst.path, service: inst.service, host: hostNamed(inst.nodes[0]!), ...nodes}
  })
}

/** The pair a run acts on, as the file states it, where the file lists several instances of a role (else undefined). */
export function pairOf(t: Target): {prefill: string; decode: string} | undefined {
  const several = t.model.services.prefill.length > 1 || t.model.services.decode.length > 1
  return several && t.pair ? pairPaths(t.model, t.pair) : undefined
}

/**
 * Where the file lists several instances of a role: the pair a suite scenario that names none acts on, and the view
 * of each pair a scenario names (its single-host view, the placement of its hosts, its paths). Else undefined.
 */
export function pairViews(t: Target): {default: InstancePair; viewOf: (pair: InstancePair) => PairView} | undefined {
  if (t.model.services.prefill.length < 2 && t.model.services.decode.length < 2) return undefined
  return {
    default: t.pair ?? FIRST_PAIR,
    viewOf: pair => {
      const deployment = hostView(t.model, t.model.services.router.nodes[0]!, pair)
      return {deployment, placement: placementOf({...t, deployment, pair}), paths: pairPaths(t.model, pair)}
    },
  }
}

/** The views of the instance pairs a suite's fault scenarios act on other than the run's own (for the preflight). */
export function scenarioPairViews(t: Target, suite: SuiteFile): Deployment[] {
  const views = pairViews(t)
  if (!views) return []
  const d = views.default
  const pairs = new Map(
    suite.scenarios
      .filter(s => s.fault !== undefined && s.pair !== undefined)
      .map(s => pairOfSpec(s, d))
      .filter(p => p.prefill !== d.prefill || p.decode !== d.decode)
      .map(p => [`${p.prefill}/${p.decode}`, p]),
  )
  return [...pairs.values()].map(p => views.viewOf(p).deployment)
}

/**
 * Exit 2 when a suite scenario's pair: names an instance the deployment does not have, or its gpuHost: a host it does
 * not have (before any host is reached).
 */
export function checkScenarioPairs(
  m: DeploymentModel,
  suite: SuiteFile,
  file: string,
  defaultPair: InstancePair,
): void {
  for (const [i, sc] of suite.scenarios.entries()) {
    if (sc.gpuHost !== undefined && !m.hosts.some(h => h.name === sc.gpuHost)) {
      throw badInput(
        `${file}: scenarios[${i}] (${sc.name}) gpuHost ${sc.gpuHost}: the deployment has the ` +
          `hosts ${m.hosts.map(h => h.name).join(', ')}`,
        "name one of the deployment file's hosts: (`pdchaos status` lists the ranks per host)",
      )
    }
    if (!sc.pair) continue
    const pair = pairOfSpec(sc, defaultPair)
    const why = pairRefusal(m, pair, (role, n) => `scenarios[${i}] (${sc.name}) pair.${role} ${n}`)
    if (why)
      throw badInput(
        `${file}: ${why}`,
        '`pdchaos status` lists the instances of each role, numbered from 0 in the order of the deployment file',
      )
  }
}
