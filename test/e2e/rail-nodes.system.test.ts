import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {existsSync, readdirSync} from 'node:fs'
import {join} from 'node:path'

import {createTestCluster, type TestCluster} from '../harness/test-cluster.js'
import type {TestHost} from '../harness/test-host.js'
import {evictionOf, runCli, truth} from './cli.js'

/**
 * KV crossing between nodes on the rail-NIC path (issue 13): prefill and the router on one namespace host, decode on
 * another, each twin with --rail-nics (the rails of its own GPUs, its own rail switch), the two switches joined by a
 * rail fabric (linkRailSwitches). Prefill GPU g's KV leaves by rail<g> on its node, crosses the fabric and arrives by
 * its decode peer's rail on the other node; pdchaos finds each GPU's rail on the node it runs on and stalls it there.
 */

const DEADLINE = 1.5
const POLL = 0.5
let c: TestCluster
// An RC limit past the deadline (2 s × 8 transmissions): a stalled rail holds the pin in Transferring for the watchdog.
beforeAll(async () => {
  c = await createTestCluster({
    railNics: true,
    deadlineSeconds: DEADLINE,
    pollSeconds: POLL,
    args: ['--ucx-rc-timeout', '2s'],
  })
}, 120_000)
afterAll(async () => {
  await c?.destroy()
}, 60_000)

type Node = 'prefill-node' | 'decode-node'
const nodeOf = (n: Node): TestHost => (n === 'prefill-node' ? c.prefillNode : c.decodeNode)

/** The kernel's own counters of a node's interfaces whose name matches `re` (`ip -s -j link`), summed. */
async function counters(n: Node, re: RegExp): Promise<{tx: number; rx: number; links: string[]}> {
  const links = JSON.parse((await nodeOf(n).netns.run(['ip', '-s', '-j', 'link', 'show'])).stdout) as Array<{
    ifname: string
    stats64: {tx: {bytes: number}; rx: {bytes: number}}
  }>
  const mine = links.filter(l => re.test(l.ifname))
  return {
    tx: mine.reduce((s, l) => s + l.stats64.tx.bytes, 0),
    rx: mine.reduce((s, l) => s + l.stats64.rx.bytes, 0),
    links: mine.map(l => l.ifname).sort(),
  }
}

const leaseFiles = (n: Node, sub = ''): string[] => {
  const dir = join(c.prefillNode.dir, 'host-run', n, 'leases', sub)
  return existsSync(dir) ? readdirSync(dir).filter(f => f.endsWith('.json')) : []
}

