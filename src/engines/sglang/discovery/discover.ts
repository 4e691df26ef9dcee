import type {Deployment} from '../../../deployment/config.js'
import {DEFAULT_PROBE_TIMEOUT_MS, type ServiceClients, serviceClients} from '../deployment/clients.js'
import type {HealthResult} from '../deployment/sglang-client.js'
import {sampleValue, sumOf, type ParsedMetrics} from '../../../deployment/prom-text.js'
import {PD_COUNTERS, PD_QUEUE_GAUGES, QUEUE_REQS, RUNNING_REQS, TOKEN_USAGE} from '../sglang-metrics.js'
import {oneLine, PdError, unreachable} from '../../../errors.js'
import {ExitCode} from '../../../exit-codes.js'
import type {Host} from '../../../hosts/host.js'
import {listHostState, type HostState} from '../../../discovery/host-state.js'
import {
  gpuFromLayout,
  gpuIndexByPid,
  parseComputeApps,
  parseGpuList,
  type GpuLayout,
  type GpuRow,
  type PidGpu,
} from '../../../discovery/gpus.js'
import {isServerLaunch, mergeLaunchArgs, parseConfigYaml, parseLaunchCommand, type LaunchArgs} from './launch-args.js'
import {
  parseDockerProxy,
  parseEnviron,
  parseProcStat,
  parsePs,
  parseSsListeners,
  type Listener,
  type ProcessRow,
} from '../../../discovery/proc.js'
import {parseRankTitle} from './rank-title.js'
import {isRouterCommand, type RouterSettings, routerSettingsFromArgv} from './router-settings.js'
import {parseNvidiaTopo, type Topology} from '../../../discovery/topo.js'
import {healthCheckFromEnv, KEPT_ENV, type HealthCheckSettings} from './transport-env.js'
import {
  heartbeatSettingsOf,
  launchVarsOf,
  type RoleReads,
  type SglangTimeouts,
  sglangTimeoutsOf,
} from './sglang-timeouts.js'
import {watchdogFromEnv, watchdogWarnings, type EnvTimeouts, type EnvWatchdog} from './watchdog-env.js'
import type {HeartbeatSettings} from './heartbeat-bound.js'

/**
 * Discovery: what a PD deployment is right now, read the way an operator would read it — the services' HTTP APIs,
 * the host's process table, /proc, nvidia-smi and the prefill bootstrap route. The same code runs against the twin
 * and a real SGLang host; every probe has a deadline, and a probe that fails becomes a warning, not a crash.
 */

export type ServiceName = 'prefill' | 'decode' | 'router'

export interface ServiceStatus {
  url: string
  health: HealthResult
  readiness?: HealthResult
  version?: string
  tpSize?: number
  backend?: string
  pid?: number
  /** The twin only: the path of its failure-point endpoint (server_info pdchaos_twin). */
  twinFailpointPath?: string
  /** The KV data path where the server states it (the twin does; a real server is read from its rank environment). */
  kvDataPath?: string
  /** The twin only: its rail NICs (`sim up --rail-nics`), each GPU's interface carrying that GPU's KV as kernel UDP. */
  twinRails?: TwinRail[]
  /** The twin only: the health-check timeout it states (a real server's is read from its environment). */
  twinHealthTimeoutSeconds?: number
  /** The router only: its retry and circuit-breaker settings and what they do under faults. */
  routerSettings?: RouterSettings
  /** How /health judges this server: SGLANG_HEALTH_CHECK_TIMEOUT and whether it generates, from its environment. */
  healthCheck?: HealthCheckSettings
  /** The parallel layout server_info states (SGLang's server_args). */
  dpSize?: number
  ppSize?: number
  attnCpSize?: number
  enableDpAttention?: boolean
  baseGpuId?: number
  gpuIdStep?: number
  /** The server's launch arguments: its command line, merged over its `--config` YAML file when it has one. */
  launch?: {pid: number; source: string; args: LaunchArgs}
  /** The listener on the service's port is docker-proxy: the server behind it is another process. */
  dockerProxy?: {pid: number; containerPort?: number}
}

/** One rail NIC as the twin states it in server_info's pdchaos_twin section. */
export interface TwinRail {
  gpu: number
  interface: string
  address?: string
  udpPort: number
}

export interface RankInfo {
  service: 'prefill' | 'decode'
  /** The host it runs on, by its name in the deployment file (a deployment over several hosts only). */
  host?: string
  /**
   * Its node rank, where it runs on a node other than rank 0 of a multi-node instance (a deployment over several
   * hosts).
   */
  nodeRank?: number
  tpRank: number
  dpRank?: number
  ppRank?: number
  attnCpRank?: number
  moeDpRank?: number
  epRank?: number
  pid: number
  /** /proc/<pid>/stat start time (clock ticks since boot): with the pid, the rank's identity. */
  startTicks?: number
  /** Process state letter: R/S running or sleeping, T stopped, D uninterruptible. */
  state: string
  title: string
  gpu?: number
  /** How the GPU was found: nvidia-smi's compute context using the most memory, or the launch layout. */
  gpuSource?: string
  /** The bootstrap route key of a prefill rank: {dp, cp, tp (attention TP), pp}. */
  routeKey?: RouteKey
  /** The rank's ZMQ PULL port from the bootstrap route (prefill only). */
  zmqPort?: number
  zmqHost?: string
  /** The rank's UCX_*, MC_*, NIXL_* and SGLANG_* variables (/proc/<pid>/environ; needs privilege for others' ranks). */
  env?: Record<string, string>
}

/** The key a prefill scheduler registers under (common/conn.py CommonKVBootstrapServer._handle_route_put). */
export interface RouteKey {
  dp: number
  cp: number
  tp: number
  pp: number
}

export interface StatusReport {
  deployment: {name: string; host: string; labels: Record<string, string>; backend: string}
  services: Record<ServiceName, ServiceStatus>
  ranks: RankInfo[]
  watchdog: {
    contract: Deployment['watchdog']
    prefillEnv?: EnvWatchdog
    timeouts?: EnvTimeouts
    heartbeat?: HeartbeatSettings
  }
  /**
   * SGLang's own PD timeouts, each with where it was read (the one place the plan, the checks and status read them).
   */
  sglangTimeouts: SglangTimeouts
  /** env: the prefill rank's transport variables (UCX_*, MC_*, NIXL_*), which tell whether the KV path is TCP. */
  transport: {backend: string; source: string; env?: Record<string, string>; dataPath?: string; rails?: TwinRail[]}
  /**
   * `nvidia-smi topo -m`: which NIC shares a PCIe switch with each GPU (undefined, with topologyError, if it failed).
   */
  topology?: Topology
  topologyError?: string
  counters: Record<'prefill' | 'decode', Record<string, number>>
  gauges: Record<'prefill' | 'decode', Record<string, number>>
  hostState: HostState
  warnings: string[]
  /** How long discovery took, in ms. */
  ms: number
}

