import {PdError} from '../errors.js'
import {ExitCode} from '../exit-codes.js'
import {type Deployment, DeploymentSchema} from './config.js'
import {type DeploymentModel, hostsInUse, type PlacedService} from './model.js'

/**
 * What the commands act on. A deployment over several hosts is acted on across them (cli/target.ts opens each host;
 * the runner acts on the host that owns what each fault targets). Where the file lists several instances of a role,
 * status reads them all, inject and suite act on one prefill/decode pair of them (the pair's hosts, the router's, and
 * pins sent to that pair), restart and recover act on every instance. An instance over several nodes (--nnodes) is
 * read and acted on across its nodes: its URL on node rank 0, its schedulers on every node.
 */

export const E_MULTI_HOST = 'E_MULTI_HOST'

/** Commands that act on a deployment over several hosts. */
const ACROSS_HOSTS = new Set(['status', 'inject', 'suite', 'restart', 'recover'])

/** Why `command` cannot act on this deployment yet (undefined: it can; the view is exact). */
export function singleHostRefusal(m: DeploymentModel, command: string): string | undefined {
  const hosts = hostsInUse(m)
  if (hosts.length > 1 && !ACROSS_HOSTS.has(command))
    return (
      `this deployment spans ${hosts.length} hosts (${hosts.join(', ')}): ${command} acts on one host today; ` +
      `multi-host runs come with issue 13`
    )
  return instanceRefusal(m, command)
}

/** Commands that act on a deployment with several instances of a role (status, inject and suite read them by host). */
const WITH_INSTANCES = new Set(['status', 'inject', 'suite', 'restart', 'recover'])
/** Of those, the ones that tell instances apart by the processes on their host: one instance of a role per host. */
const READS_BY_HOST = new Set(['status', 'inject', 'suite'])

/**
 * Several instances of a role: each on hosts of its own for the commands that read them there. A multi-node instance
 * is read on every host it spans (its node ranks' schedulers), and restarted there together.
 */
function instanceRefusal(m: DeploymentModel, command: string): string | undefined {
  const {prefill, decode} = m.services
  const several = prefill.length > 1 || decode.length > 1
  if (several && !WITH_INSTANCES.has(command)) {
    const counts = [prefill, decode]
      .filter(r => r.length > 1)
      .map(r => `${r.length} ${r[0].role} instances (${r.map(s => s.path).join(', ')})`)
    return `this deployment has ${counts.join(' and ')}: ${command} acts on one prefill and one decode instance`
  }
  if (several && READS_BY_HOST.has(command)) {
    for (const role of [prefill, decode]) {
      // Every node of every instance: a follower node of one instance beside another instance's server is two servers
      // of the role on one host as much as two rank-0 nodes are.
      const byHost = new Map<string, string[]>()
      for (const s of role) for (const n of s.nodes) byHost.set(n, [...(byHost.get(n) ?? []), s.path])
      const shared = [...byHost.entries()].find(([, paths]) => paths.length > 1)
      if (shared)
        return (
          `${shared[1].join(' and ')} both run on host ${shared[0]}: ${command} reads several instances of a ` +
          `role only when each runs on hosts of its own (one per node, as SGLang is usually deployed)`
        )
    }
  }
  return undefined
}

/** The prefill and decode instance a run acts on: indexes into the file's lists (0 where the role has one service). */
export interface InstancePair {
  prefill: number
  decode: number
}

export const FIRST_PAIR: InstancePair = {prefill: 0, decode: 0}

/**
 * Why the pair does not name instances of this deployment (undefined: it does). `said` names where the number came
 * from (the flag, or a suite scenario's pair:).
 */
export function pairRefusal(
  m: DeploymentModel,
  pair: InstancePair,
  said = (role: string, i: number) => `--${role}-instance ${i}`,
): string | undefined {
  for (const role of ['prefill', 'decode'] as const) {
    const n = m.services[role].length
    const i = pair[role]
    if (i < n) continue
    return n === 1
      ? `${said(role, i)}: the deployment has one ${role} instance (${m.services[role][0]!.path}), number 0`
      : `${said(role, i)}: the deployment has ${n} ${role} instances, numbered 0 to ${n - 1} (services.${role}[0] ` +
          `to services.${role}[${n - 1}])`
  }
  return undefined
}

/** Where the file states the pair's two instances, for messages and journals. */
export function pairPaths(m: DeploymentModel, pair: InstancePair): {prefill: string; decode: string} {
  return {prefill: m.services.prefill[pair.prefill]!.path, decode: m.services.decode[pair.decode]!.path}
}

