import {readFileSync, writeFileSync} from 'node:fs'
import {dirname, join} from 'node:path'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {createTestCluster, type TestCluster} from '../harness/test-cluster.js'
import {cliEntry, type TestHost} from '../harness/test-host.js'
import {expectDroppedPin, runCli, truth} from './cli.js'

/**
 * Several prefill instances behind one gateway (issue 13): two prefill nodes and a decode node, each a namespace host
 * with its own sshd, the router on the first prefill node routing to both prefill instances as sgl-model-gateway does
 * with two `--prefill` flags (round_robin here, so both are used in a few requests).
 */
let c: TestCluster
// Small twins (one GPU per server): this file is about routing between instances, not about ranks.
beforeAll(async () => {
  c = await createTestCluster({
    prefillInstances: 2,
    args: ['--policy', 'round_robin', '--gpus', '2', '--prefill-tp', '1', '--decode-tp', '1'],
  })
}, 240_000)
afterAll(async () => {
  await c?.destroy()
}, 60_000)

describe('a twin with two prefill instances on two nodes and decode on a third', () => {
  it("the router spreads requests over both prefill instances, and each one's KV reaches decode", async () => {
    const rids = Array.from({length: 6}, (_, i) => `instances-${i}-${Date.now().toString(36)}`)
    for (const rid of rids) {
      const res = await fetch(`${c.endpoints.router}/generate`, {
        method: 'POST',
        headers: {'content-type': 'application/json'},
        body: JSON.stringify({rid, text: 'two prefill instances '.repeat(10), sampling_params: {max_new_tokens: 2}}),
        signal: AbortSignal.timeout(30_000),
      })
      expect(res.status, await res.clone().text()).toBe(200)
    }
    // By the twin's ground truth: the router sent each request to one prefill instance, alternating; each instance's
    // own server saw exactly the requests sent to it, and decode saw them all.
    const sent = truth(c.prefillNode.stateDir, 'router').filter(e => e.event === 'sent' && rids.includes(String(e.rid)))
    expect(sent).toHaveLength(6)
    const urls = c.prefillNodes.map(h => `http://${h.netns.address}:${new URL(c.endpoints.prefill).port}`)
    expect(new Set(sent.map(e => e.prefill))).toEqual(new Set(urls))
    for (const [i, node] of c.prefillNodes.entries()) {
      const mine = sent
        .filter(e => e.prefill === urls[i])
        .map(e => String(e.rid))
        .sort()
      const served = [
        ...new Set(
          truth(node.stateDir, 'prefill')
            .filter(e => rids.includes(String(e.rid)))
            .map(e => String(e.rid)),
        ),
      ].sort()
      expect(served, `prefill instance ${i + 1}`).toEqual(mine)
      expect(mine).toHaveLength(3)
    }
    const decoded = new Set(
      truth(c.decodeNode.stateDir, 'decode')
        .filter(e => rids.includes(String(e.rid)))
        .map(e => String(e.rid)),
    )
    expect(decoded.size).toBe(6)
  }, 90_000)

  it("status finds each instance on its own host, every rank with its instance, as each node's twin " +
    'counts them', async () => {
    const r = await runCli(['status', '-c', c.deploymentFile, '--json'], {timeoutMs: 60_000})
    expect(r.code, r.stdout + r.stderr).toBe(0)
    const s = JSON.parse(r.stdout) as {
      instances: Array<{role: string; path: string; host: string; pid?: number; health: {ok: boolean}}>
      ranks: Array<{service: string; host: string; instance?: string; pid: number}>
    }
    expect(s.instances.map(i => [i.path, i.host, i.health.ok])).toEqual([
      ['services.prefill[0]', 'prefill-node', true],
      ['services.prefill[1]', 'prefill-node-2', true],
      ['services.decode', 'decode-node', true],
    ])
    for (const [i, node] of c.prefillNodes.entries()) {
      const t = JSON.parse(
        (await node.sshRun([process.execPath, cliEntry(), 'sim', 'status', '--state-dir', node.stateDir, '--json']))
          .stdout,
      ) as {services: Array<{service: string; pid: number; ranks: Array<{pid: number}>}>}
      const svc = t.services.find(x => x.service === 'prefill')!
      expect(s.instances[i]!.pid).toBe(svc.pid)
      const found = s.ranks.filter(k => k.instance === `services.prefill[${i}]`)
      expect(found.map(k => k.pid).sort()).toEqual(svc.ranks.map(k => k.pid).sort())
      expect(new Set(found.map(k => k.host))).toEqual(new Set([i === 0 ? 'prefill-node' : 'prefill-node-2']))
    }
    const text = await runCli(['status', '-c', c.deploymentFile], {timeoutMs: 60_000})
    expect(text.stdout).toMatch(/prefill\[0\] +prefill-node +http.* healthy/)
    expect(text.stdout).toMatch(/prefill\[1\] +prefill-node-2 +http.* healthy/)
  }, 60_000)

  it("inject on the pair prefill[1] + decode: the fault and its lease on prefill[1]'s node, the pins held and " +
    "evicted there by its twin's truth; prefill[0] never sees them", async () => {
    const r = await runCli(
      [
        'inject',
        'drop-dest-info',
        '--prefill-instance',
        '1',
        '-c',
        c.deploymentFile,
        '--json',
        '--pins',
        '2',
        '--load-interval',
        '0',
      ],
      {timeoutMs: 120_000},
    )
    const j = JSON.parse(r.stdout) as {
      pair: unknown
      leases: Array<{host: string}>
      pins: Array<{rid: string; evictionSeconds: number}>
      verdicts: Array<{verdict: string}>
    }
    expect(
      j.verdicts.filter(v => v.verdict !== 'pass'),
      r.stderr.slice(-600),
    ).toEqual([])
    expect(r.code).toBe(0)
    expect(j.pair).toEqual({prefill: 'services.prefill[1]', decode: 'services.decode'})
    expect(j.leases.map(l => l.host)).toEqual(['prefill-node-2'])
    expect(j.pins).toHaveLength(2)
    const [first, second] = c.prefillNodes
    for (const pin of j.pins) {
      expectDroppedPin(second!.stateDir, pin, 1.5, 0.5)
      expect(truth(first!.stateDir, 'prefill').filter(e => e.rid === pin.rid)).toEqual([])
    }
    // A pair that names no instance: exit 2 before anything is reached.
    const bad = await runCli(
      ['inject', 'drop-dest-info', '--prefill-instance', '2', '-c', c.deploymentFile, '--json'],
      {timeoutMs: 60_000},
    )
    expect(bad.code).toBe(2)
    expect((JSON.parse(bad.stdout) as {error: {message: string}}).error.message).toMatch(
      /--prefill-instance 2: the deployment has 2 prefill instances, numbered 0 to 1/,
    )
  }, 180_000)

  it('a suite whose scenarios name their pairs: one batch holding both pairs, each fault and lease on its own ' +
    'prefill node, each pin held and evicted there', async () => {
    const file = join(dirname(c.deploymentFile), 'two-pairs.yaml')
    writeFileSync(
      file,
      [
        'name: two-pairs',
        'load: {intervalMs: 0}',
        'scenarios:',
        '  - {name: on prefill0, fault: drop-dest-info, pins: 2}',
        '  - {name: on prefill1, fault: drop-dest-info, pins: 2, pair: {prefill: 1}}',
        '',
      ].join('\n'),
    )
    const r = await runCli(['suite', file, '-c', c.deploymentFile, '--json'], {timeoutMs: 180_000})
    const j = JSON.parse(r.stdout) as {
      plan: string[]
      batches: Array<{scenarios: string[]}>
      scenarios: Array<{
        name: string
        pair: unknown
        leases: Array<{host: string}>
        pins: Array<{rid: string; evictionSeconds: number}>
        verdicts: Array<{verdict: string; check: string; summary: string}>
      }>
    }
    expect(
      j.scenarios.flatMap(s => s.verdicts).filter(v => v.verdict !== 'pass'),
      r.stderr.slice(-600),
    ).toEqual([])
    expect(r.code).toBe(0)
    // Each prefill instance has its own ZMQ ports and bootstrap queue: the two drops share one window.
    expect(j.plan).toEqual([
      'batch 1: on prefill0 (drop-dest-info on prefill[0] + decode[0] [zmq:all] pins in bootstrap) | on prefill1 ' +
        '(drop-dest-info on prefill[1] + decode[0] [zmq:all] pins in bootstrap)',
    ])
    expect(j.batches.map(b => b.scenarios)).toEqual([['on prefill0', 'on prefill1']])
    // Recovery was judged once, over both pairs' servers (each instance's queues drained, its tokens at baseline).
    const recovery = j.scenarios
      .flatMap(s => s.verdicts)
      .filter(v => v.check === 'recovery')
      .map(v => v.summary)
    expect(recovery).toContain('every PD queue drained to 0')
    expect(
      recovery
        .filter(x => /KV token usage back at its baseline/.test(x))
        .map(x => x.split(' ')[0])
        .sort(),
    ).toEqual(['services.decode', 'services.prefill[0]', 'services.prefill[1]'])
    const [first, second] = c.prefillNodes
    for (const [i, s] of j.scenarios.entries()) {
      const [mine, other] = i === 0 ? [first!, second!] : [second!, first!]
      expect(s.pair).toEqual({prefill: `services.prefill[${i}]`, decode: 'services.decode'})
      expect(s.leases.map(l => l.host)).toEqual([i === 0 ? 'prefill-node' : 'prefill-node-2'])
      expect(s.pins).toHaveLength(2)
      for (const pin of s.pins) {
        expectDroppedPin(mine.stateDir, pin, 1.5, 0.5)
        expect(truth(other.stateDir, 'prefill').filter(e => e.rid === pin.rid)).toEqual([])
      }
    }
  }, 240_000)

  it('a co-restart restarts every instance, each on its node behind its own gate, in the order the file states ' +
    '(prefill[1], prefill[0], decode, router); recover finds all three hosts clean', async () => {
    const pidOf = async (node: TestHost, service: string): Promise<number> => {
      const t = JSON.parse(
        (await node.sshRun([process.execPath, cliEntry(), 'sim', 'status', '--state-dir', node.stateDir, '--json']))
          .stdout,
      ) as {services: Array<{service: string; pid: number}>}
      return t.services.find(x => x.service === service)!.pid
    }
    const nodes = [...c.prefillNodes, c.decodeNode]
    const before = await Promise.all(nodes.map((n, i) => pidOf(n, i < 2 ? 'prefill' : 'decode')))
    // The same deployment, with the second prefill instance restarted first.
    const ordered = join(dirname(c.deploymentFile), 'cluster-ordered.yaml')
    writeFileSync(
      ordered,
      `${readFileSync(c.deploymentFile, 'utf8')}\nrestartOrder: ["prefill[1]", "prefill[0]", decode, router]\n`,
    )
    const r = await runCli(
      ['restart', '-c', ordered, '--json', '--watch', '2', '--settle', '3', '--health-timeout', '60'],
      {timeoutMs: 180_000},
    )
    const j = JSON.parse(r.stdout) as {
      steps: Array<{service: string; instance?: string; healthyAfterMs: number | null}>
      verdicts: Array<{verdict: string; subject: string}>
    }
    expect(
      j.verdicts.filter(v => v.verdict !== 'pass'),
      r.stderr.slice(-600),
    ).toEqual([])
    expect(r.code).toBe(0)
    expect(j.steps.map(s => [s.service, s.instance])).toEqual([
      ['prefill', 'services.prefill[1]'],
      ['prefill', 'services.prefill[0]'],
      ['decode', undefined],
      ['router', undefined],
    ])
    expect(j.verdicts.map(v => v.subject).slice(0, 4)).toEqual(['prefill[1]', 'prefill[0]', 'decode', 'router'])
    // Each restart command ran on its own node: every server there has a new pid.
    const after = await Promise.all(nodes.map((n, i) => pidOf(n, i < 2 ? 'prefill' : 'decode')))
    for (const [i, pid] of after.entries()) expect(pid, `node ${i}`).not.toBe(before[i])

    const rec = await runCli(['recover', '-c', c.deploymentFile, '--json'], {timeoutMs: 60_000})
    expect(rec.code, rec.stderr).toBe(0)
    const rj = JSON.parse(rec.stdout) as {clean: boolean; hosts: Array<{host: string}>}
    expect(rj.clean).toBe(true)
    expect(rj.hosts).toHaveLength(3)
  }, 240_000)
})
