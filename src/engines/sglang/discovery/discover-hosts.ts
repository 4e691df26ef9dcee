import type {Deployment} from '../../../deployment/config.js'
import type {Host} from '../../../hosts/host.js'
import {
  discover,
  type DiscoverOptions,
  type RankInfo,
  type ServiceName,
  type ServiceStatus,
  type StatusReport,
} from './discover.js'
import type {NodeRankOn} from '../../../deployment/single-host.js'
import type {HostState} from '../../../discovery/host-state.js'
import type {Topology} from '../../../discovery/topo.js'

/**
 * Discovery of a deployment over several hosts: each host is read for the services that run on it (its process
 * table, ranks, GPUs, environment, leases and lock), every service's HTTP API once, and the answers are put together
 * per host and per instance. A host that cannot be reached stops it (exit 5 naming the host), as on one host.
 */

export interface HostPart {
  /** The host's name in the deployment file. */
  name: string
  /** How pdchaos reaches it (ssh user@address:port, or local). */
  host: string
  /** The services whose processes run there (node rank 0 of their instance). */
  roles: ServiceName[]
  /** The other node ranks of multi-node instances on this host: their schedulers run here, their URL on node rank 0. */
  nodeRanks?: NodeRankOn[]
  hostState: HostState
  topology?: Topology
  topologyError?: string
  ms: number
}

/**
 * A rank, with the host it runs on and, where the file lists several instances of its role, its instance; on a node
 * rank other than 0 of a multi-node instance, that node rank.
 */
export type PlacedRank = RankInfo & {host: string; instance?: string}

/**
 * One instance of prefill or decode as found on its host: where the file states it (services.prefill[1]) and its
 * status.
 */
export type InstanceStatus = ServiceStatus & {role: 'prefill' | 'decode'; path: string; host: string}

/** The single-host report's shape, each service and rank naming its host, and the hosts themselves. */
export interface DeploymentReport extends Omit<StatusReport, 'services' | 'ranks'> {
  /** Per role, its first instance (the one a single-instance file has). */
  services: Record<ServiceName, ServiceStatus & {host: string}>
  /** Every prefill and decode instance, in the file's order, when the file lists more than one of a role. */
  instances?: InstanceStatus[]
  ranks: PlacedRank[]
  hosts: HostPart[]
}

export interface HostToRead {
  name: string
  roles: ServiceName[]
  host: Host
  /** The deployment as seen from this host (its host entry, every service's URL). */
  view: Deployment
  /** The prefill and decode instances whose node rank 0 runs here, where the file lists several of a role. */
  instances?: Array<{role: 'prefill' | 'decode'; path: string}>
  /** The other node ranks of multi-node instances that run here (their schedulers are read here). */
  nodeRanks?: NodeRankOn[]
}

export async function discoverAcrossHosts(
  hosts: HostToRead[],
  opts: Omit<DiscoverOptions, 'here'> = {},
): Promise<DeploymentReport> {
  const started = performance.now()
  // A host is read for the roles it serves and for the schedulers of node ranks it runs for an instance elsewhere.
  const hereOf = (h: HostToRead): ServiceName[] => [...new Set([...h.roles, ...(h.nodeRanks ?? []).map(n => n.role)])]
  const parts = await Promise.all(
    hosts.map(async h => ({...h, report: await discover(h.view, h.host, {...opts, here: hereOf(h)})})),
  )
  const of = (role: ServiceName) => parts.find(p => p.roles.includes(role)) ?? parts[0]!
  const [p, d, r] = [of('prefill'), of('decode'), of('router')]
  const services = Object.fromEntries(
    (['prefill', 'decode', 'router'] as const).map(role => [
      role,
      {...of(role).report.services[role], host: of(role).name},
    ]),
  ) as DeploymentReport['services']
  const warnings = warningsAcross(parts)
  return {
    deployment: {...r.report.deployment, host: parts.map(x => `${x.name} (${x.report.deployment.host})`).join(', ')},
    services,
    ...(hosts.some(h => h.instances?.length) ? {instances: instancesOf(parts)} : {}),
    ranks: ranksAcross(parts),
    sglangTimeouts: sglangTimeoutsAcross(p.report, d.report),
    watchdog: watchdogAcross(p, d),
    transport: transportAcross(p.report, d.report),
    ...(p.report.topology ? {topology: p.report.topology} : {}),
    ...(p.report.topologyError ? {topologyError: p.report.topologyError} : {}),
    counters: {prefill: p.report.counters.prefill, decode: d.report.counters.decode},
    gauges: {prefill: p.report.gauges.prefill, decode: d.report.gauges.decode},
    hostState: {
      leases: parts.flatMap(x => x.report.hostState.leases),
      lock: parts.map(x => x.report.hostState.lock).find(l => l !== null) ?? null,
    },
    hosts: parts.map(x => ({
      name: x.name,
      host: x.report.deployment.host,
      roles: x.roles,
      ...(x.nodeRanks?.length ? {nodeRanks: x.nodeRanks} : {}),
      hostState: x.report.hostState,
      ...(x.report.topology ? {topology: x.report.topology} : {}),
      ...(x.report.topologyError ? {topologyError: x.report.topologyError} : {}),
      ms: x.report.ms,
    })),
    warnings,
    ms: Math.round(performance.now() - started),
  }
}

