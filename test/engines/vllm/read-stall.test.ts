import {describe, expect, it} from 'vitest'

import {
  dataListeners,
  pickRank,
  planReadStall,
  ranksOf,
  processTree,
  type ReadStallContext,
} from '../../../src/engines/vllm/faults/read-stall.js'
import type {VllmDeployment} from '../../../src/engines/vllm/deployment-file.js'
import type {VllmStatusReport} from '../../../src/engines/vllm/discover.js'
import {parsePs, parseSsListeners} from '../../../src/discovery/proc.js'
import type {Host, RunResult} from '../../../src/hosts/host.js'

// P's API server 100, its engine core 101 and a worker 102; D's API server 200; an unrelated process 300.
const PS = [
  '  100     1 Sl vllm serve m --port 8100',
  '  101   100 Sl VLLM::EngineCore',
  '  102   101 Sl VLLM::Worker_TP0',
  '  200     1 Sl vllm serve m --port 8200',
  '  300     1 Sl nginx',
].join('\n')
const SS = [
  'LISTEN 0 511 127.0.0.1:8100 0.0.0.0:* users:(("node",pid=100,fd=20))',
  'LISTEN 0 511 127.0.0.1:5600 0.0.0.0:* users:(("node",pid=100,fd=18))',
  'LISTEN 0 511 127.0.0.1:8300 0.0.0.0:* users:(("node",pid=102,fd=19))',
  'LISTEN 0 511 127.0.0.1:8301 0.0.0.0:* users:(("node",pid=200,fd=19))',
  'LISTEN 0 511 0.0.0.0:80 0.0.0.0:* users:(("nginx",pid=300,fd=6))',
].join('\n')
const ENV_TCP = 'VLLM_NIXL_SIDE_CHANNEL_PORT=5600\0UCX_TLS=tcp\0'

function fakeHost(answers: Record<string, string>): Host & {ran: string[][]} {
  const ran: string[][] = []
  return {
    ran,
    async run(argv): Promise<RunResult> {
      ran.push(argv)
      const out = answers[argv.join(' ')]
      return out === undefined
        ? {code: 127, stdout: '', stderr: `${argv[0]}: not found`, durationMs: 1}
        : {code: 0, stdout: out, stderr: '', durationMs: 1}
    },
    async upload() {},
    async startDetached() {
      return {pid: 1}
    },
    describe: () => 'fake',
    async close() {},
  } as Host & {ran: string[][]}
}

const deployment = {
  engine: 'vllm',
  host: {kind: 'local'},
  sudo: 'never',
  stateDir: '/tmp/x/host-state',
  backend: 'nixl',
  services: {
    prefill: {url: 'http://127.0.0.1:8100', healthPath: '/health', sideChannelPort: 5600},
    decode: {url: 'http://127.0.0.1:8200', healthPath: '/health', sideChannelPort: 5601},
    router: {url: 'http://127.0.0.1:8000', healthPath: '/healthcheck'},
  },
} as unknown as VllmDeployment
const discovery = {
  servers: [{role: 'prefill', pid: 100, problems: []}],
} as unknown as VllmStatusReport

function ctx(env: string, extra: Record<string, string> = {}): ReadStallContext {
  const host = fakeHost({
    'ps -eo pid=,ppid=,stat=,args=': PS,
    'ss -tlnpH': SS,
    'cat /proc/100/environ': env,
    'nft --version': 'nftables v1.0.6',
    'nft -j list tables': '{"nftables": [{"metainfo": {}}]}',
    ...extra,
  })
  return {host, deployment, discovery}
}