const COUNTERS = PD_COUNTERS
const GAUGES = [...PD_QUEUE_GAUGES, RUNNING_REQS, QUEUE_REQS, TOKEN_USAGE]

export interface DiscoverOptions {
  timeoutMs?: number
  /**
   * The services whose processes run on this host (a deployment over several hosts, discovered host by host): the
   * process table, ranks, launch arguments and environment are read for these only. Default: all three.
   */
  here?: ServiceName[]
  /** The run's stop: the service probes end at once when it aborts (each also has its deadline). */
  signal?: AbortSignal
}

/** The process view restricted to the services on this host: a process of another host's role here is not theirs. */
function onlyHere(p: ProcessView, here: ReadonlySet<ServiceName>): ProcessView {
  const pick = <T>(r: Partial<Record<'prefill' | 'decode', T>>): Partial<Record<'prefill' | 'decode', T>> =>
    Object.fromEntries(Object.entries(r).filter(([k]) => here.has(k as ServiceName))) as Partial<
      Record<'prefill' | 'decode', T>
    >
  return {
    ...p,
    ranks: p.ranks.filter(r => here.has(r.service)),
    servicePids: pick(p.servicePids),
    serviceEnv: pick(p.serviceEnv),
    launch: pick(p.launch),
    launchVars: pick(p.launchVars),
    dockerProxy: pick(p.dockerProxy),
    ...(here.has('router') ? {} : {router: undefined}),
    ...(here.has('prefill') ? {} : {prefillEnv: undefined}),
  }
}

/** A probe whose failure is a warning, not the end of discovery (unless `fatal` says it is). */
type Soft = <T>(what: string, p: Promise<T>, o?: {fatal?: (error: unknown) => boolean}) => Promise<T | undefined>

function softProbes(warnings: string[]): Soft {
  return async (what, p, o = {}) => {
    try {
      return await p
    } catch (error) {
      if (o.fatal?.(error)) throw error
      warnings.push(`${what}: ${oneLine(error)}`)
      return undefined
    }
  }
}

export async function discover(deployment: Deployment, host: Host, opts: DiscoverOptions = {}): Promise<StatusReport> {
  const started = performance.now()
  const timeoutMs = opts.timeoutMs ?? DEFAULT_PROBE_TIMEOUT_MS
  const warnings: string[] = []
  const clients = serviceClients(deployment, {
    timeoutMs,
    ...(opts.signal ? {signal: opts.signal} : {}),
  })
  const soft = softProbes(warnings)

  // The host itself is not optional: an unreachable host, a refused key or a changed host key stops here (exit 5),
  // before any service probe can make a half-report look like an answer.
  await host.run(['true'], {timeoutMs, ...(opts.signal ? {signal: opts.signal} : {})})

  const here = new Set<ServiceName>(opts.here ?? ['prefill', 'decode', 'router'])
  const probed = await probeAll(deployment, host, clients, timeoutMs, soft, warnings)
  const procs = probed.procs && onlyHere(probed.procs, here)
  const services = servicesOf(deployment, probed, procs, warnings)
  const ranks: RankInfo[] = procs?.ranks ?? []
  placeRanks(here, services, procs, ranks, warnings)
  for (const name of ['prefill', 'decode'] as const) services[name].healthCheck = healthCheckOf(name, services, procs)
  for (const r of ranks)
    if (r.state === 'T')
      warnings.push(`${r.service} rank ${rankName(r)} (pid ${r.pid}) is stopped (state T): the instance is wedged`)
  await readRoutes(deployment, clients.prefill, services.prefill, ranks, soft)
  const {watchdog, sglangTimeouts} = timeoutsOf(deployment, here, services, procs, ranks, warnings)
  const transport = transportOf(deployment, services.prefill, procs, warnings)
  const {pMetrics, dMetrics} = probed
  return {
    deployment: {name: deployment.name, host: host.describe(), labels: deployment.labels, backend: deployment.backend},
    services,
    ranks,
    watchdog,
    sglangTimeouts,
    transport,
    ...(procs?.topology ? {topology: procs.topology} : {}),
    ...(procs?.topologyError ? {topologyError: procs.topologyError} : {}),
    counters: {prefill: pick(pMetrics, COUNTERS, true), decode: pick(dMetrics, COUNTERS, true)},
    gauges: {prefill: pick(pMetrics, GAUGES, false), decode: pick(dMetrics, GAUGES, false)},
    hostState: probed.hostState,
    warnings,
    ms: Math.round(performance.now() - started),
  }
}

/** Everything discovery reads at once: the services' health, server_info and metrics, the processes, pdchaos state. */
async function probeAll(
  deployment: Deployment,
  host: Host,
  clients: ServiceClients,
  timeoutMs: number,
  soft: Soft,
  warnings: string[],
) {
  const svc = deployment.services
  const {prefill, decode, router} = clients
  const [pHealth, dHealth, rHealth, rReady, pInfo, dInfo, pMetrics, dMetrics, procs, hostState] = await Promise.all([
    prefill.health(svc.prefill.healthPath),
    decode.health(svc.decode.healthPath),
    router.health(svc.router.healthPath),
    router.readiness(svc.router.readinessPath),
    soft('prefill server_info', prefill.serverInfo()),
    soft('decode server_info', decode.serverInfo()),
    soft('prefill metrics', prefill.metrics()),
    soft('decode metrics', decode.metrics()),
    // A host too slow to list its processes in time is exit 5 naming it: a report without ranks would read as "no
    // prefill rank processes" (bad input) to every fault. Other failures of the read stay warnings.
    soft(
      `process table on ${host.describe()}`,
      readProcesses(host, deployment, timeoutMs).catch((error: unknown) => {
        if (error instanceof PdError && error.exitCode === ExitCode.unreachable) {
          throw unreachable(
            `discovery: the process table on ${host.describe()} did not answer: ${oneLine(error)}`,
            'check the host (its load, its SSH connection); a slow one may need a longer probeTimeoutSeconds in ' +
              'the deployment file',
            error,
          )
        }
        throw error
      }),
      {fatal: error => error instanceof PdError && error.exitCode === ExitCode.unreachable},
    ),
    listHostState(host, deployment.stateDir, timeoutMs).catch((error: unknown) => {
      warnings.push(`pdchaos state on ${host.describe()}: ${oneLine(error)}`)
      return {leases: [], lock: null} satisfies HostState
    }),
  ])
  for (const [name, h] of [
    ['prefill', pHealth],
    ['decode', dHealth],
    ['router', rHealth],
  ] as const) {
    if (!h.ok) warnings.push(`${name} is not healthy: ${h.error ?? h.status}`)
  }
  return {pHealth, dHealth, rHealth, rReady, pInfo, dInfo, pMetrics, dMetrics, procs, hostState}
}

