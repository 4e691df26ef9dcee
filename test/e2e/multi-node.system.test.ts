import {existsSync, readdirSync} from 'node:fs'
import {join} from 'node:path'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {createTestCluster, type TestCluster} from '../harness/test-cluster.js'
import {cliEntry, type TestHost} from '../harness/test-host.js'
import {eventually, evictionOf as evictionOfIn, expectAbortTrials, expectDroppedPin, runCli, startUntil} from './cli.js'

/**
 * One prefill instance over two nodes (SGLang --nnodes 2, issue 13): TP 4, node rank 0 (TP0, TP1) on prefill-node,
 * node rank 1 (TP2, TP3) on prefill-node-2, each numbering its GPUs from 0; decode and the gateway on a third node.
 * Each node is a namespace host with its own sshd; pdchaos reaches them over SSH with a file that states the instance
 * as `nodes: [prefill-node, prefill-node-2]`.
 */
let c: TestCluster
beforeAll(async () => {
  c = await createTestCluster({prefillNnodes: 2, args: ['--prefill-tp', '4', '--decode-tp', '2']})
}, 240_000)
afterAll(async () => {
  await c?.destroy()
}, 60_000)

const DEADLINE = 1.5
const POLL = 0.5
// eslint-disable-next-line @typescript-eslint/no-explicit-any
const json = (s: string): any => JSON.parse(s)
const evictionOf = (rid: string) => evictionOfIn(c.prefillNode.stateDir, rid)
const leaseDir = (host: string): string => join(c.prefillNode.dir, 'host-run', host, 'leases')
const leaseFiles = (host: string, sub = ''): string[] =>
  existsSync(join(leaseDir(host), sub)) ? readdirSync(join(leaseDir(host), sub)).filter(f => f.endsWith('.json')) : []

/** A node's own `sim status`: the twin's ground truth of the servers and ranks it runs. */
async function twinStatus(node: TestHost): Promise<{
  services: Array<{service: string; pid: number; ranks: Array<{tpRank: number; pid: number; gpu?: number}>}>
}> {
  const r = await node.sshRun([process.execPath, cliEntry(), 'sim', 'status', '--state-dir', node.stateDir, '--json'])
  return JSON.parse(r.stdout) as Awaited<ReturnType<typeof twinStatus>>
}

describe('a prefill instance over two nodes', () => {
  it("serves requests through the gateway: prefill's all-reduce spans both nodes, KV crosses to decode " +
    'from each', async () => {
    for (let i = 0; i < 3; i++) {
      const res = await fetch(`${c.endpoints.router}/generate`, {
        method: 'POST',
        headers: {'content-type': 'application/json'},
        body: JSON.stringify({text: 'two nodes, one instance '.repeat(10), sampling_params: {max_new_tokens: 2}}),
        signal: AbortSignal.timeout(30_000),
      })
      expect(res.status, await res.clone().text()).toBe(200)
    }
  }, 60_000)

  it("status finds every rank on the node it runs on, with its node rank, GPU and ZMQ endpoint, as each node's " +
    'twin counts them', async () => {
    const r = await runCli(['status', '-c', c.deploymentFile, '--json'], {timeoutMs: 60_000})
    expect(r.code, r.stderr).toBe(0)
    const s = json(r.stdout) as {
      hosts: Array<{name: string; roles: string[]; nodeRanks?: Array<{path: string; nodeRank: number}>}>
      services: Record<string, {host: string; health: {ok: boolean}}>
      ranks: Array<{
        service: string
        host: string
        nodeRank?: number
        tpRank: number
        pid: number
        gpu?: number
        zmqHost?: string
        zmqPort?: number
      }>
      warnings: string[]
    }
    expect(s.hosts.map(h => [h.name, h.roles, (h.nodeRanks ?? []).map(n => `${n.path}#${n.nodeRank}`)])).toEqual([
      ['prefill-node', ['prefill'], []],
      ['prefill-node-2', [], ['services.prefill#1']],
      ['decode-node', ['decode', 'router'], []],
    ])
    const prefill = s.ranks.filter(k => k.service === 'prefill')
    expect(prefill.map(k => [k.host, k.tpRank, k.nodeRank ?? 0, k.gpu])).toEqual([
      ['prefill-node', 0, 0, 0],
      ['prefill-node', 1, 0, 1],
      ['prefill-node-2', 2, 1, 0],
      ['prefill-node-2', 3, 1, 1],
    ])
    // Each node's ranks as its own twin started them; each registered with node rank 0's bootstrap server at its own
    // address.
    for (const [node, name] of [
      [c.prefillNodes[0]!, 'prefill-node'],
      [c.prefillNodes[1]!, 'prefill-node-2'],
    ] as const) {
      const truthRanks = (await twinStatus(node)).services.find(x => x.service === 'prefill')!.ranks
      const found = prefill.filter(k => k.host === name)
      expect(found.map(k => k.pid).sort()).toEqual(truthRanks.map(k => k.pid).sort())
      for (const k of found) expect(k.zmqHost, `TP${k.tpRank}`).toBe(node.netns.address)
      for (const k of found) expect(k.zmqPort, `TP${k.tpRank}`).toBeGreaterThan(0)
    }
    expect(s.warnings.filter(w => /scheduler processes/.test(w))).toEqual([])
    const text = await runCli(['status', '-c', c.deploymentFile], {timeoutMs: 60_000})
    expect(text.stdout).toMatch(/prefill-node-2 .* runs prefill node rank 1/)
    expect(text.stdout).toMatch(/prefill node 1 prefill-node-2 TP2/)
  }, 90_000)
})

