import {spawnSync} from 'node:child_process'
import {describe, expect, it} from 'vitest'

import type {RankInfo} from '../../src/engines/sglang/discovery/discover.js'
import {abortMidTransfer, sweepOffsets, trialRid} from '../../src/faults/abort-mid-transfer.js'
import {classifyDataPath, dataConnectionsOf, parseSsConnections} from '../../src/faults/mechanisms/data-path.js'
import {dropDestInfo} from '../../src/faults/drop-dest-info.js'
import {
  type Connection,
  type FaultDiscovery,
  type FaultPlan,
  type HostFacts,
  renderArgv,
  renderPlan,
} from '../../src/faults/fault.js'
import {
  iptablesChainName,
  judgeIptablesClean,
  judgeIptablesInjected,
  judgeNftClean,
  judgeNftInjected,
  nftTableName,
} from '../../src/faults/mechanisms/packet-filter.js'
import {FAULT_NAMES, getFault} from '../../src/faults/registry.js'
import {RDMA_REFUSAL, stallKv} from '../../src/faults/stall-kv.js'
import {wedgeRank} from '../../src/faults/wedge-rank.js'
import {parseFaultParams} from '../../src/faults/params.js'
import {PdError} from '../../src/errors.js'

/** Pure plan tests: synthetic discovery in, exact commands and refusals out. No host is touched. */

function rank(service: 'prefill' | 'decode', tp: number, extra: Partial<RankInfo> = {}): RankInfo {
  const base = service === 'prefill' ? 1000 : 2000
  return {
    service,
    tpRank: tp,
    pid: base + tp,
    startTicks: 50_000 + base + tp,
    state: 'S',
    title: `sglang::scheduler_TP${tp}`,
    gpu: service === 'prefill' ? tp : 4 + tp,
    ...(service === 'prefill' ? {zmqPort: 41_000 + tp, zmqHost: '127.0.0.1'} : {}),
    ...extra,
  }
}

const TWIN_RANKS = [0, 1, 2, 3].flatMap(k => [rank('prefill', k), rank('decode', k)])
const SERVICE_PORTS = [30_000, 30_001, 8000, 8998]
const tcpDiscovery = (ranks = TWIN_RANKS): FaultDiscovery => ({
  ranks,
  transport: {backend: 'nixl', source: 'test', env: {UCX_TLS: 'tcp'}},
  servicePorts: SERVICE_PORTS,
})
const rdmaDiscovery = (ranks = TWIN_RANKS): FaultDiscovery => ({
  ranks,
  transport: {backend: 'nixl', source: 'test'},
  servicePorts: SERVICE_PORTS,
})

/**
 * ss -tnpH as root prints it on the twin: prefill TP k -> decode TP k data port 45000+k, decode -> prefill ZMQ, HTTP.
 */
function twinSs(): string {
  const lines: string[] = []
  const row = (l: string, p: string, pid: number) =>
    `ESTAB 0      0          ${l}   ${p}  users:(("node",pid=${pid},fd=2${pid % 10}))`
  for (let k = 0; k < 4; k++) {
    lines.push(
      row(`127.0.0.1:5100${k}`, `127.0.0.1:4500${k}`, 1000 + k),
      row(`127.0.0.1:4500${k}`, `127.0.0.1:5100${k}`, 2000 + k),
    )
    // decode PUSH -> prefill ZMQ PULL (control plane, must never be cut by stall-kv)
    lines.push(
      row(`127.0.0.1:5200${k}`, `127.0.0.1:4100${k}`, 2000 + k),
      row(`127.0.0.1:4100${k}`, `127.0.0.1:5200${k}`, 1000 + k),
    )
  }
  // prefill TP0 talking to the bootstrap server (service port) — not KV
  lines.push(row('127.0.0.1:53000', '127.0.0.1:8998', 1000), row('127.0.0.1:8998', '127.0.0.1:53000', 999))
  return lines.join('\n') + '\n'
}

const calibration = (prefillMs: number) => ({prefillMs, prefillSpreadMs: 2, observeMs: 1, samples: 8})
const facts = (tool: 'nft' | 'iptables' = 'nft'): HostFacts => ({
  filterTool: tool,
  filterEvidence: 'test',
  connections: parseSsConnections(twinSs()),
})