/** Each service as its probes and the process table show it; the router with its retry and breaker settings. */
function servicesOf(
  deployment: Deployment,
  probed: Awaited<ReturnType<typeof probeAll>>,
  procs: ProcessView | undefined,
  warnings: string[],
): Record<ServiceName, ServiceStatus> {
  const svc = deployment.services
  const services: Record<ServiceName, ServiceStatus> = {
    prefill: {url: svc.prefill.url, health: probed.pHealth, ...infoSummary(probed.pInfo)},
    decode: {url: svc.decode.url, health: probed.dHealth, ...infoSummary(probed.dInfo)},
    router: {
      url: svc.router.url,
      health: probed.rHealth,
      readiness: probed.rReady,
      ...(procs?.router ? {pid: procs.router.pid} : {}),
      // The gateway's retries and breaker decide what users see under a fault (pdchaos's own pins bypass them).
      routerSettings: procs?.router
        ? routerSettingsFromArgv([procs.router.args], `router command line (pid ${procs.router.pid})`)
        : {
            ...routerSettingsFromArgv([], 'router process not found'),
            source: "router process not found on the host: the gateway's defaults are shown, unverified",
          },
    },
  }
  if (deployment.sglangVersion) {
    for (const name of ['prefill', 'decode'] as const) {
      const v = services[name].version
      if (v && v !== deployment.sglangVersion)
        warnings.push(`${name} runs SGLang ${v}, the deployment file expects ${deployment.sglangVersion}`)
    }
  }
  return services
}

/** Each server's pid, launch and docker-proxy; its scheduler count checked against its layout; each rank's GPU. */
function placeRanks(
  here: ReadonlySet<ServiceName>,
  services: Record<ServiceName, ServiceStatus>,
  procs: ProcessView | undefined,
  ranks: RankInfo[],
  warnings: string[],
): void {
  for (const name of (['prefill', 'decode'] as const).filter(n => here.has(n))) {
    services[name].pid = procs?.servicePids[name]
    if (procs?.launch[name]) services[name].launch = procs.launch[name]
    if (procs?.dockerProxy[name]) services[name].dockerProxy = procs.dockerProxy[name]
    const layout = layoutOf(services[name])
    const found = ranks.filter(r => r.service === name).length
    if (procs && layout) {
      // DP attention splits the TP group; plain DP runs dp_size whole TP groups (one scheduler per GPU either way).
      // Over --nnodes N each node runs its share of them.
      const nodes = layout.nnodes ?? 1
      const expected = Math.max(
        1,
        Math.floor((layout.tpSize * layout.ppSize * (layout.enableDpAttention ? 1 : layout.dpSize)) / nodes),
      )
      const onNode = nodes > 1 ? ` on node rank ${services[name].launch?.args.nodeRank ?? 0} of ${nodes}` : ''
      if (found !== expected)
        warnings.push(
          `${name}: its layout (tp ${layout.tpSize}, ` +
            `dp ${layout.dpSize}${layout.enableDpAttention ? ' with DP attention' : ''}, ` +
            `pp ${layout.ppSize}${nodes > 1 ? `, nnodes ${nodes}` : ''}) means ${expected} scheduler ` +
            `processes${onNode} but ${found} were found`,
        )
    }
  }
  if (procs) assignGpus(ranks, services, procs, warnings)
}

/** How /health judges a server: from its environment, else (the twin) from its server_info. */
function healthCheckOf(
  name: 'prefill' | 'decode',
  services: Record<ServiceName, ServiceStatus>,
  procs: ProcessView | undefined,
): HealthCheckSettings {
  // The HTTP server process reads SGLANG_HEALTH_CHECK_TIMEOUT; its schedulers inherit the same environment.
  const env = procs?.serviceEnv[name] ?? procs?.ranks.find(r => r.service === name && r.env)?.env
  const hc = healthCheckFromEnv(env)
  const twin = services[name].twinHealthTimeoutSeconds
  return env?.SGLANG_HEALTH_CHECK_TIMEOUT === undefined && twin !== undefined
    ? {
        ...hc,
        timeoutSeconds: twin,
        source: `the twin's server_info (pdchaos_twin.health_check_timeout_s = ${twin})`,
      }
    : hc
}

/**
 * Each prefill rank's ZMQ PULL port, from the bootstrap route under the rank's own key (it changes on every restart).
 */
async function readRoutes(
  deployment: Deployment,
  prefill: ServiceClients['prefill'],
  prefillStatus: ServiceStatus,
  ranks: RankInfo[],
  soft: Soft,
): Promise<void> {
  const bootstrapUrl = bootstrapUrlOf(deployment)
  const prefillRanks = ranks.filter(r => r.service === 'prefill')
  const attnTp = await attnTpSizeOf(prefillStatus, prefillRanks, () =>
    soft(
      'bootstrap route (prefill server info)',
      prefill.bootstrapRoute(bootstrapUrl, {
        prefill_dp_rank: -1,
        prefill_cp_rank: -1,
        target_tp_rank: -1,
        target_pp_rank: -1,
      }),
    ),
  )
  await Promise.all(
    prefillRanks.map(async rank => {
      const key = routeKeyOf(rank, attnTp)
      rank.routeKey = key
      const route = await soft(
        `bootstrap route for prefill ${rankName(rank)} (dp ${key.dp} cp ${key.cp} tp ${key.tp} pp ${key.pp})`,
        prefill.bootstrapRoute(bootstrapUrl, {
          prefill_dp_rank: key.dp,
          prefill_cp_rank: key.cp,
          target_tp_rank: key.tp,
          target_pp_rank: key.pp,
        }),
      )
      const r = route as {rank_ip?: string; rank_port?: number} | undefined
      if (r?.rank_port !== undefined) {
        rank.zmqPort = Number(r.rank_port)
        rank.zmqHost = r.rank_ip
      }
    }),
  )
}

/**
 * SGLang's PD timeouts, each read once from the role that reads it (sglang-timeouts.ts), and the watchdog view built
 * from that one reading: prefill's watchdog environment, the timeouts it competes with, decode's heartbeat bound.
 */
