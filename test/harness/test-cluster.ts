import {readFileSync, writeFileSync} from 'node:fs'
import {join} from 'node:path'
import {parse as parseYaml, stringify as toYaml} from 'yaml'

import {DeploymentFileSchema} from '../../src/deployment/file-schema.js'
import {linkNetns, runCommand} from './netns.js'
import {cliEntry, createTestHost, type TestHost, warmTwin} from './test-host.js'

/**
 * Two test hosts standing for two GPU nodes of one PD deployment: each a network namespace with its own sshd, linked
 * directly (linkNetns) as nodes on one network are, the twin started on each over SSH as an operator starts SGLang on
 * each node (`sim up --only …`): decode on the decode node, prefill and the router on the prefill node. KV crosses
 * between the namespaces on the twin's TCP path (or, with railNics, on its rail NICs). pdchaos reaches both the way it
 * reaches real nodes: SSH, and a
 * deployment file with a `hosts:` map.
 */

export interface TestCluster {
  prefillNode: TestHost
  /** Every prefill node, prefillNode first (one prefill instance each; see ClusterOptions.prefillInstances). */
  prefillNodes: TestHost[]
  decodeNode: TestHost
  /** pdchaos.yaml on the root side: hosts prefill-node and decode-node (ssh), each service on its node. */
  deploymentFile: string
  endpoints: {router: string; prefill: string; decode: string; bootstrap: string}
  destroy(): Promise<void>
}

export interface ClusterOptions {
  deadlineSeconds?: number
  pollSeconds?: number
  /** More `sim up` flags for every node, verbatim. */
  args?: string[]
  /**
   * Prefill instances, one per node (default 1): the first node also runs the router, which routes to them all; the
   * deployment file lists them as `prefill: [ … ]`.
   */
  prefillInstances?: number
  /**
   * One prefill instance over this many nodes (SGLang --nnodes; default 1): node rank 0 on prefill-node, rank k on
   * prefill-node-(k+1), each started with the same flags but its --node-rank; decode and the router on the decode
   * node. The file states the instance as `nodes: [prefill-node, prefill-node-2, …]` and one restart command that
   * each node runs for its own part (its login names its own twin, PDCHAOS_SIM_DIR).
   */
  prefillNnodes?: number
  /**
   * Every prefill and decode node started with --rail-nics (its own GPUs' rails and rail switch), the nodes' rail
   * switches joined by linkRailSwitches (each prefill node to the decode node: a tree, no loop), so the KV crosses
   * between the nodes on the rails. Not with prefillNnodes (the twin refuses rails with --nnodes).
   */
  railNics?: boolean
}

/** The bridge every twin's rail NICs are ports of (src/sim/server/rail-plan.ts railPlan). */
const RAIL_SWITCH = 'railsw'

/**
 * A rail fabric between two nodes whose twins run with --rail-nics: a veth pair, one end in each namespace, each end
 * a port of that namespace's rail switch (up, MTU 9000 as the rails, IPv6 off: no chatter on the fabric). The rails
 * of one node then reach the other's by ARP across the two bridges. The link dies with either namespace; `sim down`
 * removing a switch only leaves its end without a master.
 */
export async function linkRailSwitches(a: TestHost, b: TestHost): Promise<void> {
  const [na, nb] = [a.netns, b.netns]
  const ends: Array<[typeof na, string]> = [
    [na, `pdc-ra${na.index}-${nb.index}`],
    [nb, `pdc-rb${na.index}-${nb.index}`],
  ]
  await runCommand([
    'ip',
    'link',
    'add',
    ends[0]![1],
    'mtu',
    '9000',
    'type',
    'veth',
    'peer',
    'name',
    ends[1]![1],
    'mtu',
    '9000',
  ])
  for (const [ns, dev] of ends) {
    await runCommand(['ip', 'link', 'set', dev, 'netns', ns.name])
    await ns.run(['sh', '-c', `echo 1 > /proc/sys/net/ipv6/conf/${dev}/disable_ipv6`])
    await runCommand(['ip', '-n', ns.name, 'link', 'set', 'dev', dev, 'master', RAIL_SWITCH])
    await runCommand(['ip', '-n', ns.name, 'link', 'set', 'dev', dev, 'up'])
  }
}

/** The port node rank 0 of a multi-node prefill listens on for its other node ranks (--dist-init-addr). */
export const DIST_INIT_PORT = 29_500

interface NodeUp {
  deploymentFile: string
  endpoints: TestCluster['endpoints']
}