describe('read-stall: finding P data path', () => {
  it("P's tree is the API server and every descendant, nobody else", () => {
    expect([...processTree(parsePs(PS), 100)].sort()).toEqual([100, 101, 102])
  })

  it("keeps P's own listeners minus HTTP and side channel; D's and others' are not P's", () => {
    const r = dataListeners({
      tree: processTree(parsePs(PS), 100),
      listeners: parseSsListeners(SS),
      httpPort: 8100,
      sideChannelPorts: [5600],
    })
    if ('refusal' in r) throw new Error(r.refusal)
    expect(r.listeners).toEqual([{address: '127.0.0.1', port: 8300, pids: [102]}])
    expect(r.excluded.join('\n')).toMatch(/8100 \(P's HTTP port\)/)
    expect(r.excluded.join('\n')).toMatch(/5600 \(P's NIXL side channel/)
  })

  it('refuses when nothing but HTTP and the side channel is left, saying what P listens on', () => {
    const r = dataListeners({
      tree: new Set([100]),
      listeners: parseSsListeners(SS),
      httpPort: 8100,
      sideChannelPorts: [5600],
    })
    expect('refusal' in r && r.refusal).toMatch(/no data listener of P found: .* listens on 8100, 5600/)
  })

  it('plans a drop of TCP to the data port under a lease, with the lines a person reads', async () => {
    const c = ctx(ENV_TCP)
    const p = await planReadStall(c, {ttlMs: 60_000, fault: 'stall-kv'})
    if ('refusal' in p) throw new Error(p.refusal)
    expect(p.listeners.map(l => l.port)).toEqual([8300])
    expect(p.sideChannelPorts).toEqual([5600])
    expect(p.filter.tool).toBe('nft')
    expect(p.filter.inject[0]![1]).toContain('tcp dport 8300 counter drop')
    expect(p.filter.inject[0]![1]).not.toContain('5600')
    expect(p.leaseId).toMatch(/^stall-kv-/)
    expect(p.stateDir).toBe('/tmp/x/host-state')
    expect(p.lines.join('\n')).toContain("P's data listener 127.0.0.1:8300 (pid 102)")
    // planning changes nothing: every command it ran is a read
    expect(c.host && (c.host as unknown as {ran: string[][]}).ran.map(a => a[0])).not.toContain('sh')
  })

  it('refuses an RDMA data path (NIXL without UCX_TLS limited to tcp) with one line', async () => {
    const p = await planReadStall(ctx('VLLM_NIXL_SIDE_CHANNEL_PORT=5600\0'), {ttlMs: 60_000})
    expect('refusal' in p && p.refusal).toMatch(/P's KV data path is RDMA \(nixl without UCX_TLS/)
    expect('hint' in p && p.hint).toMatch(/UCX_TLS/)
  })

  it('refuses --gpu with no rank of P on it, naming the ranks present', async () => {
    const p = await planReadStall(ctx(ENV_TCP), {ttlMs: 60_000, gpu: 1})
    expect('refusal' in p && p.refusal).toBe(
      '--gpu 1: P has no TP rank on GPU 1 (1 rank(s): rank 0: VLLM::Worker_TP0 pid 102)',
    )
    expect('hint' in p && p.hint).toMatch(/^pass --gpu 0, or drop --gpu/)
  })

  it("--gpu N at TP 2: drops only the listener of P's Worker_TP<k> on that GPU; the other rank's is left alone", async () => {
    const ps = [PS, '  103   101 Sl VLLM::Worker_TP1'].join('\n')
    const ss = [SS, 'LISTEN 0 511 127.0.0.1:8301 0.0.0.0:* users:(("VLLM::Worker_T",pid=103,fd=19))'].join('\n')
    const answers = {'ps -eo pid=,ppid=,stat=,args=': ps, 'ss -tlnpH': ss}
    const p = await planReadStall(ctx(ENV_TCP, answers), {ttlMs: 60_000, gpu: 1})
    if ('refusal' in p) throw new Error(p.refusal)
    expect(p.listeners.map(l => l.port)).toEqual([8301])
    expect(p.filter.inject[0]![1]).toContain('tcp dport 8301 counter drop')
    expect(p.filter.inject[0]![1]).not.toContain('8300')
    expect(p.lines.join('\n')).toContain("P's rank 1 on the GPU: VLLM::Worker_TP1 pid 103 (GPU 1 = local rank 1")
    expect(p.excluded.join('\n')).toContain("127.0.0.1:8300 (another rank's data listener, pid 102)")
    // CUDA_VISIBLE_DEVICES=4,5: GPU 5 is rank 1, GPU 0 none of P's.
    const cvd = `${ENV_TCP}CUDA_VISIBLE_DEVICES=4,5\0`
    const five = await planReadStall(ctx(cvd, answers), {ttlMs: 60_000, gpu: 5})
    if ('refusal' in five) throw new Error(five.refusal)
    expect(five.listeners.map(l => l.port)).toEqual([8301])
    const zero = await planReadStall(ctx(cvd, answers), {ttlMs: 60_000, gpu: 0})
    expect('refusal' in zero && zero.refusal).toMatch(
      /^--gpu 0: P has no TP rank on GPU 0 \(2 rank\(s\): rank 0 \(GPU 4\)/,
    )
    expect('hint' in zero && zero.hint).toMatch(/^pass --gpu 4 or 5/)
    // Without --gpu: every rank's listener.
    const all = await planReadStall(ctx(ENV_TCP, answers), {ttlMs: 60_000})
    if ('refusal' in all) throw new Error(all.refusal)
    expect(all.listeners.map(l => l.port)).toEqual([8300, 8301])
  })

  it('TP 1: the engine core is rank 0 (the worker runs in it)', () => {
    const rows = parsePs(['  100     1 Sl vllm serve m', '  101   100 Sl VLLM::EngineCore'].join('\n'))
    const ranks = ranksOf(rows, new Set([100, 101]))
    expect([...ranks.entries()]).toEqual([[0, {pid: 101, title: 'VLLM::EngineCore'}]])
    expect(pickRank(0, ranks, undefined)).toMatchObject({rank: 0, pid: 101})
    expect(pickRank(2, ranks, undefined)).toMatchObject({refusal: expect.stringMatching(/no TP rank on GPU 2/)})
  })

  it('refuses when ss cannot list sockets', async () => {
    const c = ctx(ENV_TCP, {})
    ;(c.host as unknown as {run: Host['run']}).run = async argv =>
      argv[0] === 'ss'
        ? {code: 1, stdout: '', stderr: 'Operation not permitted', durationMs: 1}
        : {code: 0, stdout: argv[0] === 'ps' ? PS : ENV_TCP, stderr: '', durationMs: 1}
    const p = await planReadStall(c, {ttlMs: 60_000})
    expect('refusal' in p && p.refusal).toMatch(/cannot list listening sockets \(ss -tlnpH: exit 1, Operation/)
  })
})
