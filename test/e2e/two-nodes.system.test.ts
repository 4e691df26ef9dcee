import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {createTestCluster, type TestCluster} from '../harness/test-cluster.js'
import {cliEntry} from '../harness/test-host.js'
import {appendFileSync, existsSync, readdirSync, readFileSync, writeFileSync} from 'node:fs'
import {join} from 'node:path'

import {eventually, evictionOf as evictionOfIn, expectAbortTrials, expectDroppedPin, runCli, startUntil} from './cli.js'

/**
 * A deployment over two nodes (issue 13): prefill and the router on one namespace host, decode on another, each with
 * its own sshd, the twin started on each as SGLang is started per node.
 */
let c: TestCluster
beforeAll(async () => {
  c = await createTestCluster()
}, 180_000)
afterAll(async () => {
  await c?.destroy()
}, 60_000)

describe('a twin over two nodes', () => {
  it('serves a request through the router, its KV crossing from the prefill node to the decode node', async () => {
    const res = await fetch(`${c.endpoints.router}/generate`, {
      method: 'POST',
      headers: {'content-type': 'application/json'},
      body: JSON.stringify({text: 'two nodes '.repeat(20), max_new_tokens: 2}),
      signal: AbortSignal.timeout(30_000),
    })
    expect(res.status, await res.clone().text()).toBe(200)
    expect(c.endpoints.decode).toContain(c.decodeNode.netns.address)
    expect(c.endpoints.prefill).toContain(c.prefillNode.netns.address)
  }, 60_000)
})

describe('status over two hosts', () => {
  it("finds every rank on the host it runs on, as each node's twin counts them, and each service on " +
    'its host', async () => {
    const r = await runCli(['status', '-c', c.deploymentFile, '--json'], {timeoutMs: 60_000})
    expect(r.code, r.stderr).toBe(0)
    const s = JSON.parse(r.stdout) as {
      services: Record<string, {host: string; pid?: number; health: {ok: boolean}}>
      ranks: Array<{
        service: string
        host: string
        tpRank: number
        pid: number
        gpu?: number
        zmqPort?: number
        zmqHost?: string
      }>
      hosts: Array<{name: string; roles: string[]}>
      warnings: string[]
    }
    expect(s.hosts.map(h => [h.name, h.roles])).toEqual([
      ['prefill-node', ['prefill', 'router']],
      ['decode-node', ['decode']],
    ])
    expect(Object.fromEntries(Object.entries(s.services).map(([k, v]) => [k, v.host]))).toEqual({
      prefill: 'prefill-node',
      decode: 'decode-node',
      router: 'prefill-node',
    })
    // The twin's ground truth on each node: its own `sim status` (the pids of the ranks it started, their GPUs).
    for (const [node, role] of [
      [c.prefillNode, 'prefill'],
      [c.decodeNode, 'decode'],
    ] as const) {
      const truth = await node.sshRun([
        process.execPath,
        cliEntry(),
        'sim',
        'status',
        '--state-dir',
        node.stateDir,
        '--json',
      ])
      const t = JSON.parse(truth.stdout) as {
        services: Array<{
          service: string
          pid: number
          ranks: Array<{tpRank: number; pid: number; gpu?: number; zmqPort?: number}>
        }>
      }
      const svc = t.services.find(x => x.service === role)!
      expect(s.services[role]!.pid).toBe(svc.pid)
      const found = s.ranks.filter(k => k.service === role)
      expect(found.map(k => k.host)).toEqual(svc.ranks.map(() => (role === 'prefill' ? 'prefill-node' : 'decode-node')))
      expect(found.map(k => [k.tpRank, k.pid, k.gpu]).sort()).toEqual(
        svc.ranks.map(k => [k.tpRank, k.pid, k.gpu]).sort(),
      )
      if (role === 'prefill') {
        // Each prefill rank's ZMQ port from the bootstrap route, at the prefill node's own address.
        expect(found.map(k => [k.tpRank, k.zmqPort]).sort()).toEqual(svc.ranks.map(k => [k.tpRank, k.zmqPort]).sort())
        expect(new Set(found.map(k => k.zmqHost))).toEqual(new Set([c.prefillNode.netns.address]))
      }
    }
    expect(s.warnings).toEqual([])
    const text = await runCli(['status', '-c', c.deploymentFile], {timeoutMs: 60_000})
    expect(text.stdout).toMatch(/hosts\n {2}prefill-node .* runs prefill, router\n {2}decode-node .* runs decode/)
    expect(text.stdout).toMatch(/decode {3}decode-node {2}TP0 {2}pid/)
  }, 60_000)
})

