import type {ChildProcess} from 'node:child_process'
import {fileURLToPath} from 'node:url'
import {afterAll, afterEach, beforeAll, describe, expect, it} from 'vitest'

import type {RankInfo} from '../../src/engines/sglang/discovery/discover.js'
import {parseSsConnections} from '../../src/faults/mechanisms/data-path.js'
import {dropDestInfo} from '../../src/faults/drop-dest-info.js'
import {type FaultDiscovery, type FaultPlan, type FilterTool, runProbes} from '../../src/faults/fault.js'
import {detectFilterTool, nftTableName} from '../../src/faults/mechanisms/packet-filter.js'
import {stallKv} from '../../src/faults/stall-kv.js'
import {writeFileSync} from 'node:fs'
import {join} from 'node:path'
import {SshHost, resolveSshEndpoint} from '../../src/hosts/ssh-host.js'
import {buildSigstop} from '../../src/faults/mechanisms/signals.js'
import {waitProbes} from '../../src/faults/fault.js'
import {createNetns, type Netns, runCommand} from '../harness/netns.js'
import {startSshd, type Sshd} from '../harness/sshd.js'
import {NetnsHost} from './netns-host.js'

/**
 * The packet-filter mechanism against REAL kernel state: a namespace the test creates, real TCP peers inside it,
 * the real plans of drop-dest-info and stall-kv injected with nft and with iptables, judged by their own probes
 * and by what the peers notice (echoes stop, then resume after the revert).
 */

const PEER = fileURLToPath(new URL('./tcp-peer.mjs', import.meta.url))
const isRoot = process.getuid?.() === 0

interface Peer {
  child: ChildProcess
  lines: string[]
  pid: number
  waitFor(pred: (line: string) => boolean, ms: number): Promise<string>
  pongs(): number
}

function startPeer(ns: Netns, args: string[]): Peer {
  const child = ns.exec(['node', PEER, ...args], {stdio: ['pipe', 'pipe', 'ignore']})
  const lines: string[] = []
  let buf = ''
  child.stdout!.on('data', (d: Buffer) => {
    buf += d.toString()
    for (let i = buf.indexOf('\n'); i >= 0; i = buf.indexOf('\n')) {
      lines.push(buf.slice(0, i))
      buf = buf.slice(i + 1)
    }
  })
  return {
    child,
    lines,
    pid: child.pid!,
    async waitFor(pred, ms) {
      const until = Date.now() + ms
      while (Date.now() < until) {
        const hit = lines.find(pred)
        if (hit) return hit
        await new Promise(r => setTimeout(r, 20))
      }
      throw new Error(`peer ${args.join(' ')}: no matching line within ${ms} ms (last: ${lines.at(-1)})`)
    },
    pongs: () => lines.filter(l => l.startsWith('pong')).length,
  }
}

/**
 * The root namespace's ruleset, less the tables other test files' leases own while they run alongside this one (the
 * vLLM stall tests filter the twin's loopback ports in the root namespace): a lease id that is not plain gets a hashed
 * tag (`pdchaos_h<15 hex>`, packet-filter.ts filterTag), and this file's own lease ids are all plain, so a table of
 * this file's found in the root namespace still shows.
 */
async function rootRuleset(): Promise<string> {
  const text = (await runCommand(['nft', 'list', 'ruleset'])).stdout
  return text.replace(/^table \S+ pdchaos_h[0-9a-f]{15} \{\n[\s\S]*?^\}\n?/gm, '')
}

/** Pongs received during `ms`: a stalled connection gets none. */
async function pongsDuring(peer: Peer, ms: number): Promise<number> {
  const before = peer.pongs()
  await new Promise(r => setTimeout(r, ms))
  return peer.pongs() - before
}

async function connectWorks(ns: Netns, port: number): Promise<boolean> {
  // From the root namespace to the namespace's address: crosses the namespace's input hook.
  const script = `const s=require('net').connect({host:'${ns.address}',port:${port},timeout:800},()=>{s.write('x');s.on('data',()=>process.exit(0))});s.on('timeout',()=>process.exit(3));s.on('error',()=>process.exit(4));setTimeout(()=>process.exit(5),1500)`
  const r = await runCommand(['node', '-e', script], {reject: false, timeoutMs: 5000})
  return r.code === 0
}

async function apply(host: NetnsHost, argvs: string[][]): Promise<void> {
  for (const argv of argvs) {
    const r = await host.run(argv, {timeoutMs: 10_000})
    if (r.code !== 0) throw new Error(`${argv[0]} failed: exit ${r.code}: ${r.stderr}`)
  }
}

