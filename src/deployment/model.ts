import type {HostConfig} from '../hosts/host-spec.js'
import type {Deployment, PrefillService, RouterService, Service} from './config.js'
import {
  type DecodeEntry,
  type DeploymentFile,
  type PrefillEntry,
  type RouterEntry,
  serviceEntries,
} from './file-schema.js'
import {pathText, type Role} from './placement-checks.js'
import {restartOrderPaths} from './restart-order.js'

export type {Role} from './placement-checks.js'

/**
 * The deployment as pdchaos reasons about it, whatever form the file took: its hosts by name, and per role the
 * instances with the host of each node rank. A `host:` file becomes one host named "host" with every service on it.
 */

/** The name a `host:` file's one host takes in the model. */
export const SINGLE_HOST_NAME = 'host'

export interface NamedHost {
  name: string
  config: HostConfig
}

/** One instance of a role and where it runs. */
export interface PlacedService<S> {
  role: Role
  /** Where the file states it, for messages: services.decode[1], or services.decode for a single object. */
  path: string
  /** The service as the single-host view has it (URL, health path, restart, logs; bootstrapPort for prefill). */
  service: S
  /** The host of each node rank, in --node-rank order: one for a single-node instance. nodes[0] serves the URL. */
  nodes: string[]
}

export interface DeploymentModel extends Omit<Deployment, 'host' | 'services'> {
  /** How the file named its hosts: one `host:` for every service, or a `hosts:` map. */
  placement: 'host' | 'hosts'
  /** In file order. */
  hosts: NamedHost[]
  services: {
    prefill: PlacedService<PrefillService>[]
    decode: PlacedService<Service>[]
    router: PlacedService<RouterService>
  }
  /** The co-restart's order: every service's path once (the file's restartOrder:, or prefill, decode, router). */
  restartOrder: string[]
}

/** The model of a file the schema accepted (file-schema.ts checks every name this relies on). */
export function toModel(f: DeploymentFile): DeploymentModel {
  const {host, hosts, services: _services, restartOrder, ...settings} = f
  const named: NamedHost[] =
    host !== undefined
      ? [{name: SINGLE_HOST_NAME, config: host}]
      : Object.entries(hosts ?? {}).map(([name, config]) => ({name, config}))
  const placed = serviceEntries(f).map(e => ({
    role: e.role,
    path: pathText(e.path),
    service: withoutPlacement(e.entry),
    nodes: host !== undefined ? [SINGLE_HOST_NAME] : (e.nodes ?? [e.host!]),
  }))
  const of = (role: Role) => placed.filter(p => p.role === role)
  return {
    ...settings,
    placement: host !== undefined ? 'host' : 'hosts',
    hosts: named,
    services: {
      prefill: of('prefill') as PlacedService<PrefillService>[],
      decode: of('decode') as PlacedService<Service>[],
      router: of('router')[0] as PlacedService<RouterService>,
    },
    restartOrder: restartOrderPaths(restartOrder, serviceEntries(f)),
  }
}

/** The entry without the fields that only say where it runs. */
function withoutPlacement(entry: PrefillEntry | DecodeEntry | RouterEntry): PrefillService | Service | RouterService {
  const copy: Record<string, unknown> = {...entry}
  delete copy.host
  delete copy.nodes
  return copy as PrefillService | Service | RouterService
}

/** Every instance, prefill first, then decode, then the router. */
export function allServices(m: DeploymentModel): PlacedService<Service>[] {
  return [...m.services.prefill, ...m.services.decode, m.services.router]
}

/** The names of the hosts the services run on, in the order of `hosts`. */
export function hostsInUse(m: DeploymentModel): string[] {
  const used = new Set(allServices(m).flatMap(s => s.nodes))
  return m.hosts.map(h => h.name).filter(name => used.has(name))
}