function timeoutsOf(
  deployment: Deployment,
  here: ReadonlySet<ServiceName>,
  services: Record<ServiceName, ServiceStatus>,
  procs: ProcessView | undefined,
  ranks: RankInfo[],
  warnings: string[],
): Pick<StatusReport, 'watchdog' | 'sglangTimeouts'> {
  const contract = deployment.watchdog
  const prefillRanks = ranks.filter(r => r.service === 'prefill')
  // Each timeout from the role that reads it: its scheduler's environment first (the reader), else its server's.
  const readsOf = (role: 'prefill' | 'decode'): RoleReads | undefined => {
    if (!here.has(role)) return undefined
    const rank = ranks.find(r => r.service === role && r.env)
    const serverPid = procs?.servicePids[role]
    const serverEnv = procs?.serviceEnv[role]
    const env = rank?.env
      ? {pid: rank.pid, what: `${role} scheduler ${rankName(rank)}`, env: rank.env}
      : serverEnv && serverPid !== undefined
        ? {pid: serverPid, what: `${role} server`, env: serverEnv}
        : role === 'prefill' && procs?.prefillEnv && prefillRanks[0]
          ? {pid: prefillRanks[0].pid, what: 'prefill scheduler', env: procs.prefillEnv}
          : undefined
    const launch = procs?.launchVars[role]
    return env || launch ? {...(env ? {env} : {}), ...(launch ? {launch} : {})} : undefined
  }
  const version = services.prefill.version ?? services.decode.version
  const backendStated = services.prefill.backend ?? (deployment.backend === 'auto' ? undefined : deployment.backend)
  const decodeReads = readsOf('decode')
  const sglangTimeouts = sglangTimeoutsOf({
    prefill: readsOf('prefill'),
    decode: decodeReads,
    ...(version ? {version} : {}),
    versionSource: services.prefill.version
      ? "prefill's server_info"
      : services.decode.version
        ? "decode's server_info"
        : 'not stated by the servers',
    ...(backendStated ? {backend: backendStated} : {}),
  })
  const timeouts: EnvTimeouts | undefined =
    procs?.prefillEnv || decodeReads?.env
      ? {
          bootstrapTimeout: sglangTimeouts.bootstrap.seconds ?? Number.POSITIVE_INFINITY,
          waitingTimeout: sglangTimeouts.waiting.seconds!,
          heartbeatInterval: sglangTimeouts.heartbeat.intervalSeconds,
          heartbeatMaxFailure: sglangTimeouts.heartbeat.maxFailure,
        }
      : undefined
  // Decode's heartbeat toward prefill: the same reading (known only where decode's environment was read).
  const heartbeat = heartbeatSettingsOf(sglangTimeouts.heartbeat)
  let prefillEnv: EnvWatchdog | undefined
  if (procs?.prefillEnv) {
    prefillEnv = watchdogFromEnv(procs.prefillEnv)
    warnings.push(...watchdogWarnings(prefillEnv, contract, timeouts!, 'prefill'))
  }
  return {watchdog: {contract, prefillEnv, timeouts, ...(heartbeat ? {heartbeat} : {})}, sglangTimeouts}
}

/** The KV transport: prefill's stated backend (else the file's), its transport variables, the twin's data path. */
function transportOf(
  deployment: Deployment,
  prefill: ServiceStatus,
  procs: ProcessView | undefined,
  warnings: string[],
): StatusReport['transport'] {
  const backendSeen = prefill.backend
  const transportEnv = Object.fromEntries(
    Object.entries(procs?.prefillEnv ?? {}).filter(([k]) => /^(UCX_|MC_|NIXL_)/.test(k)),
  )
  const transport: StatusReport['transport'] = {
    ...(backendSeen
      ? {backend: backendSeen, source: 'prefill server_info disaggregation_transfer_backend'}
      : {backend: deployment.backend, source: 'deployment file'}),
    ...(Object.keys(transportEnv).length > 0 ? {env: transportEnv} : {}),
    ...(prefill.kvDataPath ? {dataPath: prefill.kvDataPath} : {}),
    ...(prefill.twinRails?.length ? {rails: prefill.twinRails} : {}),
  }
  if (backendSeen && deployment.backend !== 'auto' && backendSeen !== deployment.backend) {
    warnings.push(`prefill uses the ${backendSeen} backend, the deployment file says ${deployment.backend}`)
  }
  return transport
}

export function bootstrapUrlOf(deployment: Deployment): string {
  const u = new URL(deployment.services.prefill.url)
  return (
    `${u.protocol}//${u.hostname.includes(':') ? `[${u.hostname}]` : u.hostname}:` +
    `${deployment.services.prefill.bootstrapPort}`
  )
}

function infoSummary(info: Record<string, unknown> | undefined): Partial<ServiceStatus> {
  if (!info) return {}
  const str = (v: unknown) => (typeof v === 'string' ? v : undefined)
  const n = (v: unknown) => (typeof v === 'number' ? v : undefined)
  const twin = info.pdchaos_twin as
    | {failpoint_path?: unknown; kv_data_path?: unknown; rails?: unknown; health_check_timeout_s?: unknown}
    | undefined
  const rails = twinRailsOf(twin?.rails)
  const healthS = n(twin?.health_check_timeout_s)
  return {
    version: str(info.version),
    tpSize: n(info.tp_size),
    dpSize: n(info.dp_size),
    ppSize: n(info.pp_size),
    attnCpSize: n(info.attn_cp_size),
    ...(typeof info.enable_dp_attention === 'boolean' ? {enableDpAttention: info.enable_dp_attention} : {}),
    baseGpuId: n(info.base_gpu_id),
    gpuIdStep: n(info.gpu_id_step),
    backend: str(info.disaggregation_transfer_backend),
    twinFailpointPath: str(twin?.failpoint_path),
    kvDataPath: str(twin?.kv_data_path),
    ...(rails.length ? {twinRails: rails} : {}),
    ...(healthS !== undefined && healthS > 0 ? {twinHealthTimeoutSeconds: healthS} : {}),
  }
}

/** The twin's rails: [{gpu, interface, address, udp_port}], anything malformed dropped. */
export function twinRailsOf(raw: unknown): TwinRail[] {
  if (!Array.isArray(raw)) return []
  const out: TwinRail[] = []
  for (const r of raw as Array<Record<string, unknown>>) {
    if (!r || typeof r !== 'object') continue
    const gpu = r.gpu
    const iface = r.interface
    if (
      typeof gpu !== 'number' ||
      !Number.isInteger(gpu) ||
      typeof iface !== 'string' ||
      !/^[A-Za-z0-9_.:-]{1,15}$/.test(iface)
    )
      continue
    const port = typeof r.udp_port === 'number' ? r.udp_port : 4791
    out.push({gpu, interface: iface, udpPort: port, ...(typeof r.address === 'string' ? {address: r.address} : {})})
  }
  return out
}

