import type {Deployment} from '../deployment/config.js'
import {DEFAULT_PROBE_TIMEOUT_MS, serviceClients} from '../deployment/clients.js'
import type {HealthResult} from '../deployment/sglang-client.js'
import {sampleValue, sumOf, type ParsedMetrics} from '../deployment/prom-text.js'
import {PD_COUNTERS, PD_QUEUE_GAUGES, QUEUE_REQS, RUNNING_REQS, TOKEN_USAGE} from '../deployment/sglang-metrics.js'
import {oneLine} from '../errors.js'
import type {Host} from '../hosts/host.js'
import {listHostState, type HostState} from './host-state.js'
import {gpuIndexByPid, parseComputeApps, parseGpuList} from './gpus.js'
import {parseEnviron, parseProcStat, parsePs, parseRankTitle, parseSsListeners, type ProcessRow} from './proc.js'
import {isRouterCommand, type RouterSettings, routerSettingsFromArgv} from './router-settings.js'
import {parseNvidiaTopo, type Topology} from './topo.js'
import {healthCheckFromEnv, KEPT_ENV, type HealthCheckSettings} from './transport-env.js'
import {timeoutsFromEnv, watchdogFromEnv, watchdogWarnings, type EnvTimeouts, type EnvWatchdog} from './watchdog-env.js'

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
  tpRank: number
  dpRank?: number
  ppRank?: number
  pid: number
  /** /proc/<pid>/stat start time (clock ticks since boot): with the pid, the rank's identity. */
  startTicks?: number
  /** Process state letter: R/S running or sleeping, T stopped, D uninterruptible. */
  state: string
  title: string
  gpu?: number
  /** The rank's ZMQ PULL port from the bootstrap route (prefill only). */
  zmqPort?: number
  zmqHost?: string
  /** The rank's UCX_*, MC_*, NIXL_* and SGLANG_* variables (/proc/<pid>/environ; needs privilege for others' ranks). */
  env?: Record<string, string>
}

export interface StatusReport {
  deployment: {name: string; host: string; labels: Record<string, string>; backend: string}
  services: Record<ServiceName, ServiceStatus>
  ranks: RankInfo[]
  watchdog: {contract: Deployment['watchdog']; prefillEnv?: EnvWatchdog; timeouts?: EnvTimeouts}
  /** env: the prefill rank's transport variables (UCX_*, MC_*, NIXL_*), which tell whether the KV path is TCP. */
  transport: {backend: string; source: string; env?: Record<string, string>; dataPath?: string; rails?: TwinRail[]}
  /** `nvidia-smi topo -m`: which NIC shares a PCIe switch with each GPU (undefined, with topologyError, if it failed). */
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
}