const DEADLINE = 1.5
const POLL = 0.5

const evictionOf = (rid: string) => evictionOfIn(c.prefillNode.stateDir, rid)

/** pdchaos's state dir of each host of the cluster (its file's stateDir, one directory per host). */
const leaseDir = (host: 'prefill-node' | 'decode-node'): string => join(c.prefillNode.dir, 'host-run', host, 'leases')
const leaseFiles = (host: 'prefill-node' | 'decode-node', sub = ''): string[] =>
  existsSync(join(leaseDir(host), sub)) ? readdirSync(join(leaseDir(host), sub)).filter(f => f.endsWith('.json')) : []

// eslint-disable-next-line @typescript-eslint/no-explicit-any
const json = (s: string): any => JSON.parse(s)

describe('faults across two hosts, each acting on the host that owns what it targets', () => {
  it("drop-dest-info acts on the prefill node: pins held in Bootstrapping, evicted in the window by the twin's " +
    'truth; its lease lives and ends there', async () => {
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
    expect(j.leases.map((l: {host: string}) => l.host)).toEqual(['prefill-node'])
    for (const pin of j.pins) expectDroppedPin(c.prefillNode.stateDir, pin, DEADLINE, POLL)
    // The lease on the prefill node, reverted by pdchaos; nothing on the decode node.
    expect(leaseFiles('prefill-node', 'done').length).toBeGreaterThan(0)
    expect(leaseFiles('prefill-node')).toEqual([])
    expect(leaseFiles('decode-node', 'done')).toEqual([])
  }, 180_000)

  it('stall-kv on a decode GPU acts on the decode node (its own host): the pins are held on prefill and evicted in ' +
    "the window by the twin's truth", async () => {
    const r = await runCli(
      ['inject', 'stall-kv', '--gpu', '5', '-c', c.deploymentFile, '--json', '--pins', '2', '--load-interval', '400'],
      {timeoutMs: 120_000},
    )
    const j = json(r.stdout)
    expect(
      j.verdicts.filter((v: {verdict: string}) => v.verdict !== 'pass' && v.verdict !== 'unverified'),
      r.stderr.slice(-500),
    ).toEqual([])
    expect(r.code).toBe(0)
    expect(j.leases.map((l: {host: string}) => l.host)).toEqual(['decode-node'])
    expect(j.description).toMatch(/decode TP1 .*GPU 5/)
    for (const pin of j.pins) {
      // Decode TP1's connections carry both its half of the KV handshake and the KV itself: with both stalled, the
      // twin's prefill holds the pin waiting (Bootstrapping) or transferring, and its watchdog evicts it in the window.
      const t = evictionOf(pin.rid)
      expect(['KVPoll.Bootstrapping', 'KVPoll.Transferring']).toContain(t.states.at(-1))
      expect(t.heldS!).toBeGreaterThanOrEqual(DEADLINE)
      expect(t.heldS!).toBeLessThanOrEqual(DEADLINE + POLL + 0.05)
    }
    expect(leaseFiles('decode-node', 'done').length).toBeGreaterThan(0)
    expect(leaseFiles('decode-node')).toEqual([])
  }, 180_000)

  it('abort-mid-transfer: every trial gets its verdict; the twin saw each abort on prefill', async () => {
    const r = await runCli(['inject', 'abort-mid-transfer', '--trials', '4', '-c', c.deploymentFile, '--json'], {
      timeoutMs: 120_000,
    })
    expectAbortTrials(r, c.prefillNode.stateDir, 4)
  }, 180_000)

  it('a suite batch with a fault on each host: one batch, a lease on each host (each its own guard and reverter), ' +
    'every check passes, both hosts clean', async () => {
    const suiteFile = join(c.prefillNode.dir, 'two-hosts-suite.yaml')
    writeFileSync(
      suiteFile,
      [
        'name: two-hosts',
        'scenarios:',
        '  - {name: stall on prefill, fault: stall-kv, params: {gpu: 1}, pins: 2}',
        '  - {name: stall on decode, fault: stall-kv, params: {gpu: 5}, pins: 2}',
        'load: {intervalMs: 400}',
        'stop: {kernelXid: false}',
        '',
      ].join('\n'),
    )
    const r = await runCli(['suite', suiteFile, '-c', c.deploymentFile, '--json'], {timeoutMs: 180_000})
    const j = json(r.stdout)
    expect(j.batches.map((b: {scenarios: string[]}) => b.scenarios)).toEqual([['stall on prefill', 'stall on decode']])
    const leases = j.scenarios.flatMap((s: {leases: Array<{host: string; verifiedClean: boolean}>}) => s.leases)
    expect(leases.map((l: {host: string}) => l.host).sort()).toEqual(['decode-node', 'prefill-node'])
    expect(leases.every((l: {verifiedClean: boolean}) => l.verifiedClean)).toBe(true)
    const bad = j.scenarios.flatMap((s: {verdicts: Array<{verdict: string; check: string; summary: string}>}) =>
      s.verdicts.filter(v => v.verdict === 'fail'),
    )
    expect(bad).toEqual([])
    expect(r.code, JSON.stringify(j.failedChecks ?? j.summary)).toBe(0)
    for (const host of ['prefill-node', 'decode-node'] as const) expect(leaseFiles(host)).toEqual([])
  }, 240_000)

  it("an Xid on the decode node's kernel log stops the suite (exit 3, naming the host): each GPU host's kernel log " +
    'is watched', async () => {
    // The decode node's dmesg is a stand-in first on its login PATH (the twin's bin dir): the namespaces share this
    // machine's kernel, whose log a test must not write to.
    const kmsg = join(c.decodeNode.stateDir, 'kmsg.txt')
    writeFileSync(kmsg, '[    1.000000] pci 0000:3b:00.0: boot\n')
    writeFileSync(join(c.decodeNode.stateDir, 'bin', 'dmesg'), `#!/bin/sh\ncat ${kmsg}\n`, {mode: 0o755})
    const suiteFile = join(c.prefillNode.dir, 'xid-suite.yaml')
    writeFileSync(
      suiteFile,
      'name: xid\nscenarios:\n  - {name: stall on decode, fault: stall-kv, params: {gpu: 5}, pins: 2}\nload: ' +
        '{intervalMs: 400}\nstop: {kernelXid: true}\n',
    )
    const {done} = await startUntil(['suite', suiteFile, '-c', c.deploymentFile], /stall on decode: in place/)
    appendFileSync(kmsg, '[  100.000000] NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus.\n')
    const r = await done
    expect(r.code, r.stderr.slice(-800)).toBe(3)
    expect(r.stderr).toMatch(
      /STOP: new Xid line in the host's kernel log on decode-node: .*NVRM: Xid \(PCI:0000:3b:00\): 79/,
    )
    for (const host of ['prefill-node', 'decode-node'] as const) expect(leaseFiles(host)).toEqual([])
  }, 180_000)

  it('a co-restart across hosts: prefill on its node, then decode on its node, then the router; every step ' +
    'healthy, then recover finds both hosts clean', async () => {
    const pidsOf = async (node: typeof c.prefillNode) => {
      const t = json(
        (await node.sshRun([process.execPath, cliEntry(), 'sim', 'status', '--state-dir', node.stateDir, '--json']))
          .stdout,
      )
      return Object.fromEntries(t.services.map((s: {service: string; pid: number}) => [s.service, s.pid]))
    }
    const before = {...(await pidsOf(c.prefillNode)), ...(await pidsOf(c.decodeNode))}
    const r = await runCli(
      ['restart', '-c', c.deploymentFile, '--json', '--watch', '3', '--settle', '3', '--health-timeout', '60'],
      {timeoutMs: 180_000},
    )
    const j = json(r.stdout)
    expect(j.verdicts.filter((v: {verdict: string}) => v.verdict !== 'pass')).toEqual([])
    expect(r.code).toBe(0)
    expect(j.steps.map((s: {service: string}) => s.service)).toEqual(['prefill', 'decode', 'router'])
    const after = {...(await pidsOf(c.prefillNode)), ...(await pidsOf(c.decodeNode))}
    for (const s of ['prefill', 'decode', 'router']) expect(after[s], s).not.toBe(before[s])

    const rec = await runCli(['recover', '-c', c.deploymentFile, '--json'], {timeoutMs: 60_000})
    expect(rec.code).toBe(0)
    const rj = json(rec.stdout)
    expect(rj.clean).toBe(true)
    expect(rj.hosts.map((h: {host: string}) => h.host)).toEqual([
      `ssh root@${c.prefillNode.netns.address}:22`,
      `ssh root@${c.decodeNode.netns.address}:22`,
    ])
  }, 240_000)
})