function expectBadInput(fn: () => unknown, pattern: RegExp): void {
  try {
    fn()
  } catch (error) {
    expect(error).toBeInstanceOf(PdError)
    expect((error as PdError).exitCode).toBe(2)
    expect((error as PdError).message).toMatch(pattern)
    return
  }
  throw new Error(`expected a bad-input error matching ${pattern}`)
}

/** What a real sh makes of a rendered command line: the argv must arrive byte for byte. */
function shellRoundTrip(argv: string[]): string[] {
  const r = spawnSync('sh', ['-c', `printf '%s\\0' ${renderArgv(argv)}`], {encoding: 'utf8'})
  expect(r.status).toBe(0)
  return r.stdout.split('\0').slice(0, -1)
}

function expectRenderable(plan: FaultPlan): void {
  const all = [
    ...plan.inject,
    ...plan.revert,
    ...plan.readOnlyProbes,
    ...plan.verifyInjected.map(p => p.argv),
    ...plan.verifyClean.map(p => p.argv),
  ]
  for (const argv of all) expect(shellRoundTrip(argv)).toEqual(argv)
  const r = renderPlan(plan)
  expect(r.inject).toEqual(plan.inject.map(renderArgv))
}

describe('registry', () => {
  it('knows the four faults and refuses others with exit 2', () => {
    expect(FAULT_NAMES).toEqual([
      'drop-dest-info',
      'stall-kv',
      'abort-mid-transfer',
      'wedge-rank',
      'trip-breaker',
      'kill-prefill',
    ])
    expect(getFault('stall-kv').name).toBe('stall-kv')
    expectBadInput(() => getFault('drop-everything'), /unknown fault "drop-everything"/)
  })
})

describe('drop-dest-info plan', () => {
  it("drops each prefill rank's ZMQ port in its own nft table; revert deletes only that table", () => {
    const plan = dropDestInfo.plan({discovery: tcpDiscovery(), params: {}, leaseId: 'abc123', facts: facts()})
    expect(plan.mechanism).toBe('packet-filter')
    expect(plan.targets.map(t => [t.tpRank, t.pid, t.startTicks, t.ports])).toEqual(
      [0, 1, 2, 3].map(k => [k, 1000 + k, 51_000 + k, [41_000 + k]]),
    )
    expect(plan.inject).toHaveLength(1)
    const [nft, script] = plan.inject[0]!
    expect(nft).toBe('nft')
    expect(script).toContain('add table inet pdchaos_abc123')
    expect(script).toMatch(/hook input priority -10/)
    expect(script).toMatch(/hook output priority -10/)
    for (let k = 0; k < 4; k++) {
      expect(script).toContain(
        `add rule inet pdchaos_abc123 input tcp dport ${41_000 + k} counter drop comment "to-${41_000 + k}"`,
      )
      expect(script).toContain(
        `add rule inet pdchaos_abc123 output tcp dport ${41_000 + k} counter drop comment "to-${41_000 + k}"`,
      )
    }
    expect(plan.revert).toEqual([
      ['nft', 'add', 'table', 'inet', 'pdchaos_abc123', ';', 'delete', 'table', 'inet', 'pdchaos_abc123'],
    ])
    expect(plan.readOnlyProbes).toContainEqual(['nft', '--version'])
    expect(plan.description).toContain('Bootstrapping')
    expectRenderable(plan)
  })

  it('--rank narrows to one rank', () => {
    const plan = dropDestInfo.plan({
      discovery: tcpDiscovery(),
      params: parseFaultParams(dropDestInfo, {rank: '2'}),
      leaseId: 'r2',
      facts: facts(),
    })
    expect(plan.targets.map(t => t.tpRank)).toEqual([2])
    expect(plan.inject[0]![1]).toContain('dport 41002')
    expect(plan.inject[0]![1]).not.toContain('dport 41001')
  })

  it('the iptables fallback: own chain jumped from INPUT and OUTPUT, removed by a constant script', () => {
    const plan = dropDestInfo.plan({discovery: tcpDiscovery(), params: {}, leaseId: 'ipt1', facts: facts('iptables')})
    const chain = iptablesChainName('ipt1')
    expect(plan.inject[0]).toEqual(['iptables', '-w', '5', '-N', chain])
    expect(plan.inject).toContainEqual([
      'iptables',
      '-w',
      '5',
      '-A',
      chain,
      '-p',
      'tcp',
      '--dport',
      '41003',
      '-m',
      'comment',
      '--comment',
      'to-41003',
      '-j',
      'DROP',
    ])
    // The jumps come last, after the chain is complete.
    expect(plan.inject.slice(-2)).toEqual([
      ['iptables', '-w', '5', '-I', 'INPUT', '1', '-j', chain],
      ['iptables', '-w', '5', '-I', 'OUTPUT', '1', '-j', chain],
    ])
    expect(plan.revert).toHaveLength(1)
    expect(plan.revert[0]!.slice(0, 2)).toEqual(['sh', '-c'])
    expect(plan.revert[0]!.at(-1)).toBe(chain)
    expectRenderable(plan)
  })

  it('refuses empty, partial and ambiguous target sets with the reason (exit 2)', () => {
    const base = {params: {}, leaseId: 'x1', facts: facts()}
    expectBadInput(
      () => dropDestInfo.plan({...base, discovery: tcpDiscovery(TWIN_RANKS.filter(r => r.service === 'decode'))}),
      /no prefill rank processes/,
    )
    const noPort = TWIN_RANKS.map(r => (r.service === 'prefill' && r.tpRank === 1 ? {...r, zmqPort: undefined} : r))
    expectBadInput(() => dropDestInfo.plan({...base, discovery: tcpDiscovery(noPort)}), /no ZMQ port for prefill TP1/)
    expectBadInput(
      () => dropDestInfo.plan({...base, params: {rank: 7}, discovery: tcpDiscovery()}),
      /no prefill rank TP7/,
    )
    const dup = [...TWIN_RANKS, rank('prefill', 2, {pid: 1102})]
    expectBadInput(() => dropDestInfo.plan({...base, params: {rank: 2}, discovery: tcpDiscovery(dup)}), /ambiguous/)
    expectBadInput(
      () => dropDestInfo.plan({...base, facts: {filterEvidence: 'nft: not usable'}, discovery: tcpDiscovery()}),
      /no usable packet filter.*nft: not usable/,
    )
    expectBadInput(() => parseFaultParams(dropDestInfo, {rank: 'one'}), /--rank must be an integer/)
    expectBadInput(() => dropDestInfo.plan({...base, leaseId: 'a b', discovery: tcpDiscovery()}), /invalid lease id/)
  })
})