describe('a twin over two nodes with rail NICs', () => {
  it("each node has its own GPUs' rails; a request through the router completes, its KV out of the prefill rails, " +
    'across the fabric, into the decode rails', async () => {
    expect((await counters('prefill-node', /^rail\d+$/)).links).toEqual(['rail0', 'rail1', 'rail2', 'rail3'])
    expect((await counters('decode-node', /^rail\d+$/)).links).toEqual(['rail4', 'rail5', 'rail6', 'rail7'])
    const before = {
      p: await counters('prefill-node', /^rail\d+$/),
      d: await counters('decode-node', /^rail\d+$/),
      f: await counters('prefill-node', /^pdc-ra/),
    }
    const res = await fetch(`${c.endpoints.router}/generate`, {
      method: 'POST',
      headers: {'content-type': 'application/json'},
      body: JSON.stringify({text: 'x'.repeat(4000), max_new_tokens: 2}),
      signal: AbortSignal.timeout(30_000),
    })
    expect(res.status, await res.clone().text()).toBe(200)
    const after = {
      p: await counters('prefill-node', /^rail\d+$/),
      d: await counters('decode-node', /^rail\d+$/),
      f: await counters('prefill-node', /^pdc-ra/),
    }
    // ~1000 tokens × 1024 B of KV over 4 prefill ranks: every byte out of a prefill rail, over the fabric, into a
    // decode rail.
    const kv = 500_000
    expect(after.p.tx - before.p.tx).toBeGreaterThan(kv)
    expect(after.f.tx - before.f.tx).toBeGreaterThan(kv)
    expect(after.d.rx - before.d.rx).toBeGreaterThan(kv)
    // No KV on the nodes' own link (the TCP path): far less than the KV crossed it.
    const link = {before: await counters('decode-node', /^pdc-y/)}
    const res2 = await fetch(`${c.endpoints.router}/generate`, {
      method: 'POST',
      headers: {'content-type': 'application/json'},
      body: JSON.stringify({text: 'y'.repeat(4000), max_new_tokens: 2}),
      signal: AbortSignal.timeout(30_000),
    })
    expect(res2.status).toBe(200)
    expect((await counters('decode-node', /^pdc-y/)).rx - link.before.rx).toBeLessThan(kv / 4)
  }, 60_000)

  it('status shows the rails of both nodes, each GPU on its own rail', async () => {
    const r = await runCli(['status', '-c', c.deploymentFile, '--json'], {timeoutMs: 60_000})
    expect(r.code, r.stderr).toBe(0)
    const s = JSON.parse(r.stdout) as {
      transport: {dataPath?: string; rails?: Array<{gpu: number; interface: string; address?: string}>}
    }
    expect(s.transport.dataPath).toBe('rdma-roce-rails')
    expect(s.transport.rails?.map(x => `${x.gpu}:${x.interface}:${x.address}`)).toEqual(
      [0, 1, 2, 3, 4, 5, 6, 7].map(g => `${g}:rail${g}:198.18.${g}.1`),
    )
  }, 60_000)

  for (const [gpu, node, rank] of [
    [1, 'prefill-node', /prefill TP1/],
    [5, 'decode-node', /decode TP1/],
  ] as const) {
    it(`stall-kv on GPU ${gpu} stalls rail${gpu} on the ${node}: the pins are held in Transferring and evicted in ` +
      `the window by the twin's truth`, async () => {
      const r = await runCli(
        [
          'inject',
          'stall-kv',
          '--gpu',
          String(gpu),
          '-c',
          c.deploymentFile,
          '--json',
          '--pins',
          '2',
          '--load-interval',
          '0',
        ],
        {timeoutMs: 60_000},
      )
      const j = JSON.parse(r.stdout) as {
        description: string
        leases: Array<{host: string}>
        pins: Array<{rid: string}>
        verdicts: Array<{check: string; verdict: string; summary: string}>
        error?: {message: string}
      }
      expect(j.verdicts, `exit ${r.code}: ${j.error?.message ?? ''} ${r.stderr.slice(-400)}`).toBeDefined()
      expect(
        j.verdicts
          .filter(v => v.verdict !== 'pass' && v.verdict !== 'unverified')
          .map(v => `${v.check} ${v.verdict}: ${v.summary}`),
      ).toEqual([])
      expect(r.code).toBe(0)
      expect(j.description).toMatch(new RegExp(`rail${gpu}\\b`))
      expect(j.description).toMatch(rank)
      expect(j.leases.map(l => l.host)).toEqual([node])
      expect(j.pins).toHaveLength(2)
      for (const pin of j.pins) {
        const t = evictionOf(c.prefillNode.stateDir, pin.rid)
        expect(t.states.at(-1)).toBe('KVPoll.Transferring')
        expect(t.heldS!).toBeGreaterThanOrEqual(DEADLINE)
        expect(t.heldS!).toBeLessThanOrEqual(DEADLINE + POLL + 0.05)
        expect(
          truth(c.prefillNode.stateDir, 'prefill').some(e => e.rid === pin.rid && e.event === 'watchdog_evicted'),
        ).toBe(true)
      }
      // Reverted and verified clean: no lease left, no table of pdchaos's on either node.
      expect(leaseFiles(node, 'done').length).toBeGreaterThan(0)
      for (const n of ['prefill-node', 'decode-node'] as const) {
        expect(leaseFiles(n)).toEqual([])
        expect((await nodeOf(n).netns.run(['nft', 'list', 'tables'], {reject: false})).stdout).not.toMatch(/pdchaos/)
      }
    }, 60_000)
  }
})