describe('Ctrl-C', () => {
  it('inject stopped by SIGINT while its fault is in place: exit 3, the fault reverted by the run itself, the ' +
    'journal written, no lease or lock left on either host', async () => {
    const journal = join(c.prefillNode.dir, 'interrupted.json')
    const {child, done} = await startUntil(
      [
        'inject',
        'stall-kv',
        '--gpu',
        '5',
        '-c',
        c.deploymentFile,
        '--pins',
        '1',
        '--load-interval',
        '0',
        '--journal',
        journal,
      ],
      /stall-kv: in place/,
    )
    child.kill('SIGINT')
    const r = await done
    expect(r.code, r.stderr.slice(-800)).toBe(3)
    // Reverted by the run's own flow (verified clean), not by the lease guard's emergency exit.
    expect(r.stderr).toMatch(/stall-kv: verified clean/)
    const j = json(readFileSync(journal, 'utf8'))
    expect(j.stopped.reason).toMatch(/interrupted \(SIGINT\)/)
    expect(j.leases).toMatchObject([{host: 'decode-node', verifiedClean: true}])
    for (const host of ['prefill-node', 'decode-node'] as const) {
      expect(leaseFiles(host)).toEqual([])
      expect(existsSync(join(c.prefillNode.dir, 'host-run', host, 'lock.json'))).toBe(false)
    }
  }, 180_000)
})