describe('faults on a multi-node instance act on the node that owns what they target', () => {
  it('drop-dest-info acts on every node of the prefill (each its own lease): pins held in Bootstrapping and ' +
    "evicted in the window by the twin's truth", async () => {
    const r = await runCli(
      ['inject', 'drop-dest-info', '-c', c.deploymentFile, '--json', '--pins', '2', '--load-interval', '400'],
      {timeoutMs: 120_000},
    )
    const j = json(r.stdout)
    expect(
      j.verdicts.filter((v: {verdict: string}) => v.verdict !== 'pass'),
      r.stderr.slice(-500),
    ).toEqual([])
    expect(r.code).toBe(0)
    // Decode's destination info goes to every prefill rank, on whichever node: each node's ranks lose it, under a lease
    // (and its own reverter) on that node's host.
    expect(j.leases.map((l: {host: string}) => l.host)).toEqual(['prefill-node', 'prefill-node-2'])
    expect(
      j.leases.every((l: {verifiedInjected: boolean; verifiedClean: boolean}) => l.verifiedInjected && l.verifiedClean),
    ).toBe(true)
    expect(j.description).toMatch(/prefill TP0 .*prefill TP1 /)
    expect(j.notes.join(' ')).toMatch(
      /also on prefill-node-2: drop all TCP to the ZMQ port of prefill TP2 .*prefill TP3 /,
    )
    expect(j.notes.join(' ')).not.toMatch(/not touched/)
    for (const pin of j.pins) expectDroppedPin(c.prefillNode.stateDir, pin, DEADLINE, POLL)
    expect(leaseFiles('prefill-node')).toEqual([])
    expect(leaseFiles('prefill-node-2')).toEqual([])
    expect(leaseFiles('prefill-node-2', 'done').length).toBeGreaterThan(0)
  }, 180_000)

  it("stall-kv: GPU 0 is on both nodes, so --gpu 0 alone is refused; with --gpu-host it stalls node rank 1's TP2 " +
    'there and the watchdog evicts in the window', async () => {
    const ambiguous = await runCli(['inject', 'stall-kv', '--gpu', '0', '-c', c.deploymentFile, '--pins', '2'], {
      timeoutMs: 60_000,
    })
    expect(ambiguous.code).toBe(2)
    expect(ambiguous.stderr).toMatch(/GPU 0 holds a rank on each of prefill-node and prefill-node-2/)
    expect(ambiguous.stderr).toMatch(/--gpu-host/)

    const r = await runCli(
      [
        'inject',
        'stall-kv',
        '--gpu',
        '0',
        '--gpu-host',
        'prefill-node-2',
        '-c',
        c.deploymentFile,
        '--json',
        '--pins',
        '2',
        '--load-interval',
        '400',
      ],
      {timeoutMs: 120_000},
    )
    const j = json(r.stdout)
    expect(
      j.verdicts.filter((v: {verdict: string}) => v.verdict !== 'pass' && v.verdict !== 'unverified'),
      r.stderr.slice(-500),
    ).toEqual([])
    expect(r.code).toBe(0)
    expect(j.leases.map((l: {host: string}) => l.host)).toEqual(['prefill-node-2'])
    expect(j.description).toMatch(/prefill TP2 .*GPU 0/)
    for (const pin of j.pins) {
      // The watchdog runs on node rank 0, and its truth is there: the pin held by TP2's stalled KV, evicted in the
      // window.
      const t = evictionOf(pin.rid)
      expect(['KVPoll.Bootstrapping', 'KVPoll.WaitingForInput', 'KVPoll.Transferring']).toContain(t.states.at(-1))
      expect(t.heldS!).toBeGreaterThanOrEqual(DEADLINE)
      expect(t.heldS!).toBeLessThanOrEqual(DEADLINE + POLL + 0.05)
    }
    expect(leaseFiles('prefill-node-2', 'done').length).toBeGreaterThan(0)
    expect(leaseFiles('prefill-node-2')).toEqual([])
  }, 180_000)

  it('abort-mid-transfer: every trial gets its verdict; the twin saw each counted abort on prefill', async () => {
    const r = await runCli(['inject', 'abort-mid-transfer', '--trials', '4', '-c', c.deploymentFile, '--json'], {
      timeoutMs: 120_000,
    })
    expectAbortTrials(r, c.prefillNode.stateDir, 4)
  }, 180_000)
})