/** Nodes that all see each other: every pair of the cluster's hosts linked. */
async function linkAll(hosts: TestHost[]): Promise<void> {
  for (let i = 0; i < hosts.length; i++)
    for (let j = i + 1; j < hosts.length; j++) await linkNetns(hosts[i]!.netns, hosts[j]!.netns)
}

/**
 * The `sim up` flags every node gets. As the matrix twins: the gateway's breaker half-opens after 10 s, not 60 (a fault
 * that fails the steady load opens it, and the next run waits for it to close).
 */
const commonArgs = (o: ClusterOptions): string[] => [
  '--deadline',
  String(o.deadlineSeconds ?? 1.5),
  '--poll',
  String(o.pollSeconds ?? 0.5),
  '--heartbeat-interval',
  '2',
  '--cb-timeout-duration-secs',
  '10',
  ...(o.railNics ? ['--rail-nics'] : []),
  ...(o.args ?? []),
]

/** `sim up` on one node over its SSH, as an operator starts SGLang there; its endpoints and deployment file. */
async function simUpOn(h: TestHost, args: string[]): Promise<NodeUp> {
  const r = await h.sshRun(
    [
      process.execPath,
      cliEntry(),
      'sim',
      'up',
      '--host',
      h.netns.address,
      '--state-dir',
      h.stateDir,
      '--json',
      ...args,
    ],
    {timeoutMs: 90_000},
  )
  if (r.code !== 0)
    throw new Error(
      `sim up ${args.slice(0, 4).join(' ')} over ssh ` +
        `exited ${r.code}: ${(r.stderr || r.stdout).trim().split('\n').slice(-5).join(' | ')}`,
    )
  return JSON.parse(r.stdout) as NodeUp
}

/** A node's own deployment file (the namespaces share this machine's filesystem, so it is read directly). */
const readNodeFile = (f: string) =>
  parseYaml(readFileSync(f, 'utf8')) as {
    services: Record<string, Record<string, unknown>>
    watchdog: unknown
    backend: string
    sglangVersion: string
  }

/** The cluster's deployment file, checked against the schema, written beside the first node's files. */
function writeClusterFile(first: TestHost, file: Record<string, unknown>): string {
  DeploymentFileSchema.parse(file)
  const path = join(first.dir, 'cluster.yaml')
  writeFileSync(path, toYaml(file))
  return path
}

export async function createTestCluster(o: ClusterOptions = {}): Promise<TestCluster> {
  const made: TestHost[] = []
  const destroy = async (): Promise<void> => {
    // Each node's twin by its own `sim down`; destroy() sweeps whatever is left in the namespaces.
    await Promise.all(
      made.map(h =>
        h
          .sshRun([process.execPath, cliEntry(), 'sim', 'down', '--state-dir', h.stateDir, '--json'], {
            timeoutMs: 20_000,
          })
          .catch(() => undefined),
      ),
    )
    await Promise.all(made.map(h => h.destroy()))
  }
  try {
    if ((o.prefillNnodes ?? 1) > 1) {
      if (o.railNics)
        throw new Error(
          'createTestCluster: railNics with prefillNnodes > 1 (the twin refuses --rail-nics with --nnodes)',
        )
      return await multiNodeCluster(o, made, destroy)
    }
    const n = o.prefillInstances ?? 1
    const hosts = await Promise.all(Array.from({length: n + 1}, () => createTestHost()))
    made.push(...hosts)
    const [p, ...more] = hosts.slice(0, n)
    const d = hosts[n]!
    // Every pair linked: decode reaches each prefill's ranks, the router (on the first prefill node) each worker.
    await linkAll(hosts)
    const up = (h: TestHost, only: string, peers: string[]): Promise<NodeUp> =>
      simUpOn(h, ['--only', only, ...peers, ...commonArgs(o)])
    // The workers' nodes first: the router on the first prefill node turns ready once its workers answer its probes.
    const prefillAddrs = [p!, ...more].map(h => h.netns.address).join(',')
    const decodeUp = await up(d, 'decode', ['--prefill-host', prefillAddrs, '--router-host', p!.netns.address])
    const moreUp = await Promise.all(
      more.map(h => up(h, 'prefill', ['--decode-host', d.netns.address, '--router-host', p!.netns.address])),
    )
    const prefillUp = await up(p!, 'prefill,router', [
      '--decode-host',
      d.netns.address,
      ...(more.length > 0 ? ['--prefill-host', more.map(h => h.netns.address).join(',')] : []),
    ])
    // The rail fabric once every node has its switch, before the first request's KV needs it.
    if (o.railNics) for (const h of [p!, ...more]) await linkRailSwitches(h, d)
    await warmTwin(prefillUp.endpoints)

    // Each service as its own node's file states it (restart, logs), placed on that node.
    const pf = readNodeFile(prefillUp.deploymentFile)
    const df = readNodeFile(decodeUp.deploymentFile)
    const morePrefill = moreUp.map((u, i) => ({
      ...readNodeFile(u.deploymentFile).services.prefill,
      host: `prefill-node-${i + 2}`,
    }))
    const file = {
      version: 1,
      name: n === 1 ? 'pdchaos-twin-2-nodes' : `pdchaos-twin-${n + 1}-nodes`,
      labels: {environment: 'test'},
      hosts: {
        'prefill-node': p!.hostConfig,
        ...Object.fromEntries(more.map((h, i) => [`prefill-node-${i + 2}`, h.hostConfig])),
        'decode-node': d.hostConfig,
      },
      stateDir: join(p!.dir, 'host-run'),
      services: {
        prefill:
          n === 1
            ? {...pf.services.prefill, host: 'prefill-node'}
            : [{...pf.services.prefill, host: 'prefill-node'}, ...morePrefill],
        decode: {...df.services.decode, host: 'decode-node'},
        router: {...pf.services.router, host: 'prefill-node'},
      },
      backend: pf.backend,
      watchdog: pf.watchdog,
      sglangVersion: pf.sglangVersion,
    }
    return {
      prefillNode: p!,
      prefillNodes: [p!, ...more],
      decodeNode: d,
      deploymentFile: writeClusterFile(p!, file),
      endpoints: prefillUp.endpoints,
      destroy,
    }
  } catch (error) {
    await destroy()
    throw error
  }
}

