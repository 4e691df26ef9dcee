import {PdError} from '../errors.js'
import {ExitCode} from '../exit-codes.js'
import {type Deployment, DeploymentSchema} from './config.js'
import {type DeploymentModel, hostsInUse, type PlacedService} from './model.js'

/**
 * What the commands act on. A deployment over several hosts is acted on across them (cli/target.ts opens each host;
 * the runner acts on the host that owns what each fault targets), one instance per role, each on one node. Several
 * instances of a role, or an instance over several nodes, are valid in a file but not acted on yet: refused, naming
 * what is not supported, never run on a part of the deployment (status reads several instances, each on its own host).
 */

export const E_MULTI_HOST = 'E_MULTI_HOST'

/** Commands that act on a deployment over several hosts (one instance per role, each on one node). */
const ACROSS_HOSTS = new Set(['status', 'inject', 'suite', 'restart', 'recover'])

/** Why `command` cannot act on this deployment yet (undefined: it can; the view is exact). */
export function singleHostRefusal(m: DeploymentModel, command: string): string | undefined {
  const hosts = hostsInUse(m)
  if (hosts.length > 1 && !ACROSS_HOSTS.has(command)) return `this deployment spans ${hosts.length} hosts (${hosts.join(', ')}): ${command} acts on one host today; multi-host runs come with issue 13`
  return instanceRefusal(m, command)
}

/** Commands that read several instances of a role (each on a node of its own): status. */
const READS_INSTANCES = new Set(['status'])

/**
 * Several instances of a role, or an instance over several nodes: status reads several single-node instances, each
 * on its own host; no command acts on them yet.
 */
function instanceRefusal(m: DeploymentModel, command: string): string | undefined {
  const {prefill, decode} = m.services
  if ((prefill.length > 1 || decode.length > 1) && READS_INSTANCES.has(command)) {
    for (const role of [prefill, decode]) {
      const byHost = new Map<string, string[]>()
      for (const s of role) byHost.set(s.nodes[0]!, [...(byHost.get(s.nodes[0]!) ?? []), s.path])
      const shared = [...byHost.entries()].find(([, paths]) => paths.length > 1)
      if (shared) return `${shared[1].join(' and ')} both run on host ${shared[0]}: ${command} reads several instances of a role only when each runs on a host of its own (one per node, as SGLang is usually deployed)`
    }
  } else if (prefill.length > 1 || decode.length > 1) {
    const counts = [prefill, decode].filter((r) => r.length > 1).map((r) => `${r.length} ${r[0].role} instances (${r.map((s) => s.path).join(', ')})`)
    return `this deployment has ${counts.join(' and ')}: ${command} acts on one prefill and one decode instance today; several instances come with issue 13`
  }
  const multiNode = [...prefill, ...decode].find((s) => s.nodes.length > 1)
  if (multiNode) return `${multiNode.path} runs over ${multiNode.nodes.length} nodes (--nnodes ${multiNode.nodes.length}): ${command} acts on single-node instances today; multi-node instances come with issue 13`
  return undefined
}

/**
 * The view of the deployment from one of its hosts, for discovery there: the host's entry, and one service per role
 * at its URL, wherever it runs: the instance on this host where the role has one here, else its first instance.
 * `acrossHosts` says which services run on which host.
 */
export function hostView(m: DeploymentModel, hostName: string): Deployment {
  const {placement: _placement, hosts, services, ...settings} = m
  return DeploymentSchema.parse({
    ...settings,
    host: hosts.find((h) => h.name === hostName)!.config,
    services: {prefill: instanceOn(services.prefill, hostName).service, decode: instanceOn(services.decode, hostName).service, router: services.router.service},
  })
}

/** The instance of a role whose node rank 0 runs on the host, else the role's first. */
export function instanceOn<S>(instances: PlacedService<S>[], hostName: string): PlacedService<S> {
  return instances.find((s) => s.nodes[0] === hostName) ?? instances[0]!
}

/** Each host in use, with the roles that run there (node rank 0 of their instance), in the file's order. */
export function acrossHosts(m: DeploymentModel): Array<{name: string; roles: Array<'prefill' | 'decode' | 'router'>}> {
  return hostsInUse(m).map((name) => ({
    name,
    roles: (['prefill', 'decode', 'router'] as const).filter((role) => (role === 'router' ? [m.services.router] : m.services[role]).some((s) => s.nodes[0] === name)),
  }))
}

/**
 * The single-host view for `command`, or exit 2 naming the file and what is not supported yet. The view is what the
 * single-host schema makes of it, so a `host:` file gives exactly what pdchaos has always read from it.
 */
export function singleHostView(m: DeploymentModel, use: {command: string; file: string}): Deployment {
  refuseUnsupported(m, use)
  return hostView(m, m.services.router.nodes[0])
}

/** Exit 2 naming the file and what `command` does not support yet in it. */
export function refuseUnsupported(m: DeploymentModel, use: {command: string; file: string}): void {
  const why = singleHostRefusal(m, use.command)
  if (why !== undefined) {
    throw new PdError(`${use.file}: ${why}`, {
      exit: ExitCode.badInput,
      code: E_MULTI_HOST,
      suggestion: 'the file is valid (`pdchaos schema deployment` describes it); to run now, point -c at a file with one host and one instance per role',
    })
  }
}

/** Where the file lists several instances of a role: the prefill and decode instances whose node rank 0 is this host. */
export function instancesOn(m: DeploymentModel, hostName: string): Array<{role: 'prefill' | 'decode'; path: string}> | undefined {
  if (m.services.prefill.length < 2 && m.services.decode.length < 2) return undefined
  return [...m.services.prefill, ...m.services.decode].filter((s) => s.nodes[0] === hostName).map((s) => ({role: s.role as 'prefill' | 'decode', path: s.path}))
}