export async function discover(deployment: Deployment, host: Host, opts: DiscoverOptions = {}): Promise<StatusReport> {
  const started = performance.now()
  const timeoutMs = opts.timeoutMs ?? DEFAULT_PROBE_TIMEOUT_MS
  const warnings: string[] = []
  const svc = deployment.services
  const {prefill, decode, router} = serviceClients(deployment, {timeoutMs})
  const soft = async <T>(what: string, p: Promise<T>): Promise<T | undefined> => {
    try {
      return await p
    } catch (error) {
      warnings.push(`${what}: ${oneLine(error)}`)
      return undefined
    }
  }

  // The host itself is not optional: an unreachable host, a refused key or a changed host key stops here (exit 5),
  // before any service probe can make a half-report look like an answer.
  await host.run(['true'], {timeoutMs})

  const [pHealth, dHealth, rHealth, rReady, pInfo, dInfo, pMetrics, dMetrics, procs, hostState] = await Promise.all([
    prefill.health(svc.prefill.healthPath),
    decode.health(svc.decode.healthPath),
    router.health(svc.router.healthPath),
    router.readiness(svc.router.readinessPath),
    soft('prefill server_info', prefill.serverInfo()),
    soft('decode server_info', decode.serverInfo()),
    soft('prefill metrics', prefill.metrics()),
    soft('decode metrics', decode.metrics()),
    soft(`process table on ${host.describe()}`, readProcesses(host, deployment, timeoutMs)),
    listHostState(host, deployment.stateDir, timeoutMs).catch((error: unknown) => {
      warnings.push(`pdchaos state on ${host.describe()}: ${oneLine(error)}`)
      return {leases: [], lock: null} satisfies HostState
    }),
  ])
  for (const [name, h] of [['prefill', pHealth], ['decode', dHealth], ['router', rHealth]] as const) {
    if (!h.ok) warnings.push(`${name} is not healthy: ${h.error ?? h.status}`)
  }

  const services: Record<ServiceName, ServiceStatus> = {
    prefill: {url: svc.prefill.url, health: pHealth, ...infoSummary(pInfo)},
    decode: {url: svc.decode.url, health: dHealth, ...infoSummary(dInfo)},
    router: {url: svc.router.url, health: rHealth, readiness: rReady, ...(procs?.router ? {pid: procs.router.pid} : {}),
      // The gateway's retries and breaker decide what users see under a fault (pdchaos's own pins bypass them).
      routerSettings: procs?.router ? routerSettingsFromArgv([procs.router.args], `router command line (pid ${procs.router.pid})`)
        : {...routerSettingsFromArgv([], 'router process not found'), source: "router process not found on the host: the gateway's defaults are shown, unverified"}},
  }
  if (deployment.sglangVersion) {
    for (const name of ['prefill', 'decode'] as const) {
      const v = services[name].version
      if (v && v !== deployment.sglangVersion) warnings.push(`${name} runs SGLang ${v}, the deployment file expects ${deployment.sglangVersion}`)
    }
  }

  const ranks: RankInfo[] = procs?.ranks ?? []
  if (procs?.gpuWarning) warnings.push(procs.gpuWarning)
  for (const name of ['prefill', 'decode'] as const) {
    services[name].pid = procs?.servicePids[name]
    const tp = services[name].tpSize
    const found = ranks.filter((r) => r.service === name).length
    if (procs && tp !== undefined && found !== tp) warnings.push(`${name}: server_info says tp_size ${tp} but ${found} scheduler processes were found`)
  }
  for (const name of ['prefill', 'decode'] as const) {
    // The HTTP server process reads SGLANG_HEALTH_CHECK_TIMEOUT; its schedulers inherit the same environment.
    const env = procs?.serviceEnv[name] ?? ranks.find((r) => r.service === name && r.env)?.env
    const hc = healthCheckFromEnv(env)
    const twin = services[name].twinHealthTimeoutSeconds
    services[name].healthCheck = env?.SGLANG_HEALTH_CHECK_TIMEOUT === undefined && twin !== undefined
      ? {...hc, timeoutSeconds: twin, source: `the twin's server_info (pdchaos_twin.health_check_timeout_s = ${twin})`}
      : hc
  }
  for (const r of ranks) if (r.state === 'T') warnings.push(`${r.service} rank TP${r.tpRank} (pid ${r.pid}) is stopped (state T): the instance is wedged`)

  // Each prefill rank's ZMQ PULL port, from the bootstrap route (it changes on every restart).
  const bootstrapUrl = bootstrapUrlOf(deployment)
  const prefillRanks = ranks.filter((r) => r.service === 'prefill')
  const tpCount = services.prefill.tpSize ?? prefillRanks.length
  await Promise.all(Array.from({length: tpCount}, async (_, k) => {
    const route = await soft(`bootstrap route for prefill TP${k}`, prefill.bootstrapRoute(bootstrapUrl, {prefill_dp_rank: 0, prefill_cp_rank: 0, target_tp_rank: k, target_pp_rank: 0}))
    const r = route as {rank_ip?: string; rank_port?: number} | undefined
    const rank = prefillRanks.find((x) => x.tpRank === k)
    if (rank && r?.rank_port !== undefined) {
      rank.zmqPort = Number(r.rank_port)
      rank.zmqHost = r.rank_ip
    }
  }))

  const contract = deployment.watchdog
  let prefillEnv: EnvWatchdog | undefined
  let timeouts: EnvTimeouts | undefined
  if (procs?.prefillEnv) {
    prefillEnv = watchdogFromEnv(procs.prefillEnv)
    timeouts = timeoutsFromEnv(procs.prefillEnv)
    warnings.push(...watchdogWarnings(prefillEnv, contract, timeouts, 'prefill'))
  }

  const backendSeen = services.prefill.backend
  const transportEnv = Object.fromEntries(Object.entries(procs?.prefillEnv ?? {}).filter(([k]) => /^(UCX_|MC_|NIXL_)/.test(k)))
  const transport: StatusReport['transport'] = {
    ...(backendSeen
      ? {backend: backendSeen, source: 'prefill server_info disaggregation_transfer_backend'}
      : {backend: deployment.backend, source: 'deployment file'}),
    ...(Object.keys(transportEnv).length > 0 ? {env: transportEnv} : {}),
    ...(services.prefill.kvDataPath ? {dataPath: services.prefill.kvDataPath} : {}),
    ...(services.prefill.twinRails?.length ? {rails: services.prefill.twinRails} : {}),
  }
  if (backendSeen && deployment.backend !== 'auto' && backendSeen !== deployment.backend) {
    warnings.push(`prefill uses the ${backendSeen} backend, the deployment file says ${deployment.backend}`)
  }

  return {
    deployment: {name: deployment.name, host: host.describe(), labels: deployment.labels, backend: deployment.backend},
    services,
    ranks,
    watchdog: {contract, prefillEnv, timeouts},
    transport,
    ...(procs?.topology ? {topology: procs.topology} : {}),
    ...(procs?.topologyError ? {topologyError: procs.topologyError} : {}),
    counters: {prefill: pick(pMetrics, COUNTERS, true), decode: pick(dMetrics, COUNTERS, true)},
    gauges: {prefill: pick(pMetrics, GAUGES, false), decode: pick(dMetrics, GAUGES, false)},
    hostState,
    warnings,
    ms: Math.round(performance.now() - started),
  }
}