function pick(metrics: ParsedMetrics | undefined, names: readonly string[], sum: boolean): Record<string, number> {
  const out: Record<string, number> = {}
  if (!metrics) return out
  for (const name of names) {
    const v = sum
      ? metrics.samples.some(s => s.name === name)
        ? sumOf(metrics.samples, name)
        : undefined
      : sampleValue(metrics.samples, name)
    if (v !== undefined) out[name] = v
  }
  return out
}

interface ProcessView {
  ranks: RankInfo[]
  servicePids: Partial<Record<'prefill' | 'decode', number>>
  /** The router's command line (ps args of the process listening on its port), when found. */
  router?: {pid: number; args: string}
  prefillEnv?: Record<string, string>
  /** The kept variables of each server's HTTP process. */
  serviceEnv: Partial<Record<'prefill' | 'decode', Record<string, string>>>
  launch: Partial<Record<'prefill' | 'decode', {pid: number; source: string; args: LaunchArgs}>>
  /** SGLang's PD variables set as `NAME=value` words on a server's command line or its parents' (a wrapper's). */
  launchVars: Partial<Record<'prefill' | 'decode', {pid: number; vars: Record<string, string>}>>
  dockerProxy: Partial<Record<'prefill' | 'decode', {pid: number; containerPort?: number}>>
  /** nvidia-smi's answer: each pid's busiest compute context, and the GPU list (undefined when nvidia-smi failed). */
  gpuByPid?: Map<number, PidGpu>
  gpuList: GpuRow[]
  gpuWarning?: string
  topology?: Topology
  topologyError?: string
}

/** A rank's name as its title spells it: DP1 PP0 TP3. */
export function rankName(r: Pick<RankInfo, 'tpRank' | 'dpRank' | 'ppRank' | 'attnCpRank'>): string {
  return [
    r.dpRank === undefined ? '' : `DP${r.dpRank}`,
    r.ppRank === undefined ? '' : `PP${r.ppRank}`,
    r.attnCpRank === undefined ? '' : `ATTN_CP${r.attnCpRank}`,
    `TP${r.tpRank}`,
  ]
    .filter(Boolean)
    .join(' ')
}

/** A server's layout for GPU placement: its launch arguments first (what it was started with), then server_info. */
export function layoutOf(s: ServiceStatus): Omit<GpuLayout, 'cudaVisibleDevices'> | undefined {
  const a = s.launch?.args ?? {}
  const tpSize = a.tpSize ?? s.tpSize
  if (tpSize === undefined) return undefined
  return {
    tpSize,
    dpSize: a.dpSize ?? s.dpSize ?? 1,
    ppSize: a.ppSize ?? s.ppSize ?? 1,
    enableDpAttention: a.enableDpAttention ?? s.enableDpAttention ?? false,
    baseGpuId: a.baseGpuId ?? s.baseGpuId ?? 0,
    gpuIdStep: a.gpuIdStep ?? s.gpuIdStep ?? 1,
    ...(a.nnodes !== undefined && a.nnodes > 1 ? {nnodes: a.nnodes} : {}),
  }
}

/**
 * Each rank's GPU: the compute context nvidia-smi shows it using the most memory; when nvidia-smi lists none for it (a
 * container's nvidia-smi sees no host pids), the GPU its server's layout, --base-gpu-id and CUDA_VISIBLE_DEVICES give.
 */
function assignGpus(
  ranks: RankInfo[],
  services: Record<ServiceName, ServiceStatus>,
  procs: ProcessView,
  warnings: string[],
): void {
  for (const r of ranks) {
    const seen = procs.gpuByPid?.get(r.pid)
    const layout = layoutOf(services[r.service])
    const cvd = r.env?.CUDA_VISIBLE_DEVICES ?? procs.serviceEnv[r.service]?.CUDA_VISIBLE_DEVICES
    const computed = layout
      ? gpuFromLayout({...layout, ...(cvd === undefined ? {} : {cudaVisibleDevices: cvd})}, r, procs.gpuList)
      : undefined
    const how =
      computed && layout
        ? `gpu_id ${computed.local} (base-gpu-id ${layout.baseGpuId} ` +
          `+ ${rankName(r)})${cvd === undefined ? '' : ` of CUDA_VISIBLE_DEVICES=${cvd}`}`
        : undefined
    if (seen) {
      r.gpu = seen.index
      r.gpuSource =
        `nvidia-smi: the context using the most ` +
        `memory${seen.usedMiB === undefined ? '' : ` (${seen.usedMiB} MiB)`}, of ${seen.contexts}`
      if (computed && computed.index !== seen.index)
        warnings.push(
          `${r.service} ${rankName(r)} (pid ${r.pid}) computes on GPU ${seen.index} (nvidia-smi) but its launch ` +
            `layout gives GPU ${computed.index} (${how})`,
        )
    } else if (computed) {
      r.gpu = computed.index
      r.gpuSource = how
    }
  }
  const missing = ranks.filter(r => r.gpu === undefined)
  if (missing.length > 0 && procs.gpuWarning) warnings.push(procs.gpuWarning)
  else if (missing.length > 0)
    warnings.push(
      `the GPU of ${missing.map(r => `${r.service} ${rankName(r)}`).join(', ')} is unknown: nvidia-smi lists no ` +
        `context for it and its server's layout is unknown, so --gpu cannot be resolved`,
    )
}

/**
 * Attention TP size: tp / dp with DP attention (tp / attn_cp too), else tp; else the bootstrap server's own statement.
 */
async function attnTpSizeOf(
  info: ServiceStatus,
  ranks: RankInfo[],
  route: () => Promise<Record<string, unknown> | undefined>,
): Promise<number> {
  const layout = layoutOf(info)
  if (layout)
    return Math.max(
      1,
      Math.floor(layout.tpSize / (layout.enableDpAttention ? layout.dpSize : 1) / (info.attnCpSize ?? 1)),
    )
  if (ranks.length === 0) return 1
  const stated = Number((await route())?.attn_tp_size)
  return Number.isInteger(stated) && stated > 0 ? stated : Math.max(...ranks.map(r => r.tpRank)) + 1
}

/**
 * The key a prefill scheduler registers under: dp_group (the attention DP rank, or the system DP rank with plain DP),
 * attn_cp_rank, attn_tp_rank (the title's TP rank within its attention group), pp_rank.
 */