// Last: it cuts every SSH connection to the decode node for good.
describe('losing one host mid-fault', () => {
  it('SSH to the decode node cut while its stall is in place: pdchaos exits 4 naming the lease and the host, the ' +
    'decode node reverts it by itself within the TTL, the prefill node is left clean', async () => {
    const TTL_S = 8
    const {child, done} = await startUntil(
      [
        'inject',
        'stall-kv',
        '--gpu',
        '5',
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
    const cutAt = Date.now()
    await c.decodeNode.sshd.killAll()
    child.kill('SIGINT')
    const r = await done
    expect(r.code, r.stderr.slice(-800)).toBe(4)
    const lease = /lease (stall-kv-\S+?)[ ,:;)]/.exec(r.stderr)?.[1]
    expect(lease, r.stderr.slice(-800)).toBeDefined()
    expect(r.stderr).toMatch(/cleanup unverified.*the host reverts it by itself at \d{4}-\d\d-\d\dT/)

    // The decode node's own reverter takes the stall out by the lease's expiry: its packet filter and its lease file
    // go.
    const nftTables = async () => (await c.decodeNode.netns.run(['nft', 'list', 'tables'], {reject: false})).stdout
    expect(await nftTables()).toMatch(/pdchaos_/)
    expect(
      await eventually(
        async () => !/pdchaos_/.test(await nftTables()) && leaseFiles('decode-node').length === 0,
        cutAt + (TTL_S + 5) * 1000 - Date.now(),
      ),
    ).toBe(true)
    expect(leaseFiles('decode-node', 'done').some(f => f.startsWith(lease!))).toBe(true)
    // The prefill node: nothing left armed, and the run lock released there.
    expect(leaseFiles('prefill-node')).toEqual([])
    expect(existsSync(join(c.prefillNode.dir, 'host-run', 'prefill-node', 'lock.json'))).toBe(false)

    // Every command reaches every host first: with the decode node gone, status is exit 5 naming it.
    const st = await runCli(['status', '-c', c.deploymentFile], {timeoutMs: 60_000})
    expect(st.code).toBe(5)
    expect(st.stderr).toContain(c.decodeNode.netns.address)
  }, 180_000)
})