type ReadPart = HostToRead & {report: StatusReport}

/** A warning every host gave (a service's HTTP answer) once; one only some hosts gave, with the host's name. */
function warningsAcross(parts: ReadPart[]): string[] {
  const all = parts.map(x => x.report.warnings)
  const everywhere = all[0]!.filter(w => all.every(ws => ws.includes(w)))
  return [
    ...everywhere,
    ...parts.flatMap(x => x.report.warnings.filter(w => !everywhere.includes(w)).map(w => `${x.name}: ${w}`)),
  ]
}

/** Every host's ranks, each naming its host, its instance and (off node rank 0) its node rank. */
function ranksAcross(parts: ReadPart[]): PlacedRank[] {
  return parts.flatMap(x =>
    x.report.ranks.map(k => {
      const node = x.nodeRanks?.find(n => n.role === k.service && !x.roles.includes(k.service))
      const instance = node?.path ?? x.instances?.find(i => i.role === k.service)?.path
      return {...k, host: x.name, ...(instance ? {instance} : {}), ...(node ? {nodeRank: node.nodeRank} : {})}
    }),
  )
}

/** Each SGLang timeout from the host of the role that reads it. */
function sglangTimeoutsAcross(p: StatusReport, d: StatusReport): StatusReport['sglangTimeouts'] {
  return {
    ...d.sglangTimeouts,
    bootstrap: p.sglangTimeouts.bootstrap,
    version: p.sglangTimeouts.version ?? d.sglangTimeouts.version,
    versionSource: p.sglangTimeouts.version ? p.sglangTimeouts.versionSource : d.sglangTimeouts.versionSource,
    ...(p.sglangTimeouts.backend ? {backend: p.sglangTimeouts.backend} : {}),
  }
}

/** Bootstrap timeout from prefill's environment, waiting and heartbeat from decode's: each read on its own host. */
function watchdogAcross(p: ReadPart, d: ReadPart): StatusReport['watchdog'] {
  const pt = p.report.watchdog.timeouts as
    | (StatusReport['watchdog']['timeouts'] & {sources?: Record<string, string>})
    | undefined
  const dt = d.report.watchdog.timeouts as typeof pt
  const timeouts =
    pt && dt && p !== d
      ? {
          ...dt,
          bootstrapTimeout: pt.bootstrapTimeout,
          ...(dt.sources && pt.sources
            ? {sources: {...dt.sources, bootstrapTimeout: pt.sources.bootstrapTimeout}}
            : {}),
        }
      : (pt ?? dt)
  return {
    contract: p.report.watchdog.contract,
    ...(p.report.watchdog.prefillEnv ? {prefillEnv: p.report.watchdog.prefillEnv} : {}),
    ...(timeouts ? {timeouts} : {}),
    ...(d.report.watchdog.heartbeat ? {heartbeat: d.report.watchdog.heartbeat} : {}),
  }
}

/**
 * The KV transport as prefill's server states it, with the twin's rails of both roles: on a twin split over nodes each
 * node states only its own GPUs' rails (decode's in decode's server_info), so a decode GPU's rail comes from there.
 */
export function transportAcross(p: StatusReport, d: StatusReport): StatusReport['transport'] {
  const rails = [...(p.transport.rails ?? [])]
  for (const r of d.services.decode.twinRails ?? []) if (!rails.some(x => x.gpu === r.gpu)) rails.push(r)
  return rails.length > 0 ? {...p.transport, rails: rails.sort((a, b) => a.gpu - b.gpu)} : p.transport
}

/** Each host's own instances as its discovery found them, prefill before decode, in the file's order. */
function instancesOf(parts: ReadPart[]): InstanceStatus[] {
  const found = parts.flatMap(x =>
    (x.instances ?? []).map(i => ({...x.report.services[i.role], role: i.role, path: i.path, host: x.name})),
  )
  const order = (i: InstanceStatus) => [i.role === 'prefill' ? 0 : 1, Number(/\[(\d+)\]$/.exec(i.path)?.[1] ?? 0)]
  return found.sort((a, b) => order(a)[0]! - order(b)[0]! || order(a)[1]! - order(b)[1]!)
}
