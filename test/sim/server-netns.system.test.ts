import {mkdtempSync, readFileSync, rmSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {createNetns, type Netns} from '../harness/netns.js'
import {cliEntry} from '../harness/test-host.js'
import {
  launchPair,
  nextRoom,
  pdBody,
  post,
  waitFor,
  firstEvent,
  eventsOf,
  abortRid,
  internalState,
  metric,
  type Answer,
  type Pair,
} from './launch-pair.js'

/**
 * Faults made with iptables, as pdchaos makes them on a real host, inside a namespace the test owns
 * (10.231.N.2): the twin runs there, and only that namespace's rules are touched.
 */
const isRoot = process.getuid?.() === 0

describe.skipIf(!isRoot)('twin under iptables faults (network namespace)', () => {
  let ns: Netns
  let pair: Pair
  beforeAll(async () => {
    ns = await createNetns()
    try {
      pair = await launchPair({
        host: ns.address,
        wrap: [...ns.prefix],
        prefillTp: 2,
        decodeTp: 2,
        watchdog: {scope: 'off'},
      })
    } catch (err) {
      await ns.destroy()
      throw err
    }
  })
  afterAll(async () => {
    try {
      await pair?.stop()
    } finally {
      await ns?.destroy()
    }
  })

  const iptables = (op: '-A' | '-D', port: number) =>
    ns.run(['iptables', op, 'INPUT', '-p', 'tcp', '--dport', String(port), '-j', 'DROP'])

  it('drop-dest-info: with the prefill rank_port dropped the request stays in Bootstrapping', async () => {
    const port = pair.service('prefill').rankPorts[0]!.zmqPort
    await iptables('-A', port)
    try {
      const body = pdBody(pair, 'ns-ddi-1', nextRoom())
      const p = post(pair.prefillUrl, body)
      const d = post(pair.decodeUrl, body)
      await waitFor('decode sent its destination info', () =>
        firstEvent(pair, 'decode', 'ns-ddi-1', 'enter', 'transfer'),
      )
      await new Promise(r => setTimeout(r, 2000))
      const states = eventsOf(pair, 'prefill', 'ns-ddi-1')
        .filter(e => e.event === 'state')
        .map(e => e.state)
      expect(states).toEqual(['KVPoll.Bootstrapping'])
      expect((await internalState(pair.prefillUrl)).bootstrap).toBe(1)
      await abortRid(pair.prefillUrl, 'ns-ddi-1')
      await abortRid(pair.decodeUrl, 'ns-ddi-1')
      expect((await p).status).toBe(500)
      expect((await d).status).toBe(500)
    } finally {
      await iptables('-D', port)
    }
  })

  it(
    'stall-kv: with one decode data port dropped the request stays in Transferring, decode stays ' + 'healthy',
    async () => {
      // The WRITE is one-sided, but "written" means acknowledged by the peer's kernel, not accepted into ours: these
      // 256 KiB per rank fit the send buffer (about 4 MB is accepted under a DROP, measured), yet never complete.
      const port = pair.service('decode').rankPorts[0]!.dataPort!
      await iptables('-A', port)
      try {
        const body = pdBody(pair, 'ns-stall-1', nextRoom())
        const p = post(pair.prefillUrl, body)
        const d = post(pair.decodeUrl, body)
        await waitFor('prefill Transferring', () =>
          eventsOf(pair, 'prefill', 'ns-stall-1').find(e => e.event === 'state' && e.state === 'KVPoll.Transferring'),
        )
        await new Promise(r => setTimeout(r, 2000))
        expect(firstEvent(pair, 'prefill', 'ns-stall-1', 'exit', 'inflight')).toBeUndefined()
        expect((await internalState(pair.prefillUrl)).inflight).toBe(1)
        expect((await fetch(`${pair.decodeUrl}/health`)).status).toBe(200)
        await abortRid(pair.prefillUrl, 'ns-stall-1')
        await abortRid(pair.decodeUrl, 'ns-stall-1')
        expect((await p).status).toBe(500)
        expect((await d).status).toBe(500)
      } finally {
        await iptables('-D', port)
      }
    },
  )
})

/**
 * `sim up --rail-nics` run as root inside a namespace of the test's own (pdc-rail-…), as pdchaos runs it on a test
 * host: one veth rail<g> per GPU, KV as UDP 4791 over the GPU's rail, UCX's RC limits from the environment
 * (300ms -> a 268 ms QP timeout, 2 retries: a stall longer than 805 ms fails the endpoint). Faults are netfilter
 * rules on the rail interface, as pdchaos makes them here (this kernel has no tc flower).
 */
describe.skipIf(!isRoot)('twin with rail NICs (sim up --rail-nics in a network namespace)', () => {
  let ns: Netns
  let dir: string
  let up: {endpoints: Record<string, string>; rankPids: {prefill: number[]; decode: number[]}}
  const basePort = 52_000 + Math.floor(Math.random() * 50) * 10
  const cli = (...args: string[]) =>
    ns.run([process.execPath, cliEntry('dev'), ...args], {timeoutMs: 120_000, reject: false})
  const ipt = (...args: string[]) => ns.run(['iptables', ...args])
  beforeAll(async () => {
    ns = await createNetns({prefix: 'pdc-rail-'})
    dir = mkdtempSync(join(tmpdir(), 'pdchaos-rail-'))
    const r = await cli(
      'sim',
      'up',
      '--rail-nics',
      '--ucx-rc-timeout',
      '300ms',
      '--ucx-rc-retry-count',
      '2',
      '--host',
      ns.address,
      '--state-dir',
      dir,
      '--base-port',
      String(basePort),
      '--prefill-tp',
      '2',
      '--decode-tp',
      '2',
      '--watchdog',
      'off',
      '--waiting-timeout',
      '20',
      '--json',
    )
    if (r.code !== 0) {
      await ns.destroy()
      throw new Error(
        `sim up --rail-nics exited ${r.code}: ${(r.stderr || r.stdout).trim().split('\n').slice(-5).join(' | ')}`,
      )
    }
    up = JSON.parse(r.stdout) as typeof up
  })
  afterAll(async () => {
    try {
      if (dir) await cli('sim', 'down', '--state-dir', dir, '--json')
    } finally {
      await ns?.destroy()
      if (dir) rmSync(dir, {recursive: true, force: true})
    }
  })

  let seq = 0
  /** A PD request straight to prefill and decode (same rid and room), as the router sends one. */
  function send(rid: string, tokens = 1000) {
    const body =
      `{"rid":"${rid}","text":"${'x'.repeat(4 * tokens)}","sampling_params":{"max_new_tokens":2},"bootstrap_host":"${ns.address}",` +
      `"bootstrap_port":${basePort + 500},"bootstrap_room":${nextRoom()}}`
    const swallow = (p: Promise<Answer>) => {
      p.catch(() => undefined)
      return p
    }
    return {prefill: swallow(post(up.endpoints.prefill!, body)), decode: swallow(post(up.endpoints.decode!, body))}
  }
  const truth = (role: 'prefill' | 'decode', rid: string) =>
    readFileSync(join(dir, 'truth', `${role}.jsonl`), 'utf8')
      .split('\n')
      .filter(Boolean)
      .map(l => JSON.parse(l) as Record<string, unknown>)
      .filter(e => e.rid === rid)
  const transferring = (rid: string) =>
    waitFor(
      `${rid} Transferring on prefill`,
      () => truth('prefill', rid).find(e => e.event === 'state' && e.state === 'KVPoll.Transferring'),
      15_000,
    )
  /** Packets and bytes netfilter counted for a rule of ours (matched by its comment). */
  async function counted(tag: string): Promise<{packets: number; bytes: number}> {
    const out = (await ipt('-w', '-nvxL')).stdout
    const line = out.split('\n').find(l => l.includes(`/* ${tag} */`))
    if (!line) throw new Error(`no rule ${tag}`)
    const [packets, bytes] = line.trim().split(/\s+/).map(Number)
    return {packets: packets!, bytes: bytes!}
  }
  // The match that stalls GPU 0's KV: its rail, UDP to RoCEv2's port, as it leaves.
  const STALL_GPU0 = [
    'OUTPUT',
    '-o',
    'rail0',
    '-p',
    'udp',
    '--dport',
    '4791',
    '-m',
    'comment',
    '--comment',
    'stall-rail0',
    '-j',
    'DROP',
  ]

  it(
    "gives each GPU its rail (address, UDP 4791 on it), says so in topo -m, and puts UCX's RC settings in the " +
      "ranks' environment",
    async () => {
      const links = (await ns.run(['ip', '-o', '-4', 'addr', 'show'])).stdout
      for (let g = 0; g < 8; g++) expect(links).toMatch(new RegExp(`\\d+: rail${g}\\s+inet 198\\.18\\.${g}\\.1/24 `))
      const sockets = (await ns.run(['ss', '-ulnH'])).stdout
      for (let g = 0; g < 4; g++) expect(sockets).toContain(`198.18.${g}.1:4791`)
      const topo = (await ns.run([join(dir, 'bin', 'nvidia-smi'), 'topo', '-m'])).stdout.replace(
        /\u001b\[[0-9;]*m/g,
        '',
      )
      const rows = topo.split('\n')
      const header = rows[0]!.split('\t')
      for (let g = 0; g < 8; g++) {
        const cells = rows.find(l => l.startsWith(`GPU${g}\t`))!.split('\t')
        const pix = header.map((h, i) => (cells[i] === 'PIX' ? h : undefined)).filter(Boolean)
        expect(pix).toEqual([`NIC${g}`])
        expect(topo).toContain(`  NIC${g}: rail${g}\n`)
      }
      for (const pid of [...up.rankPids.prefill, ...up.rankPids.decode]) {
        const env = readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0')
        expect(env).toEqual(expect.arrayContaining(['UCX_TLS=rc', 'UCX_RC_TIMEOUT=300ms', 'UCX_RC_RETRY_COUNT=2']))
      }
      const info = (await (await fetch(`${up.endpoints.prefill}/server_info`)).json()) as {
        pdchaos_twin: Record<string, unknown>
      }
      expect(info.pdchaos_twin).toMatchObject({
        kv_data_path: 'rdma-roce-rails',
        ucx_rc: {retry_count: 2, timeout: '300ms'},
      })
      expect((info.pdchaos_twin.rails as unknown[])[0]).toEqual({
        gpu: 0,
        interface: 'rail0',
        address: '198.18.0.1',
        udp_port: 4791,
      })
    },
  )

  it("moves GPU 0's KV as UDP 4791 out of rail0 into its decode peer's rail (GPU 2), acknowledged back", async () => {
    await ipt(
      '-w',
      '-I',
      'OUTPUT',
      '-o',
      'rail0',
      '-p',
      'udp',
      '--dport',
      '4791',
      '-m',
      'comment',
      '--comment',
      'count-out-rail0',
    )
    await ipt(
      '-w',
      '-I',
      'INPUT',
      '-i',
      'rail2',
      '-p',
      'udp',
      '--dport',
      '4791',
      '-m',
      'comment',
      '--comment',
      'count-in-rail2',
    )
    await ipt(
      '-w',
      '-I',
      'INPUT',
      '-i',
      'rail0',
      '-p',
      'udp',
      '--dport',
      '4791',
      '-m',
      'comment',
      '--comment',
      'count-ack-rail0',
    )
    const rid = `rail-move-${++seq}`
    const r = send(rid, 1000)
    expect((await r.prefill).status).toBe(200)
    expect((await r.decode).status).toBe(200)
    // 1000 tokens x 1024 B / 2 ranks = 500 KiB: 125 packets of 4096 B, then the 64 B aux WRITE with its notification.
    const out = await counted('count-out-rail0')
    expect(out.packets).toBeGreaterThanOrEqual(126)
    expect(out.bytes).toBeGreaterThanOrEqual(512_000)
    expect((await counted('count-in-rail2')).packets).toBe(out.packets)
    expect((await counted('count-ack-rail0')).packets).toBeGreaterThanOrEqual(126)
  })

  it(
    'waits out a drop on rail0 shorter than timeout x retries: the retransmission gets through, both ' + 'answer 200',
    async () => {
      await ipt('-w', '-I', ...STALL_GPU0)
      let dropped = true
      try {
        const rid = `rail-short-${++seq}`
        const r = send(rid)
        const t0 = Number((await transferring(rid)).t)
        await new Promise(res => setTimeout(res, 150))
        await ipt('-w', '-D', ...STALL_GPU0)
        dropped = false
        const p = await r.prefill
        expect(p.status).toBe(200)
        expect((await r.decode).status).toBe(200)
        const done = Number(truth('prefill', rid).find(e => e.event === 'completed')!.t)
        expect(done - t0).toBeGreaterThanOrEqual(250) // at least one RC timeout (268 ms) passed before the resend
        expect(done - t0).toBeLessThan(805)
      } finally {
        if (dropped) await ipt('-w', '-D', ...STALL_GPU0)
      }
    },
  )

  it(
    'fails the room once the drop outlasts timeout x (retries + 1): 500 naming a transport error, not the ' +
      'watchdog',
    async () => {
      const before = await metric(up.endpoints.prefill!, 'sglang:num_transfer_failed_reqs_total')
      await ipt('-w', '-I', ...STALL_GPU0)
      const rid = `rail-long-${++seq}`
      try {
        const r = send(rid)
        const t0 = Number((await transferring(rid)).t)
        const p = await r.prefill
        expect(p.status).toBe(500)
        const failed = Number(truth('prefill', rid).find(e => e.event === 'transfer_failed')!.t)
        expect(failed - t0).toBeGreaterThanOrEqual(3 * 268 - 20)
        expect(failed - t0).toBeLessThan(3 * 268 + 1500)
        const message = (JSON.parse(p.body) as {error: {message: string}}).error.message
        expect(message).toMatch(
          new RegExp(
            `^Prefill transfer failed for request rank=0 req\\.rid='${rid}' req\\.bootstrap_room=\\d+ with exception ` +
              `NIXL transfer encountered ERR room=\\d+: transport error \\(UCX Endpoint timeout: Transport retry ` +
              `count exceeded on rail0:1/RoCE`,
          ),
        )
        expect(message).toContain('3 transmissions')
        expect(message).not.toMatch(/watchdog/i)
        const log = readFileSync(join(dir, 'logs', 'prefill.log'), 'utf8')
        expect(log).toContain(`Prefill transfer failed for request rank=0 req.rid='${rid}'`)
        expect(log).toMatch(
          /UCX {2}ERROR Transport retry count exceeded on rail0:1\/RoCE \(synd 0x15 vend 0x81 hw_synd 0\/0\)/,
        )
        expect(await metric(up.endpoints.prefill!, 'sglang:num_transfer_failed_reqs_total')).toBe(before + 1)
      } finally {
        await ipt('-w', '-D', ...STALL_GPU0)
        // Decode heard nothing (NIXL sends no failure notice): it would hold the request until its waiting timeout.
        await fetch(`${up.endpoints.decode}/abort_request`, {method: 'POST', body: JSON.stringify({rid})})
      }
    },
  )

  it(
    'completes one-sided: with the decode rank stopped, its NIC still acknowledges and prefill ' + 'answers 200',
    async () => {
      const fp = (enabled: boolean) =>
        fetch(`${up.endpoints.prefill}/_pdchaos/twin/failpoint`, {
          method: 'POST',
          body: JSON.stringify({name: 'stall-kv', enabled, tpRanks: [0]}),
        })
      await fp(true)
      await fetch(`${up.endpoints.prefill}/health`) // one loop iteration: the failure point is on the rank
      const rid = `rail-onesided-${++seq}`
      const r = send(rid)
      await transferring(rid)
      const decodeRank0 = up.rankPids.decode[0]!
      process.kill(decodeRank0, 'SIGSTOP')
      try {
        await fp(false)
        const p = await r.prefill
        expect(p.status).toBe(200)
        // still stopped when prefill answered
        expect(readFileSync(`/proc/${decodeRank0}/stat`, 'utf8').split(') ')[1]![0]).toBe('T')
      } finally {
        process.kill(decodeRank0, 'SIGCONT')
      }
      expect((await r.decode).status).toBe(200)
    },
  )
})