export function bootstrapUrlOf(deployment: Deployment): string {
  const u = new URL(deployment.services.prefill.url)
  return `${u.protocol}//${u.hostname.includes(':') ? `[${u.hostname}]` : u.hostname}:${deployment.services.prefill.bootstrapPort}`
}

function infoSummary(info: Record<string, unknown> | undefined): Partial<ServiceStatus> {
  if (!info) return {}
  const str = (v: unknown) => (typeof v === 'string' ? v : undefined)
  const n = (v: unknown) => (typeof v === 'number' ? v : undefined)
  const twin = info.pdchaos_twin as {failpoint_path?: unknown; kv_data_path?: unknown; rails?: unknown; health_check_timeout_s?: unknown} | undefined
  const rails = twinRailsOf(twin?.rails)
  const healthS = n(twin?.health_check_timeout_s)
  return {
    version: str(info.version),
    tpSize: n(info.tp_size),
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
    if (typeof gpu !== 'number' || !Number.isInteger(gpu) || typeof iface !== 'string' || !/^[A-Za-z0-9_.:-]{1,15}$/.test(iface)) continue
    const port = typeof r.udp_port === 'number' ? r.udp_port : 4791
    out.push({gpu, interface: iface, udpPort: port, ...(typeof r.address === 'string' ? {address: r.address} : {})})
  }
  return out
}