describe('stall-kv plan', () => {
  it("TCP data path: drops both directions of the rank's KV connections only (not ZMQ, not bootstrap)", () => {
    const params = parseFaultParams(stallKv, {gpu: 0})
    const plan = stallKv.plan({discovery: tcpDiscovery(), params, leaseId: 'st0', facts: facts()})
    expect(plan.mechanism).toBe('packet-filter')
    expect(plan.targets).toEqual([
      {
        service: 'prefill',
        tpRank: 0,
        pid: 1000,
        startTicks: 51_000,
        gpu: 0,
        connections: [{local: {addr: '127.0.0.1', port: 51_000}, peer: {addr: '127.0.0.1', port: 45_000}}],
      },
    ])
    const script = plan.inject[0]![1]!
    expect(script).toContain('ip saddr 127.0.0.1 tcp sport 51000 ip daddr 127.0.0.1 tcp dport 45000 counter drop')
    expect(script).toContain('ip saddr 127.0.0.1 tcp sport 45000 ip daddr 127.0.0.1 tcp dport 51000 counter drop')
    expect(script).not.toContain('41000')
    expect(script).not.toContain('8998')
    expect(plan.description).toContain('decode TP0')
    expect(plan.notes?.[0]).toContain('UCX_TLS=tcp')
    expectRenderable(plan)
  })

  it('a decode GPU: its incoming KV connection from the paired prefill rank', () => {
    const plan = stallKv.plan({
      discovery: tcpDiscovery(),
      params: parseFaultParams(stallKv, {gpu: 6}),
      leaseId: 'st6',
      facts: facts(),
    })
    expect(plan.targets[0]).toMatchObject({
      service: 'decode',
      tpRank: 2,
      connections: [{local: {port: 45_002}, peer: {port: 51_002}}],
    })
  })

  it(
    'refuses a packet filter on RDMA with the reason, never falls back to SIGSTOP, and refuses --mechanism ' +
      'sigstop pointing at wedge-rank',
    async () => {
      expectBadInput(
        () =>
          stallKv.plan({
            discovery: rdmaDiscovery(),
            params: parseFaultParams(stallKv, {gpu: 1, mechanism: 'packet-filter'}),
            leaseId: 'r1',
            facts: facts(),
          }),
        /a packet filter cannot stall hardware RDMA/,
      )
      const mooncake: FaultDiscovery = {...rdmaDiscovery(), transport: {backend: 'mooncake', source: 'test'}}
      expectBadInput(
        () =>
          stallKv.plan({
            discovery: mooncake,
            params: parseFaultParams(stallKv, {gpu: 1, mechanism: 'packet-filter'}),
            leaseId: 'r1',
            facts: facts(),
          }),
        /RDMA/,
      )
      // auto on RDMA with no NIC known: no mechanism (exit 2), and what would make one possible.
      try {
        stallKv.plan({
          discovery: rdmaDiscovery(),
          params: parseFaultParams(stallKv, {gpu: 1}),
          leaseId: 'r1',
          facts: {nics: []},
        })
        throw new Error('expected a refusal')
      } catch (error) {
        expect((error as PdError).exitCode).toBe(2)
        expect((error as PdError).message).toMatch(
          /no way to stall GPU 1's KV transfer here: the data path is not kernel TCP .* the GPU's NIC is unknown/,
        )
        expect((error as PdError).suggestion).toMatch(/UCX_TLS=tcp.*nvidia-smi topo -m/)
      }
      expect(RDMA_REFUSAL).toMatch(/netfilter never sees/)
      // --mechanism sigstop is accepted as a param (suite files keep parsing) and refused when planned or gathered.
      const sig = parseFaultParams(stallKv, {gpu: 1, mechanism: 'sigstop'})
      for (const attempt of [
        () => stallKv.plan({discovery: rdmaDiscovery(), params: sig, leaseId: 'r1', facts: facts()}),
        () => stallKv.plan({discovery: tcpDiscovery(), params: sig, leaseId: 'r1', facts: facts()}),
      ]) {
        try {
          attempt()
          throw new Error('expected a refusal')
        } catch (error) {
          expect((error as PdError).exitCode).toBe(2)
          expect((error as PdError).message).toMatch(
            /stall-kv refuses --mechanism sigstop: .*wedges its whole instance/,
          )
          expect((error as PdError).suggestion).toMatch(/pdchaos inject wedge-rank --gpu N/)
        }
      }
      await expect(stallKv.gather(undefined as never, rdmaDiscovery(), sig)).rejects.toThrow(
        /refuses --mechanism sigstop/,
      )
      expect(stallKv.footprint(sig, {}).exclusive).toMatch(/SIGSTOP wedges/)
    },
  )

  it(
    "wedge-rank: SIGSTOP of the GPU's own rank by default, or its peer with --side (observed, then by equal TP); " +
      'a wedged instance, no pins',
    () => {
      const own = wedgeRank.plan({
        discovery: rdmaDiscovery(),
        params: parseFaultParams(wedgeRank, {gpu: 1}),
        leaseId: 'w1',
        facts: {},
      })
      expect(own.mechanism).toBe('sigstop')
      expect(own.targets).toEqual([{service: 'prefill', tpRank: 1, pid: 1001, startTicks: 51_001, gpu: 1}])
      expect(own.inject).toEqual([
        ['sh', '-c', expect.stringContaining('kill -s'), 'pdchaos-signal', '1001', '51001', 'STOP'],
      ])
      expect(own.revert).toEqual([
        ['sh', '-c', expect.stringContaining('kill -s'), 'pdchaos-signal', '1001', '51001', 'CONT'],
      ])
      expect(own.verifyInjected[0]!.argv).toEqual(['cat', '/proc/1001/stat'])
      expect(own.description).toMatch(
        /a wedged instance cannot run its watchdog: this experiment judges detection and recovery only/,
      )
      expectRenderable(own)
      expect(wedgeRank.observe).toBe('health')
      expect(wedgeRank.pins).toBeUndefined()
      expect(wedgeRank.footprint({gpu: 1}, {}).exclusive).toMatch(/SIGSTOP wedges/)
      const observed = wedgeRank.plan({
        discovery: rdmaDiscovery(),
        params: parseFaultParams(wedgeRank, {gpu: 3, side: 'decode'}),
        leaseId: 'd3',
        facts: facts(),
      })
      expect(observed.targets).toMatchObject([{service: 'decode', tpRank: 3, pid: 2003}])
      expect(observed.notes?.join(' ')).toContain('observed KV connections')
      const byTp = wedgeRank.plan({
        discovery: rdmaDiscovery(),
        params: parseFaultParams(wedgeRank, {gpu: 3, side: 'decode'}),
        leaseId: 'd3',
        facts: {connections: []},
      })
      expect(byTp.targets).toMatchObject([{service: 'decode', tpRank: 3, pid: 2003}])
      expect(byTp.notes?.join(' ')).toContain('equal TP sizes')
      // Prefill TP 4, decode TP 2 and no observed connection: no safe pairing.
      const uneven = [0, 1, 2, 3].map(k => rank('prefill', k)).concat([0, 1].map(k => rank('decode', k)))
      expectBadInput(
        () =>
          wedgeRank.plan({
            discovery: rdmaDiscovery(uneven),
            params: parseFaultParams(wedgeRank, {gpu: 3, side: 'decode'}),
            leaseId: 'd3',
            facts: {connections: []},
          }),
        /cannot tell which decode rank/,
      )
      const noStart = TWIN_RANKS.map(r => (r.gpu === 1 ? {...r, startTicks: undefined} : r))
      expectBadInput(
        () =>
          wedgeRank.plan({
            discovery: rdmaDiscovery(noStart),
            params: parseFaultParams(wedgeRank, {gpu: 1}),
            leaseId: 'e1',
            facts: {},
          }),
        /no start time.*recycled/,
      )
      expectBadInput(() => parseFaultParams(wedgeRank, {}), /wedge-rank needs --gpu/)
      expectBadInput(
        () => parseFaultParams(wedgeRank, {gpu: 1, mechanism: 'sigstop'}),
        /wedge-rank takes no --mechanism/,
      )
    },
  )

  it('hard errors: no rank on the GPU, two ranks on it, no data connection, params', () => {
    const p = (raw: Record<string, unknown>) => parseFaultParams(stallKv, raw)
    expectBadInput(
      () => stallKv.plan({discovery: tcpDiscovery(), params: p({gpu: 9}), leaseId: 'e1', facts: facts()}),
      /no rank holds GPU 9 \(ranks seen: GPU 0: prefill TP0/,
    )
    expectBadInput(
      () =>
        stallKv.plan({
          discovery: tcpDiscovery([...TWIN_RANKS, rank('decode', 9, {gpu: 2})]),
          params: p({gpu: 2}),
          leaseId: 'e1',
          facts: facts(),
        }),
      /GPU 2 is held by 2 ranks.*ambiguous/,
    )
    expectBadInput(
      () =>
        stallKv.plan({
          discovery: tcpDiscovery(),
          params: p({gpu: 1}),
          leaseId: 'e1',
          facts: {...facts(), connections: []},
        }),
      /no open KV data connection of prefill TP1.*/,
    )
    expectBadInput(
      () =>
        stallKv.plan({
          discovery: tcpDiscovery(),
          params: p({gpu: 1, mechanism: 'tc-flower'}),
          leaseId: 'e1',
          facts: facts(),
        }),
      /--mechanism tc-flower is for a hardware RDMA NIC, and GPU 1's KV is kernel TCP/,
    )
    expectBadInput(() => p({}), /needs --gpu/)
    expectBadInput(
      () => p({gpu: 0, mechanism: 'tc'}),
      /stall-kv: --mechanism must be one of auto, packet-filter, tc-flower, link-down, twin-failpoint, sigstop \(got "tc"\)/,
    )
    expectBadInput(() => p({gpu: 0, side: 'router'}), /stall-kv: --side must be one of prefill, decode/)
    expectBadInput(() => p({gpu: 0, rank: 1}), /stall-kv takes no --rank/)
    expectBadInput(() => p({gpu: 0, side: 'decode'}), /stall-kv takes no --side any more: .*wedge-rank/)
    expectBadInput(
      () => p({gpu: 0, mechanism: 'link-down'}),
      /--mechanism link-down needs --allow-link-down: taking the NIC down drops every flow on it/,
    )
    expectBadInput(
      () => p({gpu: 0, mechanism: 'packet-filter', allowLinkDown: true}),
      /applies --allow-link-down to --mechanism auto or link-down only/,
    )
    expect(p({gpu: 0, allowLinkDown: 'true'})).toMatchObject({allowLinkDown: true})
  })
})

describe('abort-mid-transfer plan', () => {
  it(
    'N trials with own rids, offsets swept around the calibrated prefill time, aborts on prefill and decode; no ' +
      'host change off TCP',
    () => {
      const params = parseFaultParams(abortMidTransfer, {trials: 5})
      const plan = abortMidTransfer.plan({
        discovery: rdmaDiscovery(),
        params,
        leaseId: 'ab1',
        facts: {},
        calibration: calibration(50),
      })
      expect(plan.inject).toEqual([])
      expect(plan.revert).toEqual([])
      // Not widened: from 0.6 × the prefill time to the prefill time.
      expect(plan.trials!.map(t => t.offsetMs)).toEqual([30, 35, 40, 45, 50])
      expect(plan.trials![0]!.aborts).toEqual([
        {service: 'prefill', method: 'POST', path: '/abort_request', body: {rid: 'pdchaos-abort:ab1:000'}},
        {service: 'decode', method: 'POST', path: '/abort_request', body: {rid: 'pdchaos-abort:ab1:000'}},
      ])
      expect(plan.description).toMatch(/^5 trial\(s\), aborts on prefill and decode at /)
    },
  )

  it(
    "--side prefill or decode: each trial's abort goes to that side alone, and the plan says so; another side is " +
      'bad input',
    () => {
      for (const side of ['prefill', 'decode'] as const) {
        const plan = abortMidTransfer.plan({
          discovery: rdmaDiscovery(),
          params: parseFaultParams(abortMidTransfer, {trials: 2, side}),
          leaseId: 'ab1',
          facts: {},
          calibration: calibration(50),
        })
        expect(plan.trials!.every(t => t.aborts.length === 1 && t.aborts[0]!.service === side)).toBe(true)
        expect(plan.description).toMatch(new RegExp(`^2 trial\\(s\\), aborts on ${side} alone at `))
      }
      expect(() => parseFaultParams(abortMidTransfer, {side: 'router'})).toThrow(/side/)
    },
  )

  it('on a TCP data path the window is held open on the first prefill GPU by default, and the sweep covers it', () => {
    const params = parseFaultParams(abortMidTransfer, {trials: 3})
    const plan = abortMidTransfer.plan({
      discovery: tcpDiscovery(),
      params,
      leaseId: 'h1',
      facts: facts(),
      calibration: calibration(20),
      contract: {scope: 'all', deadlineSeconds: 2, pollSeconds: 0.5},
    })
    expect(plan.targets[0]).toMatchObject({service: 'prefill', gpu: 0})
    expect(plan.inject[0]![1]).toContain('counter drop')
    // Held: from the prefill time plus its spread (every request past its forward) for 0.4 × the deadline (at most 1
    // s).
    expect(plan.trials!.map(t => t.offsetMs)).toEqual([22, 422, 822])
    expect(plan.transferWindow).toEqual({
      startMs: 22,
      endMs: 822,
      why: 'held open by the widening',
      widening: 'packet-filter',
    })
  })

  it('no rid is a prefix of another (SGLang aborts by prefix), across trials and leases', () => {
    const rids = [
      ...Array.from({length: 200}, (_, i) => trialRid('a', i)),
      ...Array.from({length: 20}, (_, i) => trialRid('a-001', i)),
    ]
    expect(new Set(rids).size).toBe(rids.length)
    const clashes = rids.flatMap(a => rids.filter(b => a !== b && b.startsWith(a)).map(b => `${a} < ${b}`))
    expect(clashes).toEqual([])
    expect(sweepOffsets(1, 10, 30)).toEqual([20])
  })

  it("widening rate-limits the rank's KV connections with nft on TCP, and is refused on RDMA or without nft", () => {
    const params = parseFaultParams(abortMidTransfer, {trials: 3, gpu: 0, widenKBytesPerSecond: 256})
    const plan = abortMidTransfer.plan({discovery: tcpDiscovery(), params, leaseId: 'w1', facts: facts()})
    expect(plan.inject[0]![1]).toContain(
      'tcp sport 51000 ip daddr 127.0.0.1 tcp dport 45000 limit rate over 256 kbytes/second burst 64 kbytes ' +
        'counter drop',
    )
    expect(plan.revert[0]).toContain(nftTableName('w1'))
    expectRenderable(plan)
    expectBadInput(
      () => abortMidTransfer.plan({discovery: rdmaDiscovery(), params, leaseId: 'w1', facts: facts()}),
      /cannot widen.*RDMA/,
    )
    expectBadInput(
      () => abortMidTransfer.plan({discovery: tcpDiscovery(), params, leaseId: 'w1', facts: facts('iptables')}),
      /rate limiting needs nftables/,
    )
    // No KV connection of the rank: the refusal says what ss showed of its pid.
    expectBadInput(
      () =>
        abortMidTransfer.plan({discovery: tcpDiscovery(), params, leaseId: 'w1', facts: {...facts(), connections: []}}),
      /no open KV data connection of prefill TP0 .*\(ss showed no TCP connection of that pid\)/,
    )
    expectBadInput(
      () => parseFaultParams(abortMidTransfer, {windowStartMs: 1}),
      /abort-mid-transfer takes no --window-start-ms/,
    )
    expectBadInput(() => parseFaultParams(abortMidTransfer, {trials: 500}), /--trials must be an integer from 1 to 200/)
    expectBadInput(() => parseFaultParams(abortMidTransfer, {widenKBytesPerSecond: 10}), /needs --gpu/)
    expectBadInput(
      () => parseFaultParams(abortMidTransfer, {trials: 2, rank: 1}, 'file'),
      /abort-mid-transfer takes no params\.rank/,
    )
  })
})

describe('data path and ss parsing', () => {
  it('classifies TCP only on positive evidence', () => {
    expect(classifyDataPath({backend: 'nixl', env: {UCX_TLS: 'tcp'}}).kind).toBe('tcp')
    expect(classifyDataPath({backend: 'nixl', env: {UCX_TLS: 'tcp,self,cuda_copy'}}).kind).toBe('tcp')
    expect(classifyDataPath({backend: 'nixl', env: {UCX_TLS: 'rc,tcp'}}).kind).toBe('rdma')
    expect(classifyDataPath({backend: 'nixl', env: {UCX_TLS: '^ib'}}).kind).toBe('rdma')
    expect(classifyDataPath({backend: 'nixl', env: {UCX_TLS: 'cuda_ipc,tcp'}}).kind).toBe('rdma')
    expect(classifyDataPath({backend: 'nixl'}).kind).toBe('rdma')
    expect(classifyDataPath({backend: 'mooncake', env: {MC_FORCE_TCP: 'true'}}).kind).toBe('tcp')
    expect(classifyDataPath({backend: 'mooncake'}).kind).toBe('rdma')
    expect(classifyDataPath({backend: 'auto'}).kind).toBe('unknown')
    expect(classifyDataPath({backend: 'nixl', dataPath: 'tcp'}).kind).toBe('tcp')
  })

  it('parses ss -tnpH lines, IPv6 and v4-mapped addresses included', () => {
    const text = [
      'ESTAB 0      0      127.0.0.1:51000  127.0.0.1:45000 users:(("node",pid=1000,fd=21),("node",pid=1001,fd=3))',
      'ESTAB 0      0      [::ffff:127.0.0.1]:45000 [::ffff:127.0.0.1]:51000 users:(("node",pid=2000,fd=20))',
      'ESTAB 0      0      [fe80::1%eth0]:22 [fe80::2%eth0]:5555',
      'garbage line',
    ].join('\n')
    const conns: Connection[] = parseSsConnections(text)
    expect(conns).toEqual([
      {
        state: 'ESTAB',
        local: {addr: '127.0.0.1', port: 51_000},
        peer: {addr: '127.0.0.1', port: 45_000},
        pids: [1000, 1001],
      },
      {state: 'ESTAB', local: {addr: '127.0.0.1', port: 45_000}, peer: {addr: '127.0.0.1', port: 51_000}, pids: [2000]},
      {state: 'ESTAB', local: {addr: 'fe80::1', port: 22}, peer: {addr: 'fe80::2', port: 5555}, pids: []},
    ])
  })

  it('a connection whose local peer is not a rank of the other role is not KV', () => {
    const conns = parseSsConnections(
      [
        'ESTAB 0 0 127.0.0.1:51000 127.0.0.1:45000 users:(("node",pid=1000,fd=21))',
        'ESTAB 0 0 127.0.0.1:45000 127.0.0.1:51000 users:(("python",pid=777,fd=3))',
      ].join('\n'),
    )
    expect(dataConnectionsOf(TWIN_RANKS[0]!, tcpDiscovery(), conns)).toEqual([])
  })
})

describe('probe judges', () => {
  const listing = (comments: string[], packets = 3) =>
    JSON.stringify({
      nftables: [
        {metainfo: {version: '1.0.6'}},
        {table: {family: 'inet', name: 'pdchaos_j1'}},
        {chain: {family: 'inet', table: 'pdchaos_j1', name: 'input', hook: 'input'}},
        {chain: {family: 'inet', table: 'pdchaos_j1', name: 'output', hook: 'output'}},
        ...comments.flatMap(c =>
          ['input', 'output'].map(chain => ({
            rule: {
              family: 'inet',
              table: 'pdchaos_j1',
              chain,
              comment: c,
              expr: [{counter: {packets, bytes: 100}}, {drop: null}],
            },
          })),
        ),
      ],
    })

  it('nft: injected only when every expected rule is on both hooks; exit 0 alone proves nothing', () => {
    expect(judgeNftInjected('pdchaos_j1', ['to-1', 'to-2'], listing(['to-1', 'to-2']), 0)).toMatchObject({
      ok: true,
      evidence: expect.stringContaining('12 packet(s)'),
    })
    expect(judgeNftInjected('pdchaos_j1', ['to-1', 'to-2'], listing(['to-1']), 0)).toMatchObject({
      ok: false,
      evidence: expect.stringContaining('input:to-2'),
    })
    expect(judgeNftInjected('pdchaos_j1', ['to-1'], '', 0).ok).toBe(false)
    expect(judgeNftInjected('pdchaos_j1', ['to-1'], listing(['to-1']), 1).ok).toBe(false)
    expect(judgeNftClean('pdchaos_j1', listing([]), 0).ok).toBe(false)
    expect(
      judgeNftClean(
        'pdchaos_j1',
        JSON.stringify({nftables: [{metainfo: {}}, {table: {family: 'inet', name: 'other'}}]}),
        0,
      ).ok,
    ).toBe(true)
    expect(judgeNftClean('pdchaos_j1', '', 127)).toMatchObject({
      ok: false,
      evidence: expect.stringContaining('unverified'),
    })
  })

  it('iptables: chain, both jumps and each rule; clean when none of it is left', () => {
    const save = [
      '*filter',
      ':INPUT ACCEPT [0:0]',
      ':OUTPUT ACCEPT [0:0]',
      ':PDCHAOS-j1 - [0:0]',
      '[5:300] -A INPUT -j PDCHAOS-j1',
      '[0:0] -A OUTPUT -j PDCHAOS-j1',
      '[4:240] -A PDCHAOS-j1 -p tcp -m tcp --dport 5 -m comment --comment to-5 -j DROP',
      'COMMIT',
    ].join('\n')
    expect(judgeIptablesInjected('PDCHAOS-j1', ['to-5'], save, 0)).toMatchObject({
      ok: true,
      evidence: expect.stringContaining('4 packet(s)'),
    })
    expect(
      judgeIptablesInjected('PDCHAOS-j1', ['to-5'], save.replace('[0:0] -A OUTPUT -j PDCHAOS-j1', ''), 0),
    ).toMatchObject({ok: false, evidence: expect.stringContaining('jump from OUTPUT')})
    expect(judgeIptablesClean('PDCHAOS-j1', save, 0).ok).toBe(false)
    expect(
      judgeIptablesClean('PDCHAOS-j1', '*filter\n:INPUT ACCEPT [0:0]\n-A INPUT -j PDCHAOS-j10\nCOMMIT\n', 0).ok,
    ).toBe(true)
  })
})