describe('a co-restart across nodes', () => {
  it('restarts both node ranks of prefill at once, then decode, then the router; every step healthy; recover finds ' +
    'every host clean', async () => {
    const pidsOf = async (node: TestHost) =>
      (await twinStatus(node)).services.find(x => x.service === 'prefill')!.ranks.map(k => k.pid)
    const before = await Promise.all(c.prefillNodes.map(pidsOf))
    const r = await runCli(
      ['restart', '-c', c.deploymentFile, '--json', '--watch', '3', '--settle', '3', '--health-timeout', '60'],
      {timeoutMs: 180_000},
    )
    const j = json(r.stdout)
    expect(
      j.verdicts.filter((v: {verdict: string}) => v.verdict !== 'pass'),
      r.stderr.slice(-800),
    ).toEqual([])
    expect(r.code).toBe(0)
    expect(j.steps.map((s: {service: string}) => s.service)).toEqual(['prefill', 'decode', 'router'])
    expect(j.steps[0].nodes).toEqual([
      {host: 'prefill-node', exitCode: 0},
      {host: 'prefill-node-2', exitCode: 0},
    ])
    // Both nodes' ranks are new processes: node rank 1 restarted with node rank 0, not left on the old instance.
    const after = await Promise.all(c.prefillNodes.map(pidsOf))
    for (const [k, pids] of after.entries()) {
      expect(pids, `node rank ${k}`).toHaveLength(2)
      for (const pid of pids) expect(before[k]).not.toContain(pid)
    }
    const rec = await runCli(['recover', '-c', c.deploymentFile, '--json'], {timeoutMs: 60_000})
    expect(rec.code, rec.stdout + rec.stderr).toBe(0)
  }, 240_000)
})

// Last: it cuts every SSH connection to node rank 1's host for good.
describe('losing a node mid-fault', () => {
  it("SSH to node rank 1's host cut while its stall is in place: exit 4 naming the lease, that node reverts it by " +
    'itself within the TTL, node rank 0 is left clean', async () => {
    const TTL_S = 8
    const started = await startUntil(
      [
        'inject',
        'stall-kv',
        '--gpu',
        '0',
        '--gpu-host',
        'prefill-node-2',
        '-c',
        c.deploymentFile,
        '--ttl',
        String(TTL_S),
        '--pins',
        '1',
        '--load-interval',
        '0',
      ],
      /stall-kv: in place/,
    )
    const node = c.prefillNodes[1]!
    const cutAt = Date.now()
    await node.sshd.killAll()
    started.child.kill('SIGINT')
    const r = await started.done
    expect(r.code, r.stderr.slice(-800)).toBe(4)
    const lease = /lease (stall-kv-\S+?)[ ,:;)]/.exec(r.stderr)?.[1]
    expect(lease, r.stderr.slice(-800)).toBeDefined()
    expect(r.stderr).toMatch(/cleanup unverified.*the host reverts it by itself at \d{4}-\d\d-\d\dT/)
    const nftTables = async () => (await node.netns.run(['nft', 'list', 'tables'], {reject: false})).stdout
    expect(
      await eventually(
        async () => !/pdchaos_/.test(await nftTables()) && leaseFiles('prefill-node-2').length === 0,
        cutAt + (TTL_S + 5) * 1000 - Date.now(),
      ),
    ).toBe(true)
    expect(leaseFiles('prefill-node-2', 'done').some(f => f.startsWith(lease!))).toBe(true)
    expect(leaseFiles('prefill-node')).toEqual([])
    expect(existsSync(join(c.prefillNode.dir, 'host-run', 'prefill-node', 'lock.json'))).toBe(false)
  }, 180_000)
})