/** createTestCluster with one prefill instance over o.prefillNnodes nodes (see ClusterOptions.prefillNnodes). */
async function multiNodeCluster(
  o: ClusterOptions,
  made: TestHost[],
  destroy: () => Promise<void>,
): Promise<TestCluster> {
  const nnodes = o.prefillNnodes!
  const hosts = await Promise.all(Array.from({length: nnodes + 1}, () => createTestHost()))
  made.push(...hosts)
  const prefillNodes = hosts.slice(0, nnodes)
  const p = prefillNodes[0]!
  const d = hosts[nnodes]!
  await linkAll(hosts)
  const up = (h: TestHost, args: string[]): Promise<NodeUp> => simUpOn(h, [...args, ...commonArgs(o)])
  // Every node rank at once (node rank 0 waits for the others to join it), then decode and the gateway, which turns
  // ready once both workers answer.
  const dist = ['--nnodes', String(nnodes), '--dist-init-addr', `${p.netns.address}:${DIST_INIT_PORT}`]
  const prefillUps = await Promise.all(
    prefillNodes.map((h, k) =>
      up(h, [
        '--only',
        'prefill',
        ...dist,
        '--node-rank',
        String(k),
        '--decode-host',
        d.netns.address,
        '--router-host',
        d.netns.address,
      ]),
    ),
  )
  const decodeUp = await up(d, ['--only', 'decode,router', '--prefill-host', p.netns.address])
  await warmTwin(decodeUp.endpoints)

  const pf = readNodeFile(prefillUps[0]!.deploymentFile)
  const df = readNodeFile(decodeUp.deploymentFile)
  const nodeNames = prefillNodes.map((_, k) => (k === 0 ? 'prefill-node' : `prefill-node-${k + 1}`))
  // One restart command for the instance, run on each node: `sim restart` of the twin the node's login names.
  const restart = [process.execPath, cliEntry(), 'sim', 'restart', 'prefill', '--json']
  const file = {
    version: 1,
    name: `pdchaos-twin-prefill-over-${nnodes}-nodes`,
    labels: {environment: 'test'},
    hosts: {
      ...Object.fromEntries(prefillNodes.map((h, k) => [nodeNames[k], h.hostConfig])),
      'decode-node': d.hostConfig,
    },
    stateDir: join(p.dir, 'host-run'),
    services: {
      prefill: {...pf.services.prefill, restart, nodes: nodeNames},
      decode: {...df.services.decode, host: 'decode-node'},
      router: {...df.services.router, host: 'decode-node'},
    },
    backend: pf.backend,
    watchdog: pf.watchdog,
    sglangVersion: pf.sglangVersion,
  }
  return {
    prefillNode: p,
    prefillNodes,
    decodeNode: d,
    deploymentFile: writeClusterFile(p, file),
    endpoints: {
      ...decodeUp.endpoints,
      prefill: prefillUps[0]!.endpoints.prefill,
      bootstrap: prefillUps[0]!.endpoints.bootstrap,
    },
    destroy,
  }
}