export function routeKeyOf(
  r: Pick<RankInfo, 'tpRank' | 'dpRank' | 'ppRank' | 'attnCpRank'>,
  attnTpSize: number,
): RouteKey {
  return {dp: r.dpRank ?? 0, cp: r.attnCpRank ?? 0, tp: r.tpRank % attnTpSize, pp: r.ppRank ?? 0}
}

/**
 * The kept variables (KEPT_ENV) of each pid, one read for all: a constant script, pids as arguments. Each block is
 * RS, the pid, then NAME=value lines (a value holding a newline loses its continuation, which no kept variable has),
 * or US when the environment cannot be read.
 */
export const ENVIRON_SCRIPT = [
  'for p in "$@"; do',
  '  printf \'\\036%s\\n\' "$p"',
  // An environment that cannot be read (no privilege) is marked (US), so that it is not taken for an empty one.
  '  if [ -r "/proc/$p/environ" ]; then',
  "    tr '\\000' '\\n' < \"/proc/$p/environ\" | grep -E '^(UCX_|MC_|NIXL_|SGLANG_|CUDA_VISIBLE_DEVICES=)' || true",
  "  else printf '\\037unreadable\\n'; fi",
  'done',
].join('\n')

export function parseEnvironBlocks(stdout: string): Map<number, Record<string, string>> {
  const out = new Map<number, Record<string, string>>()
  for (const block of stdout.split('\u001E')) {
    const lines = block.split('\n')
    const pid = Number(lines[0]?.trim())
    if (!Number.isInteger(pid) || pid <= 0) continue
    // Not readable: no environment known for this pid (an empty one would read as "every variable unset").
    if (lines.slice(1).some(l => l.startsWith('\u001F'))) continue
    const env: Record<string, string> = {}
    for (const l of lines.slice(1)) {
      const eq = l.indexOf('=')
      if (eq > 0 && KEPT_ENV.test(l)) env[l.slice(0, eq)] = l.slice(eq + 1)
    }
    out.set(pid, env)
  }
  return out
}

/**
 * A config file per server that names one, read in one call: pairs of pid and path as arguments, each block RS, the
 * pid, then the file (a relative path is the process's own, under /proc/<pid>/cwd), or US and the reason it failed.
 */
export const CONFIG_SCRIPT = [
  'while [ "$#" -gt 1 ]; do',
  '  p=$1; f=$2; shift 2',
  '  printf \'\\036%s\\n\' "$p"',
  '  case "$f" in /*) ;; *) f="/proc/$p/cwd/$f" ;; esac',
  '  cat -- "$f" 2>/dev/null || printf \'\\037cannot read %s\\n\' "$f"',
  'done',
].join('\n')

export function parseConfigBlocks(stdout: string): Map<number, {text?: string; error?: string}> {
  const out = new Map<number, {text?: string; error?: string}>()
  for (const block of stdout.split('\u001E')) {
    const nl = block.indexOf('\n')
    const pid = Number(block.slice(0, nl < 0 ? undefined : nl).trim())
    if (!Number.isInteger(pid) || pid <= 0) continue
    const body = nl < 0 ? '' : block.slice(nl + 1)
    const us = body.indexOf('\u001F')
    out.set(pid, us >= 0 ? {error: body.slice(us + 1).trim()} : {text: body})
  }
  return out
}

/**
 * The process behind a service port. docker-proxy owns a published port on the host: the server is the process on
 * the proxy's container port (when this network namespace shows it), never the proxy.
 */
export function serviceOwner(
  port: number,
  listeners: Listener[],
  byPid: Map<number, ProcessRow>,
): {pid?: number; proxy?: {pid: number; containerPort?: number}} {
  const isProxy = (pid: number) => parseDockerProxy(byPid.get(pid)?.args ?? '') !== undefined
  const owner = listeners.find(l => l.port === port && l.pids.length > 0)?.pids[0]
  // Without pids (no privilege), ps still shows the proxy that publishes this port.
  const proxyRow =
    owner !== undefined
      ? isProxy(owner)
        ? byPid.get(owner)
        : undefined
      : [...byPid.values()].find(r => parseDockerProxy(r.args)?.hostPort === port)
  if (owner !== undefined && !proxyRow) return {pid: owner}
  if (!proxyRow) return {}
  const containerPort = parseDockerProxy(proxyRow.args)?.containerPort
  const inner =
    containerPort === undefined
      ? undefined
      : listeners.find(l => l.port === containerPort && l.pids.some(p => !isProxy(p)))?.pids.find(p => !isProxy(p))
  return {
    ...(inner === undefined ? {} : {pid: inner}),
    proxy: {pid: proxyRow.pid, ...(containerPort === undefined ? {} : {containerPort})},
  }
}

/**
 * Ranks by process title, assigned to prefill or decode by their parent: the process listening on the service's
 * HTTP port (SGLang's HTTP server runs in the launch process whose children are the schedulers).
 */
async function readProcesses(host: Host, deployment: Deployment, timeoutMs: number): Promise<ProcessView> {
  const ps = await host.run(['ps', '-eo', 'pid=,ppid=,stat=,args='], {timeoutMs})
  if (ps.code !== 0) throw new Error(`ps failed: ${oneLine(ps.stderr)}`)
  const rows = parsePs(ps.stdout)
  const ss = await host.run(['ss', '-Hltnp'], {timeoutMs, sudo: true})
  const listeners = ss.code === 0 ? parseSsListeners(ss.stdout) : []
  const byPid = new Map(rows.map(r => [r.pid, r]))
  const owners = serviceOwners(deployment, listeners, byPid)
  const {servicePids, dockerProxy} = owners
  const router = routerProcess(deployment, rows, listeners, byPid)
  const {ranks, launchOf, serverOf} = await readRanks(host, rows, byPid, owners, timeoutMs)
  const launch: ProcessView['launch'] = {}
  for (const name of ['prefill', 'decode'] as const) {
    const pid = servicePids[name] ?? serverOf.get(ranks.find(r => r.service === name)?.pid ?? -1)
    const l = pid === undefined ? undefined : launchOf.get(pid)
    if (l && pid !== undefined) launch[name] = {pid, source: l.source, args: l.args}
  }
  const launchVars = launchVarsOfServers(launch, servicePids, byPid)
  if (ranks.length === 0)
    return {
      ranks,
      servicePids,
      ...(router ? {router} : {}),
      serviceEnv: {},
      launch,
      launchVars,
      dockerProxy,
      gpuList: [],
    }
  await readRankStats(host, ranks, timeoutMs)
  const gpus = await readGpus(host, deployment, timeoutMs)
  ranks.sort((a, b) =>
    a.service === b.service
      ? (a.dpRank ?? 0) - (b.dpRank ?? 0) || (a.ppRank ?? 0) - (b.ppRank ?? 0) || a.tpRank - b.tpRank
      : a.service === 'prefill'
        ? -1
        : 1,
  )
  const {prefillEnv, serviceEnv} = await readEnvironments(host, ranks, servicePids, timeoutMs)
  return {
    ranks,
    servicePids,
    ...(router ? {router} : {}),
    prefillEnv,
    serviceEnv,
    launch,
    launchVars,
    dockerProxy,
    ...(gpus.gpuByPid ? {gpuByPid: gpus.gpuByPid} : {}),
    gpuList: gpus.gpuList,
    ...(gpus.gpuWarning ? {gpuWarning: gpus.gpuWarning} : {}),
    ...(gpus.topology ? {topology: gpus.topology} : {}),
    ...(gpus.topologyError ? {topologyError: gpus.topologyError} : {}),
  }
}

