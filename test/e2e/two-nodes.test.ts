import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {createTestCluster, type TestCluster} from '../harness/test-cluster.js'
import {cliEntry} from '../harness/test-host.js'
import {runCli} from './cli.js'

/**
 * A deployment over two nodes (issue 13): prefill and the router on one namespace host, decode on another, each with
 * its own sshd, the twin started on each as SGLang is started per node.
 */
let c: TestCluster
beforeAll(async () => { c = await createTestCluster() }, 180_000)
afterAll(async () => { await c?.destroy() }, 60_000)

describe('a twin over two nodes', () => {
  it('serves a request through the router, its KV crossing from the prefill node to the decode node', async () => {
    const res = await fetch(`${c.endpoints.router}/generate`, {method: 'POST', headers: {'content-type': 'application/json'}, body: JSON.stringify({text: 'two nodes '.repeat(20), max_new_tokens: 2}), signal: AbortSignal.timeout(30_000)})
    expect(res.status, await res.clone().text()).toBe(200)
    expect(c.endpoints.decode).toContain(c.decodeNode.netns.address)
    expect(c.endpoints.prefill).toContain(c.prefillNode.netns.address)
  }, 60_000)
})

describe('status over two hosts', () => {
  it('finds every rank on the host it runs on, as each node\'s twin counts them, and each service on its host', async () => {
    const r = await runCli(['status', '-c', c.deploymentFile, '--json'], {timeoutMs: 60_000})
    expect(r.code, r.stderr).toBe(0)
    const s = JSON.parse(r.stdout) as {
      services: Record<string, {host: string; pid?: number; health: {ok: boolean}}>
      ranks: Array<{service: string; host: string; tpRank: number; pid: number; gpu?: number; zmqPort?: number; zmqHost?: string}>
      hosts: Array<{name: string; roles: string[]}>
      warnings: string[]
    }
    expect(s.hosts.map((h) => [h.name, h.roles])).toEqual([['prefill-node', ['prefill', 'router']], ['decode-node', ['decode']]])
    expect(Object.fromEntries(Object.entries(s.services).map(([k, v]) => [k, v.host]))).toEqual({prefill: 'prefill-node', decode: 'decode-node', router: 'prefill-node'})
    // The twin's ground truth on each node: its own `sim status` (the pids of the ranks it started, their GPUs).
    for (const [node, role] of [[c.prefillNode, 'prefill'], [c.decodeNode, 'decode']] as const) {
      const truth = await node.sshRun([process.execPath, cliEntry(), 'sim', 'status', '--state-dir', node.stateDir, '--json'])
      const t = JSON.parse(truth.stdout) as {services: Array<{service: string; pid: number; ranks: Array<{tpRank: number; pid: number; gpu?: number; zmqPort?: number}>}>}
      const svc = t.services.find((x) => x.service === role)!
      expect(s.services[role]!.pid).toBe(svc.pid)
      const found = s.ranks.filter((k) => k.service === role)
      expect(found.map((k) => k.host)).toEqual(svc.ranks.map(() => (role === 'prefill' ? 'prefill-node' : 'decode-node')))
      expect(found.map((k) => [k.tpRank, k.pid, k.gpu]).sort()).toEqual(svc.ranks.map((k) => [k.tpRank, k.pid, k.gpu]).sort())
      if (role === 'prefill') {
        // Each prefill rank's ZMQ port from the bootstrap route, at the prefill node's own address.
        expect(found.map((k) => [k.tpRank, k.zmqPort]).sort()).toEqual(svc.ranks.map((k) => [k.tpRank, k.zmqPort]).sort())
        expect(new Set(found.map((k) => k.zmqHost))).toEqual(new Set([c.prefillNode.netns.address]))
      }
    }
    expect(s.warnings).toEqual([])
    const text = await runCli(['status', '-c', c.deploymentFile], {timeoutMs: 60_000})
    expect(text.stdout).toMatch(/hosts\n {2}prefill-node .* runs prefill, router\n {2}decode-node .* runs decode/)
    expect(text.stdout).toMatch(/decode {3}decode-node {2}TP0 {2}pid/)
  }, 60_000)

  it('inject still refuses a deployment over two hosts (exit 2, naming what is missing), before reaching any host', async () => {
    const r = await runCli(['inject', 'drop-dest-info', '-c', c.deploymentFile, '--json'], {timeoutMs: 60_000})
    expect(r.code).toBe(2)
    expect(JSON.parse(r.stdout).error.message).toMatch(/spans 2 hosts \(prefill-node, decode-node\): inject acts on one host today/)
  }, 60_000)
})