/**
 * The view of the deployment from one of its hosts, for discovery there: the host's entry, and one service per role
 * at its URL, wherever it runs: the pair's instances when a run acts on a pair; else the instance on this host where
 * the role has one here, else its first instance. `acrossHosts` says which services run on which host.
 */
export function hostView(m: DeploymentModel, hostName: string, pair?: InstancePair): Deployment {
  const {placement: _placement, hosts, services, restartOrder: _order, ...settings} = m
  const prefill = pair ? services.prefill[pair.prefill]! : instanceOn(services.prefill, hostName)
  const decode = pair ? services.decode[pair.decode]! : instanceOn(services.decode, hostName)
  return DeploymentSchema.parse({
    ...settings,
    host: hosts.find(h => h.name === hostName)!.config,
    services: {prefill: prefill.service, decode: decode.service, router: services.router.service},
  })
}

/**
 * The instance of a role whose node rank 0 runs on the host, else one with another node rank there, else the role's
 * first.
 */
export function instanceOn<S>(instances: PlacedService<S>[], hostName: string): PlacedService<S> {
  return (
    instances.find(s => s.nodes[0] === hostName) ?? instances.find(s => s.nodes.includes(hostName)) ?? instances[0]!
  )
}

/** A node rank other than 0 of a multi-node instance: the host runs schedulers of that instance, not its URL. */
export interface NodeRankOn {
  role: 'prefill' | 'decode'
  path: string
  nodeRank: number
}

/**
 * Each host in use, with the roles that run there (node rank 0 of their instance), in the file's order, and the other
 * node ranks of multi-node instances it runs; with a pair, the pair's instances only (a host that runs only other
 * instances has none).
 */
export function acrossHosts(
  m: DeploymentModel,
  pair?: InstancePair,
): Array<{name: string; roles: Array<'prefill' | 'decode' | 'router'>; nodeRanks: NodeRankOn[]}> {
  const of = (role: 'prefill' | 'decode' | 'router') =>
    role === 'router' ? [m.services.router] : pair ? [m.services[role][pair[role]]!] : m.services[role]
  return hostsInUse(m).map(name => ({
    name,
    roles: (['prefill', 'decode', 'router'] as const).filter(role => of(role).some(s => s.nodes[0] === name)),
    nodeRanks: (['prefill', 'decode'] as const).flatMap(role =>
      of(role).flatMap(s =>
        s.nodes.flatMap((n, k) => (k > 0 && n === name ? [{role, path: s.path, nodeRank: k}] : [])),
      ),
    ),
  }))
}

/**
 * The single-host view for `command`, or exit 2 naming the file and what is not supported yet. The view is what the
 * single-host schema makes of it, so a `host:` file gives exactly what pdchaos has always read from it.
 */
export function singleHostView(
  m: DeploymentModel,
  use: {command: string; file: string; pair?: InstancePair},
): Deployment {
  refuseUnsupported(m, use)
  const pair = use.pair ?? FIRST_PAIR
  const why = pairRefusal(m, pair)
  if (why !== undefined) {
    throw new PdError(`${use.file}: ${why}`, {
      exit: ExitCode.badInput,
      code: E_MULTI_HOST,
      suggestion: '`pdchaos status` lists the instances of each role, numbered from 0 in the order of the file',
    })
  }
  return hostView(m, m.services.router.nodes[0], use.pair)
}

/** Exit 2 naming the file and what `command` does not support yet in it. */
export function refuseUnsupported(m: DeploymentModel, use: {command: string; file: string}): void {
  const why = singleHostRefusal(m, use.command)
  if (why !== undefined) {
    throw new PdError(`${use.file}: ${why}`, {
      exit: ExitCode.badInput,
      code: E_MULTI_HOST,
      suggestion:
        'the file is valid (`pdchaos schema deployment` describes it); to run now, point -c at a file with one ' +
        'host and one instance per role',
    })
  }
}

/**
 * Where the file lists several instances of a role: the prefill and decode instances whose node rank 0 is this host.
 */
export function instancesOn(
  m: DeploymentModel,
  hostName: string,
): Array<{role: 'prefill' | 'decode'; path: string}> | undefined {
  if (m.services.prefill.length < 2 && m.services.decode.length < 2) return undefined
  return [...m.services.prefill, ...m.services.decode]
    .filter(s => s.nodes[0] === hostName)
    .map(s => ({role: s.role as 'prefill' | 'decode', path: s.path}))
}