const portOf = (url: string) => Number(new URL(url).port || (url.startsWith('https') ? 443 : 80))

/** Each server's process behind its port (or docker-proxy's), and the ports it may have been launched with. */
interface ServiceOwners {
  servicePids: ProcessView['servicePids']
  dockerProxy: ProcessView['dockerProxy']
  /** The ports a role's server may be launched with: the deployment's, or the container port behind docker-proxy. */
  launchPorts: Record<'prefill' | 'decode', number[]>
}

function serviceOwners(deployment: Deployment, listeners: Listener[], byPid: Map<number, ProcessRow>): ServiceOwners {
  const servicePids: ProcessView['servicePids'] = {}
  const dockerProxy: ProcessView['dockerProxy'] = {}
  const launchPorts: Record<'prefill' | 'decode', number[]> = {prefill: [], decode: []}
  for (const name of ['prefill', 'decode'] as const) {
    const port = portOf(deployment.services[name].url)
    const o = serviceOwner(port, listeners, byPid)
    if (o.pid !== undefined) servicePids[name] = o.pid
    if (o.proxy) dockerProxy[name] = o.proxy
    launchPorts[name] = [port, ...(o.proxy?.containerPort === undefined ? [] : [o.proxy.containerPort])]
  }
  return {servicePids, dockerProxy, launchPorts}
}

/** The router: the process listening on its port, else a gateway command line naming that port. */
function routerProcess(
  deployment: Deployment,
  rows: ProcessRow[],
  listeners: Listener[],
  byPid: Map<number, ProcessRow>,
): ProcessView['router'] {
  const routerPid = listeners.find(l => l.port === portOf(deployment.services.router.url) && l.pids.length > 0)?.pids[0]
  const routerRow =
    routerPid === undefined
      ? rows.find(
          r =>
            isRouterCommand([r.args]) &&
            new RegExp(`--port[ =]${portOf(deployment.services.router.url)}\\b`).test(r.args),
        )
      : byPid.get(routerPid)
  return routerRow ? {pid: routerRow.pid, args: routerRow.args} : undefined
}

/** The scheduler processes by title, each assigned to its server, with the launch arguments of every server. */
async function readRanks(
  host: Host,
  rows: ProcessRow[],
  byPid: Map<number, ProcessRow>,
  owners: ServiceOwners,
  timeoutMs: number,
): Promise<{
  ranks: RankInfo[]
  launchOf: Map<number, {source: string; args: LaunchArgs}>
  serverOf: Map<number, number>
}> {
  const {servicePids, launchPorts} = owners
  const rankRows = rows.map(r => ({row: r, title: parseRankTitle(r.args)})).filter(x => x.title !== undefined)
  // The launch arguments of every server a scheduler may belong to: its ancestors, and the processes on the ports.
  const candidates = new Set<number>(Object.values(servicePids))
  for (const {row} of rankRows) {
    let cur = byPid.get(row.ppid)
    for (let i = 0; i < 4 && cur; i++, cur = byPid.get(cur.ppid)) if (isServerLaunch(cur.args)) candidates.add(cur.pid)
  }
  const launchOf = await readLaunchArgs(
    host,
    [...candidates].map(pid => byPid.get(pid)).filter((r): r is ProcessRow => r !== undefined),
    timeoutMs,
  )
  const serviceOf = (row: ProcessRow): 'prefill' | 'decode' | undefined => {
    // Walk up a few parents: with DP, schedulers may sit under a data-parallel controller.
    let cur: ProcessRow | undefined = row
    for (let i = 0; i < 4 && cur; i++) {
      if (cur.ppid === servicePids.prefill) return 'prefill'
      if (cur.ppid === servicePids.decode) return 'decode'
      // Without privilege ss shows no pids: read the launch arguments instead (command line and config file), mode
      // AND port, since one host can run several deployments (SGLang's --port defaults to 30000).
      const a = launchOf.get(cur.ppid)?.args
      // Only when ss named no owner for that role: with an owner known, any other server is another deployment.
      if (a?.mode && servicePids[a.mode] === undefined && launchPorts[a.mode].includes(a.port ?? 30_000)) return a.mode
      cur = byPid.get(cur.ppid)
    }
    return undefined
  }
  const ranks: RankInfo[] = []
  const serverOf = new Map<number, number>()
  for (const {row, title} of rankRows) {
    const service = serviceOf(row)
    if (!service) continue
    ranks.push({service, ...title!, pid: row.pid, state: row.stat.charAt(0), title: row.args})
    let cur = byPid.get(row.ppid)
    for (let i = 0; i < 4 && cur && !launchOf.has(cur.pid); i++) cur = byPid.get(cur.ppid)
    if (cur) serverOf.set(row.pid, cur.pid)
  }
  return {ranks, launchOf, serverOf}
}

/** SGLang's PD variables as `NAME=value` words on each server's command line or its parents' (a wrapper's). */
function launchVarsOfServers(
  launch: ProcessView['launch'],
  servicePids: ProcessView['servicePids'],
  byPid: Map<number, ProcessRow>,
): ProcessView['launchVars'] {
  const launchVars: ProcessView['launchVars'] = {}
  for (const name of ['prefill', 'decode'] as const) {
    const pid = launch[name]?.pid ?? servicePids[name]
    let cur = pid === undefined ? undefined : byPid.get(pid)
    const vars: Record<string, string> = {}
    // The server's own words win over a wrapper's further up.
    for (let i = 0; i < 4 && cur; i++, cur = byPid.get(cur.ppid))
      for (const [k, v] of Object.entries(launchVarsOf(cur.args))) vars[k] ??= v
    if (pid !== undefined && Object.keys(vars).length > 0) launchVars[name] = {pid, vars}
  }
  return launchVars
}