describe.skipIf(!isRoot)('packet-filter mechanism in a network namespace', () => {
  let ns: Netns
  let host: NetnsHost
  let server: Peer
  let port: number
  let rulesetBefore: string
  const peers: Peer[] = []
  const pending: FaultPlan[] = []

  beforeAll(async () => {
    rulesetBefore = await rootRuleset()
    ns = await createNetns()
    host = new NetnsHost(ns)
    server = startPeer(ns, ['server', '0'])
    port = Number((await server.waitFor(l => l.startsWith('listening'), 10_000)).split(' ')[1])
  })

  afterEach(async () => {
    // Whatever happened, take every injected plan out again.
    for (const plan of pending.splice(0)) await apply(host, plan.revert).catch(() => undefined)
    for (const p of peers.splice(0)) p.child.kill('SIGKILL')
  })

  afterAll(async () => {
    server?.child.kill('SIGKILL')
    await ns?.destroy()
    // The root namespace's rules were never touched by anything the namespace did.
    if (rulesetBefore !== undefined) expect(await rootRuleset()).toBe(rulesetBefore)
  })

  it('detects nft first and can list rules inside the namespace', async () => {
    const t = await detectFilterTool(host)
    expect(t.tool).toBe('nft')
    expect(t.evidence).toMatch(/nftables v\d/)
  })

  for (const tool of ['nft', 'iptables'] as const satisfies readonly FilterTool[]) {
    it(
      `${tool}: drop-dest-info's plan stops TCP to the port; the revert restores it; the probes ` + `see both`,
      async () => {
        const discovery: FaultDiscovery = {
          ranks: [
            {
              service: 'prefill',
              tpRank: 0,
              pid: server.pid,
              startTicks: 1,
              state: 'S',
              title: 'sglang::scheduler_TP0',
              gpu: 0,
              zmqPort: port,
              zmqHost: ns.address,
            },
          ],
          transport: {backend: 'nixl', source: 'test'},
          servicePorts: [],
        }
        const leaseId = `t${tool}${Date.now().toString(36)}`
        const plan = dropDestInfo.plan({
          discovery,
          params: {},
          leaseId,
          facts: {filterTool: tool, filterEvidence: 'test'},
        })
        const pinger = startPeer(ns, ['pinger', ns.address, String(port)])
        peers.push(pinger)
        await pinger.waitFor(l => l.startsWith('pong'), 10_000)
        expect(await connectWorks(ns, port)).toBe(true)
        expect((await runProbes(host, plan.verifyClean)).ok).toBe(true)

        pending.push(plan)
        const t0 = performance.now()
        await apply(host, plan.inject)
        const injected = await runProbes(host, plan.verifyInjected)
        const injectMs = performance.now() - t0
        expect(injected.ok, injected.results[0]!.evidence).toBe(true)
        expect((await runProbes(host, plan.verifyClean)).ok).toBe(false)
        // The established connection stalls and a new one cannot be made.
        await new Promise(r => setTimeout(r, 150))
        expect(await pongsDuring(pinger, 700)).toBe(0)
        expect(await connectWorks(ns, port)).toBe(false)
        const counted = await runProbes(host, plan.verifyInjected)
        expect(counted.results[0]!.evidence).toMatch(/[1-9]\d* packet\(s\) matched/)

        const t1 = performance.now()
        await apply(host, plan.revert)
        pending.splice(pending.indexOf(plan), 1)
        const clean = await runProbes(host, plan.verifyClean)
        const revertMs = performance.now() - t1
        expect(clean.ok, clean.results[0]!.evidence).toBe(true)
        console.log(
          `[faults-bench] ${tool} drop-dest-info (local netns): inject+verified ${injectMs.toFixed(1)} ms, ` +
            `revert+verified clean ${revertMs.toFixed(1)} ms`,
        )
        expect((await runProbes(host, plan.verifyInjected)).ok).toBe(false)
        // TCP retransmits: the same connection recovers (RTO backoff after ~1 s of loss stays well under 10 s).
        const before = pinger.pongs()
        await pinger.waitFor(() => pinger.pongs() > before + 2, 15_000)
        expect(await connectWorks(ns, port)).toBe(true)
        // Idempotent: a second revert succeeds and changes nothing.
        await apply(host, plan.revert)
        expect((await runProbes(host, plan.verifyClean)).ok).toBe(true)
      },
    )

    it(
      `${tool}: stall-kv's plan drops exactly one rank's connection (4-tuple), others to the same port keep ` +
        `flowing`,
      async () => {
        const victim = startPeer(ns, ['pinger', '127.0.0.1', String(port)])
        const bystander = startPeer(ns, ['pinger', '127.0.0.1', String(port)])
        peers.push(victim, bystander)
        await victim.waitFor(l => l.startsWith('pong'), 10_000)
        await bystander.waitFor(l => l.startsWith('pong'), 10_000)
        // The victim plays a prefill rank on GPU 0, the server the decode rank it sends KV to.
        const ranks: RankInfo[] = [
          {
            service: 'prefill',
            tpRank: 0,
            pid: victim.pid,
            startTicks: 1,
            state: 'S',
            title: 'sglang::scheduler_TP0',
            gpu: 0,
            zmqPort: 1,
          },
          {
            service: 'decode',
            tpRank: 0,
            pid: server.pid,
            startTicks: 1,
            state: 'S',
            title: 'sglang::scheduler_TP0',
            gpu: 1,
          },
        ]
        const discovery: FaultDiscovery = {
          ranks,
          transport: {backend: 'nixl', source: 'test', env: {UCX_TLS: 'tcp'}},
          servicePorts: [],
        }
        const facts = await stallKv.gather(host, discovery, {gpu: 0, mechanism: 'auto', side: 'prefill'})
        expect(facts.filterTool).toBe('nft')
        const leaseId = `s${tool}${Date.now().toString(36)}`
        const plan = stallKv.plan({
          discovery,
          params: {gpu: 0, mechanism: 'auto', side: 'prefill'},
          leaseId,
          facts: {...facts, filterTool: tool},
        })
        expect(plan.mechanism).toBe('packet-filter')
        expect(plan.targets[0]!.connections).toHaveLength(1)
        expect(plan.targets[0]!.connections![0]!.peer.port).toBe(port)

        pending.push(plan)
        await apply(host, plan.inject)
        expect((await runProbes(host, plan.verifyInjected)).ok).toBe(true)
        await new Promise(r => setTimeout(r, 150))
        const [v, b] = await Promise.all([pongsDuring(victim, 700), pongsDuring(bystander, 700)])
        expect(v).toBe(0)
        expect(b).toBeGreaterThan(5)

        await apply(host, plan.revert)
        pending.splice(pending.indexOf(plan), 1)
        expect((await runProbes(host, plan.verifyClean)).ok).toBe(true)
        const before = victim.pongs()
        await victim.waitFor(() => victim.pongs() > before + 2, 15_000)
      },
    )
  }

  it("a revert deletes only its own table: another lease's table and foreign rules stay", async () => {
    const discovery: FaultDiscovery = {
      ranks: [
        {
          service: 'prefill',
          tpRank: 0,
          pid: server.pid,
          startTicks: 1,
          state: 'S',
          title: 'sglang::scheduler_TP0',
          zmqPort: port,
        },
      ],
      transport: {backend: 'nixl', source: 'test'},
      servicePorts: [],
    }
    await ns.run([
      'nft',
      'add table inet someone_else; add chain inet someone_else c { type filter hook input priority 0; policy ' +
        'accept; }; add rule inet someone_else c tcp dport 9 counter accept',
    ])
    const a = dropDestInfo.plan({discovery, params: {}, leaseId: 'lease_a', facts: {filterTool: 'nft'}})
    const b = dropDestInfo.plan({discovery, params: {}, leaseId: 'lease_b', facts: {filterTool: 'nft'}})
    pending.push(a, b)
    await apply(host, a.inject)
    await apply(host, b.inject)
    await apply(host, a.revert)
    const tables = (await ns.run(['nft', 'list', 'tables'])).stdout
    expect(tables).not.toContain(nftTableName('lease_a'))
    expect(tables).toContain(nftTableName('lease_b'))
    expect(tables).toContain('someone_else')
    expect((await runProbes(host, b.verifyInjected)).ok).toBe(true)
    await apply(host, b.revert)
    pending.length = 0
    expect((await ns.run(['nft', 'list', 'ruleset'])).stdout).toMatch(
      /table inet someone_else[\s\S]*tcp dport 9 counter packets \d+ bytes \d+ accept/,
    )
    await ns.run(['nft', 'delete', 'table', 'inet', 'someone_else'])
  })

  it('over a real sshd inside the namespace: inject -> verified and revert -> verified clean, timed', async () => {
    let sshd: Sshd | undefined
    let ssh: SshHost | undefined
    try {
      sshd = await startSshd({netns: ns.name, host: ns.address})
      const knownHosts = join(sshd.dir, 'known_hosts')
      writeFileSync(knownHosts, sshd.knownHostsLine)
      ssh = new SshHost(
        await resolveSshEndpoint(
          {
            kind: 'ssh',
            hostname: sshd.host,
            port: sshd.port,
            user: 'root',
            identityFile: sshd.clientKeyPath,
            knownHosts,
            connectTimeoutSeconds: 5,
          },
          {sshConfigPath: '/nonexistent'},
        ),
      )
      const discovery: FaultDiscovery = {
        ranks: [
          {
            service: 'prefill',
            tpRank: 0,
            pid: server.pid,
            startTicks: 1,
            state: 'S',
            title: 'sglang::scheduler_TP0',
            zmqPort: port,
            zmqHost: ns.address,
          },
        ],
        transport: {backend: 'nixl', source: 'test'},
        servicePorts: [],
      }
      const facts = await dropDestInfo.gather(ssh, discovery, {})
      expect(facts.filterTool).toBe('nft')
      const sleeper = startPeer(ns, ['server', '0'])
      peers.push(sleeper)
      await sleeper.waitFor(l => l.startsWith('listening'), 10_000)
      const stat = (await ns.run(['cat', `/proc/${sleeper.pid}/stat`])).stdout
      const id = {pid: sleeper.pid, startTicks: Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19])}
      await ssh.run(['true'], {timeoutMs: 5000}) // connection warm, as pdchaos holds one open
      const timings: Record<string, number[]> = {nftInject: [], nftClean: [], stopInject: [], stopClean: []}
      for (let i = 0; i < 5; i++) {
        const plan = dropDestInfo.plan({discovery, params: {}, leaseId: `ssh${i}`, facts})
        pending.push(plan)
        let t = performance.now()
        for (const argv of plan.inject) await ssh.run(argv, {timeoutMs: 5000})
        expect((await waitProbes(ssh, plan.verifyInjected, 3000)).ok).toBe(true)
        timings.nftInject!.push(performance.now() - t)
        t = performance.now()
        for (const argv of plan.revert) await ssh.run(argv, {timeoutMs: 5000})
        expect((await waitProbes(ssh, plan.verifyClean, 3000)).ok).toBe(true)
        timings.nftClean!.push(performance.now() - t)
        pending.splice(pending.indexOf(plan), 1)

        const stop = buildSigstop(id, 'sleeper')
        t = performance.now()
        await ssh.run(stop.inject[0]!, {timeoutMs: 5000})
        expect((await waitProbes(ssh, [stop.verifyInjected], 3000)).ok).toBe(true)
        timings.stopInject!.push(performance.now() - t)
        t = performance.now()
        await ssh.run(stop.revert[0]!, {timeoutMs: 5000})
        expect((await waitProbes(ssh, [stop.verifyClean], 3000)).ok).toBe(true)
        timings.stopClean!.push(performance.now() - t)
      }
      const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!.toFixed(1)
      console.log(
        `[faults-bench] over ssh (5 runs, median): nft inject+verified ${median(timings.nftInject!)} ms, ` +
          `revert+clean ${median(timings.nftClean!)} ms; ` +
          `sigstop inject+verified ${median(timings.stopInject!)} ms, revert+clean ${median(timings.stopClean!)} ms`,
      )
      for (const xs of Object.values(timings)) for (const x of xs) expect(x).toBeLessThan(1000)
    } finally {
      await ssh?.close()
      await sshd?.stop()
    }
  })

  it('ss inside the namespace shows the peers with their pids (what stall-kv reads)', async () => {
    const p = startPeer(ns, ['pinger', '127.0.0.1', String(port)])
    peers.push(p)
    const local = Number((await p.waitFor(l => l.startsWith('connected'), 10_000)).split(' ')[1])
    const conns = parseSsConnections((await ns.run(['ss', '-tnpH'])).stdout)
    const mine = conns.find(c => c.local.port === local)
    expect(mine).toMatchObject({state: 'ESTAB', peer: {addr: '127.0.0.1', port}, pids: [p.pid]})
    expect(conns.find(c => c.local.port === port && c.peer.port === local)?.pids).toEqual([server.pid])
  })
})