function pick(metrics: ParsedMetrics | undefined, names: readonly string[], sum: boolean): Record<string, number> {
  const out: Record<string, number> = {}
  if (!metrics) return out
  for (const name of names) {
    const v = sum ? (metrics.samples.some((s) => s.name === name) ? sumOf(metrics.samples, name) : undefined) : sampleValue(metrics.samples, name)
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
  gpuWarning?: string
  topology?: Topology
  topologyError?: string
}

/**
 * The kept variables (KEPT_ENV) of each pid, one read for all: a constant script, pids as arguments. Each block is
 * RS, the pid, then NAME=value lines (a value holding a newline loses its continuation, which no kept variable has).
 */
export const ENVIRON_SCRIPT = [
  'for p in "$@"; do',
  '  printf \'\\036%s\\n\' "$p"',
  '  [ -r "/proc/$p/environ" ] && tr \'\\000\' \'\\n\' < "/proc/$p/environ" | grep -E \'^(UCX_|MC_|NIXL_|SGLANG_)\' || true',
  'done',
].join('\n')

export function parseEnvironBlocks(stdout: string): Map<number, Record<string, string>> {
  const out = new Map<number, Record<string, string>>()
  for (const block of stdout.split('\u001E')) {
    const lines = block.split('\n')
    const pid = Number(lines[0]?.trim())
    if (!Number.isInteger(pid) || pid <= 0) continue
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
 * Ranks by process title, assigned to prefill or decode by their parent: the process listening on the service's
 * HTTP port (SGLang's HTTP server runs in the launch process whose children are the schedulers).
 */
async function readProcesses(host: Host, deployment: Deployment, timeoutMs: number): Promise<ProcessView> {
  const ps = await host.run(['ps', '-eo', 'pid=,ppid=,stat=,args='], {timeoutMs})
  if (ps.code !== 0) throw new Error(`ps failed: ${oneLine(ps.stderr)}`)
  const rows = parsePs(ps.stdout)
  const ss = await host.run(['ss', '-Hltnp'], {timeoutMs, sudo: true})
  const listeners = ss.code === 0 ? parseSsListeners(ss.stdout) : []
  const portOf = (url: string) => Number(new URL(url).port || (url.startsWith('https') ? 443 : 80))
  const servicePids: ProcessView['servicePids'] = {}
  for (const name of ['prefill', 'decode'] as const) {
    const port = portOf(deployment.services[name].url)
    const owner = listeners.find((l) => l.port === port && l.pids.length > 0)
    if (owner) servicePids[name] = owner.pids[0]
  }
  const byPid = new Map(rows.map((r) => [r.pid, r]))
  const routerPid = listeners.find((l) => l.port === portOf(deployment.services.router.url) && l.pids.length > 0)?.pids[0]
  const routerRow = routerPid === undefined ? rows.find((r) => isRouterCommand([r.args]) && new RegExp(`--port[ =]${portOf(deployment.services.router.url)}\\b`).test(r.args)) : byPid.get(routerPid)
  const router = routerRow ? {pid: routerRow.pid, args: routerRow.args} : undefined
  const serviceOf = (row: ProcessRow): 'prefill' | 'decode' | undefined => {
    // Walk up a few parents: with DP, schedulers may sit under a data-parallel controller.
    let cur: ProcessRow | undefined = row
    for (let i = 0; i < 4 && cur; i++) {
      if (cur.ppid === servicePids.prefill) return 'prefill'
      if (cur.ppid === servicePids.decode) return 'decode'
      // Without privilege ss shows no pids: read the launch command instead, mode AND port, since one host can run
      // several deployments (SGLang's --port defaults to 30000).
      const args = byPid.get(cur.ppid)?.args ?? ''
      const mode = /--disaggregation-mode[ =](prefill|decode)\b/.exec(args)
      // Only when ss named no owner for that role: with an owner known, any other server is another deployment.
      if (mode && servicePids[mode[1] as 'prefill' | 'decode'] === undefined) {
        const role = mode[1] as 'prefill' | 'decode'
        const port = Number(/--port[ =](\d+)/.exec(args)?.[1] ?? 30_000)
        if (port === portOf(deployment.services[role].url)) return role
      }
      cur = byPid.get(cur.ppid)
    }
    return undefined
  }
  const rankRows = rows.map((r) => ({row: r, title: parseRankTitle(r.args)})).filter((x) => x.title !== undefined)
  const ranks: RankInfo[] = []
  for (const {row, title} of rankRows) {
    const service = serviceOf(row)
    if (!service) continue
    ranks.push({service, ...title!, pid: row.pid, state: row.stat.charAt(0), title: row.args})
  }
  if (ranks.length === 0) return {ranks, servicePids, ...(router ? {router} : {}), serviceEnv: {}}

  const stat = await host.run(['cat', ...ranks.map((r) => `/proc/${r.pid}/stat`)], {timeoutMs})
  for (const line of stat.stdout.split('\n')) {
    const s = parseProcStat(line)
    const rank = s && ranks.find((r) => r.pid === s.pid)
    if (rank && s) {
      rank.startTicks = s.startTicks
      rank.state = s.state
    }
  }

  const [apps, gpus, topo] = await Promise.all([
    host.run([deployment.tools.nvidiaSmi, '--query-compute-apps=pid,gpu_uuid', '--format=csv,noheader'], {timeoutMs}).catch(() => undefined),
    host.run([deployment.tools.nvidiaSmi, '--query-gpu=index,uuid,name', '--format=csv,noheader'], {timeoutMs}).catch(() => undefined),
    host.run([deployment.tools.nvidiaSmi, 'topo', '-m'], {timeoutMs}).catch((error: unknown) => ({code: null, stdout: '', stderr: oneLine(error), durationMs: 0})),
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
  if (apps?.code === 0 && gpus?.code === 0) {
    const map = gpuIndexByPid(parseComputeApps(apps.stdout), parseGpuList(gpus.stdout))
    for (const r of ranks) r.gpu = map.get(r.pid)?.[0]
  } else {
    gpuWarning = `${deployment.tools.nvidiaSmi} did not answer on ${host.describe()} (${oneLine(apps?.stderr ?? 'not run') || `exit ${apps?.code}`}): the GPU of each rank is unknown, so --gpu cannot be resolved`
  }

  ranks.sort((a, b) => (a.service === b.service ? a.tpRank - b.tpRank : a.service === 'prefill' ? -1 : 1))
  const prefill0 = ranks.find((r) => r.service === 'prefill')
  let prefillEnv: Record<string, string> | undefined
  if (prefill0) {
    const env = await host.run(['cat', `/proc/${prefill0.pid}/environ`], {timeoutMs, sudo: true})
    if (env.code === 0) prefillEnv = parseEnviron(env.stdout)
  }
  // Every rank's and server's kept variables (UCX RC limits, health-check timeout), in one read.
  const serviceEnv: ProcessView['serviceEnv'] = {}
  const pids = [...new Set([...ranks.map((r) => r.pid), ...Object.values(servicePids).filter((p): p is number => p !== undefined)])]
  const envs = await host.run(['sh', '-c', ENVIRON_SCRIPT, 'sh', ...pids.map(String)], {timeoutMs, sudo: true}).catch(() => undefined)
  if (envs?.code === 0) {
    const byPid = parseEnvironBlocks(envs.stdout)
    for (const r of ranks) if (byPid.has(r.pid)) r.env = byPid.get(r.pid)
    for (const name of ['prefill', 'decode'] as const) {
      const pid = servicePids[name]
      if (pid !== undefined && byPid.has(pid)) serviceEnv[name] = byPid.get(pid)
    }
  }
  return {ranks, servicePids, ...(router ? {router} : {}), prefillEnv, serviceEnv, gpuWarning, ...(topology ? {topology} : {}), ...(topologyError ? {topologyError} : {})}
}