/** Each rank's start time (its identity with the pid) and state, from /proc/<pid>/stat. */
async function readRankStats(host: Host, ranks: RankInfo[], timeoutMs: number): Promise<void> {
  const stat = await host.run(['cat', ...ranks.map(r => `/proc/${r.pid}/stat`)], {timeoutMs})
  for (const line of stat.stdout.split('\n')) {
    const s = parseProcStat(line)
    const rank = s && ranks.find(r => r.pid === s.pid)
    if (rank && s) {
      rank.startTicks = s.startTicks
      rank.state = s.state
    }
  }
}

/** nvidia-smi: each pid's busiest compute context, the GPU list, and the GPU/NIC topology. */
async function readGpus(
  host: Host,
  deployment: Deployment,
  timeoutMs: number,
): Promise<Pick<ProcessView, 'gpuByPid' | 'gpuList' | 'gpuWarning' | 'topology' | 'topologyError'>> {
  const [apps, gpus, topo] = await Promise.all([
    host
      .run(
        [deployment.tools.nvidiaSmi, '--query-compute-apps=pid,gpu_uuid,used_memory', '--format=csv,noheader,nounits'],
        {timeoutMs},
      )
      .catch(() => undefined),
    host
      .run([deployment.tools.nvidiaSmi, '--query-gpu=index,uuid,name', '--format=csv,noheader'], {timeoutMs})
      .catch(() => undefined),
    host
      .run([deployment.tools.nvidiaSmi, 'topo', '-m'], {timeoutMs})
      .catch((error: unknown) => ({code: null, stdout: '', stderr: oneLine(error), durationMs: 0})),
  ])
  let topology: Topology | undefined
  let topologyError: string | undefined
  if (topo.code === 0) {
    topology = parseNvidiaTopo(topo.stdout)
    if (topology.gpus.length === 0) topologyError = `\`${deployment.tools.nvidiaSmi} topo -m\` printed no GPU matrix`
  } else {
    topologyError = `\`${deployment.tools.nvidiaSmi} topo -m\` failed: ${oneLine(topo.stderr) || `exit ${topo.code}`}`
  }
  let gpuWarning: string | undefined
  let gpuByPid: Map<number, PidGpu> | undefined
  const gpuList = gpus?.code === 0 ? parseGpuList(gpus.stdout) : []
  if (apps?.code === 0 && gpus?.code === 0) {
    gpuByPid = gpuIndexByPid(parseComputeApps(apps.stdout), gpuList)
  } else {
    gpuWarning =
      `${deployment.tools.nvidiaSmi} did not answer on ${host.describe()} ` +
      `(${oneLine(apps?.stderr ?? 'not run') || `exit ${apps?.code}`}), and the launch layout does not give every ` +
      `rank's GPU: --gpu cannot be resolved for those ranks`
  }
  return {
    ...(gpuByPid ? {gpuByPid} : {}),
    gpuList,
    ...(gpuWarning ? {gpuWarning} : {}),
    ...(topology ? {topology} : {}),
    ...(topologyError ? {topologyError} : {}),
  }
}

/** The first prefill rank's whole environment, and every rank's and server's kept variables (one read for all). */
async function readEnvironments(
  host: Host,
  ranks: RankInfo[],
  servicePids: ProcessView['servicePids'],
  timeoutMs: number,
): Promise<Pick<ProcessView, 'prefillEnv' | 'serviceEnv'>> {
  const prefill0 = ranks.find(r => r.service === 'prefill')
  let prefillEnv: Record<string, string> | undefined
  if (prefill0) {
    const env = await host.run(['cat', `/proc/${prefill0.pid}/environ`], {timeoutMs, sudo: true})
    if (env.code === 0) prefillEnv = parseEnviron(env.stdout)
  }
  // Every rank's and server's kept variables (UCX RC limits, health-check timeout, CUDA_VISIBLE_DEVICES), in one read.
  const serviceEnv: ProcessView['serviceEnv'] = {}
  const pids = [
    ...new Set([...ranks.map(r => r.pid), ...Object.values(servicePids).filter((p): p is number => p !== undefined)]),
  ]
  const envs = await host
    .run(['sh', '-c', ENVIRON_SCRIPT, 'sh', ...pids.map(String)], {timeoutMs, sudo: true})
    .catch(() => undefined)
  if (envs?.code === 0) {
    const byPid = parseEnvironBlocks(envs.stdout)
    for (const r of ranks) if (byPid.has(r.pid)) r.env = byPid.get(r.pid)
    for (const name of ['prefill', 'decode'] as const) {
      const pid = servicePids[name]
      if (pid !== undefined && byPid.has(pid)) serviceEnv[name] = byPid.get(pid)
    }
  }
  return {prefillEnv, serviceEnv}
}

/**
 * Each server's launch arguments: its command line, over its `--config` YAML file (read in one call) when it names one.
 */
async function readLaunchArgs(
  host: Host,
  servers: ProcessRow[],
  timeoutMs: number,
): Promise<Map<number, {source: string; args: LaunchArgs}>> {
  const out = new Map<number, {source: string; args: LaunchArgs}>()
  const cli = new Map(servers.map(r => [r.pid, parseLaunchCommand(r.args)]))
  const withFile = servers.filter(r => cli.get(r.pid)!.configFile !== undefined)
  type FileRead = {text?: string; error?: string}
  const files: Map<number, FileRead> =
    withFile.length === 0
      ? new Map<number, FileRead>()
      : await host
          .run(
            ['sh', '-c', CONFIG_SCRIPT, 'sh', ...withFile.flatMap(r => [String(r.pid), cli.get(r.pid)!.configFile!])],
            {timeoutMs, sudo: true},
          )
          .then(
            res => parseConfigBlocks(res.stdout),
            (error: unknown) => new Map<number, FileRead>(withFile.map(r => [r.pid, {error: oneLine(error)}])),
          )
  for (const r of servers) {
    const c = cli.get(r.pid)!
    if (c.configFile === undefined) {
      out.set(r.pid, {source: `command line (pid ${r.pid})`, args: c})
      continue
    }
    const f = files.get(r.pid)
    let fromFile: LaunchArgs = {}
    let note = ''
    try {
      if (f?.text === undefined) throw new Error(f?.error ?? 'not read')
      fromFile = parseConfigYaml(f.text)
    } catch (error) {
      note = `; the file could not be used: ${oneLine(error)}`
    }
    out.set(r.pid, {
      source: `config file ${c.configFile} under the command line (pid ${r.pid})${note}`,
      args: mergeLaunchArgs(fromFile, c),
    })
  }
  return out
}
