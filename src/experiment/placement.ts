import {join} from 'node:path'

import type {Deployment} from '../deployment/config.js'
import type {NodeRankOn} from '../deployment/single-host.js'
import {badInput} from '../errors.js'
import type {Host} from '../hosts/host.js'
import {exitAfterSignal, type GuardOptions, type LeaseGuard, withLeases} from '../faults/lease/lease-guard.js'

/**
 * Where a deployment's services run, as the runner acts on them: one host for a deployment on one host, else every
 * host in use with the roles that run there. Each host keeps pdchaos's state (leases, the run lock) in its own
 * directory: the deployment's stateDir on one host; stateDir/<host name> on each of several (so that hosts sharing
 * a filesystem, as test namespaces do, never share a lease or a lock).
 */

export type Role = 'prefill' | 'decode' | 'router'

export interface PlacedHost {
  /** The host's name in the deployment file ('host' for a `host:` file). */
  name: string
  roles: Role[]
  /** The other node ranks of multi-node instances on this host (their schedulers, leases and faults are here). */
  nodeRanks?: NodeRankOn[]
  host: Host
  /** pdchaos's state dir on this host. */
  stateDir: string
  /** The deployment as seen from this host (its host entry, every service's URL): what discovery reads there. */
  view: Deployment
}

export class Placement {
  private constructor(readonly hosts: PlacedHost[]) {}

  /** Every service on one host. */
  static single(deployment: Deployment, host: Host): Placement {
    return new Placement([
      {name: 'host', roles: ['prefill', 'decode', 'router'], host, stateDir: deployment.stateDir, view: deployment},
    ])
  }

  /** Several hosts (from the file's hosts: map), each with its own state dir under the deployment's. */
  static across(
    deployment: Deployment,
    hosts: Array<{name: string; roles: Role[]; nodeRanks?: NodeRankOn[]; host: Host; view: Deployment}>,
  ): Placement {
    return new Placement(hosts.map(h => ({...h, stateDir: join(deployment.stateDir, h.name)})))
  }

  get spansHosts(): boolean {
    return this.hosts.length > 1
  }

  /** The host a role runs on (its instance's node rank 0). */
  of(role: Role): PlacedHost {
    return this.hosts.find(h => h.roles.includes(role)) ?? this.hosts[0]!
  }

  named(name: string): PlacedHost {
    const h = this.hosts.find(x => x.name === name)
    if (!h) throw new Error(`no host named ${name} in the placement`)
    return h
  }
}

/**
 * The host a fault acts on: the one whose GPU it names (a param `gpu`: the rank on that GPU), else the host of the
 * prefill TP rank it names (a param `rank`), else prefill's (node rank 0's host; the runner adds the other nodes' for a
 * fault on every rank, Fault.onEveryNode). A GPU index that ranks on two hosts share (the node ranks of a multi-node
 * instance each number their GPUs from 0) needs `gpuHost`, the host's name; without it the fault is refused (exit 2),
 * never guessed.
 */
export function hostForFault(
  p: Placement,
  params: Record<string, unknown>,
  ranks: ReadonlyArray<{service: 'prefill' | 'decode'; gpu?: number; tpRank?: number; host?: string}>,
  gpuHost?: string,
): PlacedHost {
  const gpu = typeof params.gpu === 'number' ? params.gpu : undefined
  if (gpuHost !== undefined) {
    const names = p.hosts.map(h => h.name)
    if (gpu === undefined)
      throw badInput(
        `--gpu-host ${gpuHost} names the host of --gpu, and this fault names no GPU`,
        'drop --gpu-host (gpuHost: in a suite file)',
      )
    if (!names.includes(gpuHost))
      throw badInput(
        `--gpu-host ${gpuHost}: the run acts ` +
          `on ${p.spansHosts ? `the hosts ${names.join(', ')}` : `one host (${names[0]})`}, not on ${gpuHost}`,
        "name a host of the deployment file's hosts: that runs a rank of the pair (`pdchaos status` lists the " +
          'ranks per host)',
      )
    return p.named(gpuHost)
  }
  if (!p.spansHosts) return p.hosts[0]!
  // A param `rank` K names prefill TP rank K: its host (a multi-node prefill's ranks past node 0 run elsewhere).
  const rankHost =
    typeof params.rank === 'number'
      ? ranks.find(r => r.service === 'prefill' && r.tpRank === params.rank)?.host
      : undefined
  if (gpu === undefined) return rankHost ? p.named(rankHost) : p.of('prefill')
  const on = [...new Set(ranks.filter(r => r.gpu === gpu).map(r => r.host ?? p.of(r.service).name))]
  if (on.length > 1)
    throw badInput(
      `GPU ${gpu} holds a rank on each of ${on.join(' and ')}: which host's GPU is meant is ambiguous`,
      `name the host with --gpu-host (gpuHost: in a suite file), one of ${on.join(', ')}; \`pdchaos status\` lists ` +
        `the ranks per host`,
    )
  return on.length === 1 ? p.named(on[0]!) : p.of('prefill')
}

/**
 * What discovery saw, narrowed to one host's ranks: a fault plans from the processes and GPUs of the host it acts on.
 */
export function onHost<D extends {ranks: ReadonlyArray<{host?: string}>}>(d: D, h: PlacedHost, p: Placement): D {
  return p.spansHosts ? {...d, ranks: d.ranks.filter(r => r.host === h.name)} : d
}

/**
 * Run fn with a lease guard on each of `hosts` (each with its own reverter on its host, under its own state dir);
 * guardOf(name) is the guard of the host of that name. The guards open in order and close in reverse, each closing
 * as withLeases does (reverting what is still armed on its host).
 */
export async function withLeasesOn<T>(
  hosts: PlacedHost[],
  fn: (guardOf: (name: string) => LeaseGuard) => Promise<T>,
  opts: GuardOptions = {},
): Promise<T> {
  const guards = new Map<string, LeaseGuard>()
  // After a signal each guard reverts its own host's leases; the process ends once every guard is done, with the
  // worst code (4, a host not known clean, over 3): the first guard done must not end it while another still reverts.
  const codes: number[] = []
  const exit = opts.exit
  const each: GuardOptions =
    hosts.length < 2
      ? opts
      : {
          ...opts,
          exit: code => {
            codes.push(code)
            if (codes.length === hosts.length) (exit ?? exitAfterSignal)(Math.max(...codes))
          },
        }
  const open = (i: number): Promise<T> =>
    i === hosts.length
      ? fn(name => {
          const g = guards.get(name)
          if (!g) throw new Error(`no lease guard on ${name}`)
          return g
        })
      : withLeases(
          hosts[i]!.host,
          hosts[i]!.stateDir,
          g => {
            guards.set(hosts[i]!.name, g)
            return open(i + 1)
          },
          each,
        )
  return open(0)
}
