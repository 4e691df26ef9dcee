import {spawnSync} from 'node:child_process'
import {describe, expect, it} from 'vitest'

import type {RankInfo} from '../../src/engines/sglang/discovery/discover.js'
import {parseNvidiaTopo} from '../../src/discovery/topo.js'
import {PdError} from '../../src/errors.js'
import {type FaultDiscovery, type FaultPlan, type HostFacts, type NicFacts, renderArgv} from '../../src/faults/fault.js'
import {
  COUNTERS_SCRIPT,
  counterFiles,
  gatherNics,
  IB_PORT_STATE_SCRIPT,
  judgeCountersStill,
  judgeIbPortDisabled,
  judgeIbPortEnabled,
  judgeLinkDown,
  judgeLinkUp,
  judgeRoutesBack,
  NIC_SCRIPT,
  parseRoutes,
  ROUTES_SCRIPT,
  routeReplaceArgv,
  TC_CAPS_SCRIPT,
} from '../../src/faults/mechanisms/nic.js'
import {IPTABLES_REVERT_SCRIPT, judgeNftInjected, nftTableName} from '../../src/faults/mechanisms/packet-filter.js'
import {
  CLSACT_ADD_SCRIPT,
  judgeTcClean,
  judgeTcInjected,
  TC_LIST_SCRIPT,
  TC_REVERT_SCRIPT,
  tcCookie,
  tcPrefs,
} from '../../src/faults/mechanisms/tc-flower.js'
import {parseFaultParams} from '../../src/faults/params.js'
import {stallExpectation, stallKv} from '../../src/faults/stall-kv.js'
import {wedgeExpectation} from '../../src/faults/wedge-rank.js'
import type {Host, RunResult} from '../../src/hosts/host.js'
import {FEWER_NICS, railHost} from '../discovery/topo-samples.js'

/**
 * stall-kv off TCP, planned from synthetic discovery and host facts: the exact commands, the probes that verify each
 * by its effect, and the refusals. tc flower, link down and the InfiniBand port are planned only (no such hardware
 * here); the twin's rail netfilter is what runs on this kernel.
 */

const ENV_DEFAULT = {UCX_TLS: 'rc,cuda_copy,cuda_ipc'}

function rank(service: 'prefill' | 'decode', tp: number, env: Record<string, string> = ENV_DEFAULT): RankInfo {
  const base = service === 'prefill' ? 1000 : 2000
  return {
    service,
    tpRank: tp,
    pid: base + tp,
    startTicks: 50_000 + base + tp,
    state: 'S',
    title: `sglang::scheduler_TP${tp}`,
    gpu: service === 'prefill' ? tp : 4 + tp,
    env,
  }
}

const RANKS = [0, 1, 2, 3].flatMap(k => [rank('prefill', k), rank('decode', k)])
const CONTRACT = {scope: 'inflight' as const, deadlineSeconds: 60, pollSeconds: 1}

function rdma(over: Partial<FaultDiscovery> = {}, topo = railHost()): FaultDiscovery {
  return {
    ranks: RANKS,
    transport: {backend: 'nixl', source: 'test', env: ENV_DEFAULT},
    servicePorts: [30_000, 30_001, 8000, 8998],
    topology: parseNvidiaTopo(topo),
    ...over,
  }
}

const TC_OK = {
  version: 'tc utility, iproute2-6.1.0, libbpf 1.1.0',
  modules: {cls_flower: 'loaded', act_gact: 'module', sch_ingress: 'builtin'},
}

/** GPU 1's NIC on the rail host: NIC1 = mlx5_3, netdev ens3np0. */
function roce(over: Partial<NicFacts> = {}): NicFacts {
  return {
    label: 'NIC1',
    legend: 'mlx5_3',
    rdmaDevice: 'mlx5_3',
    netdev: 'ens3np0',
    linkLayer: 'Ethernet',
    portState: '4: ACTIVE',
    portPhysState: '5: LinkUp',
    hwTcOffload: 'on',
    tc: TC_OK,
    hasClsact: false,
    evidence: ['NIC1: RDMA device mlx5_3, link layer Ethernet'],
    ...over,
  }
}

function ib(over: Partial<NicFacts> = {}): NicFacts {
  return {
    label: 'NIC1',
    legend: 'mlx5_3',
    rdmaDevice: 'mlx5_3',
    netdev: 'ibp3s0',
    linkLayer: 'InfiniBand',
    portState: '4: ACTIVE',
    portPhysState: '5: LinkUp',
    ibportstate: '/usr/sbin/ibportstate',
    evidence: ['NIC1: RDMA device mlx5_3, link layer InfiniBand'],
    ...over,
  }
}

const params = (raw: Record<string, unknown>) => parseFaultParams(stallKv, raw)

function plan(raw: Record<string, unknown>, facts: HostFacts, d: FaultDiscovery = rdma()): FaultPlan {
  return stallKv.plan({discovery: d, params: params(raw), leaseId: 'L7', facts, contract: CONTRACT})
}

function refusal(fn: () => unknown): PdError {
  try {
    fn()
  } catch (error) {
    expect(error).toBeInstanceOf(PdError)
    expect((error as PdError).exitCode).toBe(2)
    return error as PdError
  }
  throw new Error('expected a refusal (exit 2)')
}

/** Every argv survives a real sh byte for byte, and every constant script parses. */
function expectRenderable(p: FaultPlan): void {
  const all = [
    ...p.inject,
    ...p.revert,
    ...p.readOnlyProbes,
    ...p.verifyInjected.map(x => x.argv),
    ...p.verifyClean.map(x => x.argv),
  ]
  for (const argv of all) {
    const r = spawnSync('sh', ['-c', `printf '%s\\0' ${renderArgv(argv)}`], {encoding: 'utf8'})
    expect(r.stdout.split('\0').slice(0, -1)).toEqual(argv)
  }
}

describe('RoCE with tc offload: a hardware tc flower drop of RoCEv2', () => {
  const p = plan({gpu: 1}, {nics: [roce()]})
  const {v4, v6} = tcPrefs('L7')
  const cookie = tcCookie('L7')

  it('adds clsact where missing, then skip_sw flower drops of UDP 4791 (IPv4 and IPv6) on ingress and egress', () => {
    expect(p.mechanism).toBe('tc-flower')
    expect(p.targets).toEqual([{service: 'prefill', tpRank: 1, pid: 1001, startTicks: 51_001, gpu: 1, nic: 'ens3np0'}])
    const f = (dir: string, proto: string, pref: number) => [
      'tc',
      'filter',
      'add',
      'dev',
      'ens3np0',
      dir,
      'protocol',
      proto,
      'pref',
      String(pref),
      'handle',
      '1',
      'flower',
      'skip_sw',
      'ip_proto',
      'udp',
      'dst_port',
      '4791',
      'action',
      'gact',
      'drop',
      'cookie',
      cookie,
    ]
    expect(p.inject).toEqual([
      ['sh', '-c', CLSACT_ADD_SCRIPT, 'sh', 'ens3np0'],
      f('ingress', 'ip', v4),
      f('ingress', 'ipv6', v6),
      f('egress', 'ip', v4),
      f('egress', 'ipv6', v6),
    ])
    expect(cookie).toMatch(/^[0-9a-f]{32}$/)
    expect(v6).toBe(v4 + 1)
    // pdchaos added clsact ($4 = 1): the revert may delete it once nothing else is on it.
    expect(p.revert).toEqual([['sh', '-c', TC_REVERT_SCRIPT, 'sh', 'ens3np0', String(v4), String(v6), '1']])
    expect(plan({gpu: 1}, {nics: [roce({hasClsact: true})]}).revert[0]!.at(-1)).toBe('0')
    expect(p.verifyInjected.map(x => x.argv)).toEqual([['sh', '-c', TC_LIST_SCRIPT, 'sh', 'ens3np0']])
    expect(p.verifyClean.map(x => x.argv)).toEqual([['sh', '-c', TC_LIST_SCRIPT, 'sh', 'ens3np0']])
    expect(p.readOnlyProbes).toContainEqual(['ethtool', '-k', 'ens3np0'])
    expect(p.description).toMatch(
      /in hardware: tc flower skip_sw drop of udp dst_port 4791 on ens3np0 ingress and egress/,
    )
    expect(p.notes?.join('\n')).toMatch(/GPU1 is PIX to NIC1 \(mlx5_3\)/)
    expect(p.sudo).toBe(true)
    expectRenderable(p)
  })

  const filter = (
    proto: string,
    pref: number,
    opts: {inHw?: boolean; skipSw?: boolean; action?: string; cookieOf?: string; packets?: number} = {},
  ) => ({
    protocol: proto,
    pref,
    kind: 'flower',
    chain: 0,
    options: {
      handle: 1,
      keys: {eth_type: proto === 'ip' ? 'ipv4' : 'ipv6', ip_proto: 'udp', dst_port: 4791},
      ...(opts.skipSw === false ? {} : {skip_sw: true}),
      ...(opts.inHw === false ? {not_in_hw: true} : {in_hw: true, in_hw_count: 1}),
      actions: [
        {
          order: 1,
          kind: 'gact',
          control_action: {type: opts.action ?? 'drop'},
          index: 1,
          ref: 1,
          bind: 1,
          stats: {bytes: 0, packets: opts.packets ?? 0, hw_packets: opts.packets ?? 0},
          cookie: opts.cookieOf ?? cookie,
        },
      ],
    },
  })
  const listing = (ingress: unknown[], egress: unknown[]) =>
    `\u001Eingress\n${JSON.stringify(ingress)}\n\u001Eegress\n${JSON.stringify(egress)}\n`
  const full = () => [
    {protocol: 'ip', pref: v4, kind: 'flower', chain: 0},
    filter('ip', v4, {packets: 12}),
    filter('ipv6', v6),
  ]

  it(
    "verified by the kernel's own listing: each filter in hardware, skip_sw, a drop, with its hardware " + 'counters',
    () => {
      expect(judgeTcInjected('L7', listing(full(), full()), 0)).toMatchObject({
        ok: true,
        evidence: expect.stringContaining('24 packet(s) dropped so far'),
      })
      expect(p.verifyInjected[0]!.judge(listing(full(), full()), 0).ok).toBe(true)
    },
  )

  it(
    'fails when tc "succeeded" but nothing is in hardware: no filter listed, not_in_hw, software-only, a pass ' +
      "action, another lease's filter",
    () => {
      // A tc that exits 0 and installs nothing: the listing is empty.
      expect(judgeTcInjected('L7', listing([], []), 0)).toMatchObject({
        ok: false,
        evidence: expect.stringContaining('ingress ip pref'),
      })
      expect(
        judgeTcInjected('L7', listing([filter('ip', v4, {inHw: false}), filter('ipv6', v6)], full()), 0).evidence,
      ).toMatch(/not in hardware \(not_in_hw\)/)
      expect(
        judgeTcInjected('L7', listing([filter('ip', v4, {skipSw: false}), filter('ipv6', v6)], full()), 0).evidence,
      ).toMatch(/not skip_sw/)
      expect(
        judgeTcInjected('L7', listing(full(), [filter('ip', v4, {action: 'pass'}), filter('ipv6', v6)]), 0).evidence,
      ).toMatch(/egress ip pref \d+: its action is not a drop/)
      expect(
        judgeTcInjected('L7', listing([filter('ip', v4, {cookieOf: '00'}), filter('ipv6', v6)], full()), 0).evidence,
      ).toMatch(/no filter of this lease/)
      expect(judgeTcInjected('L7', 'Error: Cannot find device "ens3np0"', 3).ok).toBe(false)
    },
  )

  it('clean only when no filter of the lease is left on either direction; a netdev without clsact is clean', () => {
    expect(judgeTcClean('L7', listing([], []), 0)).toMatchObject({ok: true})
    expect(judgeTcClean('L7', listing([], [filter('ipv6', v6)]), 0)).toMatchObject({
      ok: false,
      evidence: expect.stringContaining('egress pref'),
    })
    expect(judgeTcClean('L7', '', 3).ok).toBe(false)
  })

  it(
    "states the expected outcome from the rank's UCX limits: defaults end in a transport error long before a 60 s " +
      'deadline',
    () => {
      expect(p.expected).toMatchObject({
        kind: 'stall',
        outcome: 'transport-error',
        deadlineSeconds: 60,
        raise: ['UCX_RC_MLX5_TIMEOUT', 'UCX_RC_TIMEOUT', 'UCX_RC_MLX5_RETRY_COUNT', 'UCX_RC_RETRY_COUNT'],
      })
      expect(p.expected!.kind === 'stall' && p.expected.afterSeconds).toBeCloseTo(8.59, 2)
      expect(p.notes?.join('\n')).toMatch(
        /expected outcome: transport-error — a stall longer than about 8\.59 s becomes a transport error, before the 60 s watchdog deadline.*raise UCX_RC_MLX5_TIMEOUT or UCX_RC_TIMEOUT/,
      )
      expect(p.notes?.join('\n')).toMatch(
        /transport limits: rc_mlx5: timeout 1\.0s \(UCX default\) -> QP ACK timeout 1\.07 s, retry count 7 \(UCX default\), read from prefill TP1/,
      )
    },
  )
})

describe('RoCE without tc offload', () => {
  it('is refused (exit 2), saying why and what would make it possible', () => {
    const off = refusal(() => plan({gpu: 1}, {nics: [roce({hwTcOffload: 'off'})]}))
    expect(off.message).toMatch(
      /no way to stall GPU 1's KV transfer here: GPU 1's NIC is RoCE and ens3np0 does not offload tc filters \(`ethtool -k ens3np0`: hw-tc-offload: off\): a tc flower drop cannot be offloaded, and netfilter never sees hardware RoCE/,
    )
    expect(off.suggestion).toMatch(
      /ethtool -K ens3np0 hw-tc-offload on.*--allow-link-down would take the NIC down instead: taking the NIC down drops every flow on it/,
    )
    const fixed = refusal(() => plan({gpu: 1}, {nics: [roce({hwTcOffload: 'off [fixed]'})]}))
    expect(fixed.suggestion).toMatch(/a NIC whose driver offloads tc flower/)
    expect(
      refusal(() =>
        plan(
          {gpu: 1},
          {nics: [roce({tc: {modules: {cls_flower: 'missing', act_gact: 'loaded', sch_ingress: 'loaded'}}})]},
        ),
      ).message,
    ).toMatch(/tc \(iproute2\) is not installed/)
    expect(
      refusal(() =>
        plan({gpu: 1}, {nics: [roce({tc: {...TC_OK, modules: {...TC_OK.modules, cls_flower: 'missing'}}})]}),
      ).message,
    ).toMatch(/the kernel lacks cls_flower/)
    expect(refusal(() => plan({gpu: 1, mechanism: 'tc-flower'}, {nics: [roce({hwTcOffload: 'off'})]})).message).toMatch(
      /--mechanism tc-flower: ens3np0 does not offload/,
    )
    // netfilter is never used on a hardware RoCE NIC.
    expect(
      refusal(() => plan({gpu: 1, mechanism: 'packet-filter'}, {nics: [roce()], filterTool: 'nft'})).message,
    ).toMatch(/a packet filter cannot stall hardware RDMA/)
  })

  const routes = [
    {family: 4 as const, dst: '10.1.0.0/16', gateway: '10.0.1.254', table: '101', protocol: 'static'},
    {family: 6 as const, dst: 'fd00:1::/64', protocol: 'static', metric: 1024},
  ]
  const nic = roce({hwTcOffload: 'off', routes, addrs6: ['fd00:3::5/64']})

  it(
    'with --allow-link-down: ip link set down; revert up, then the routes and IPv6 addresses the kernel ' + 'deleted',
    () => {
      const p = plan({gpu: 1, allowLinkDown: true}, {nics: [nic]})
      expect(p.mechanism).toBe('link-down')
      expect(p.refusals).toEqual([expect.stringMatching(/^tc-flower refused: ens3np0 does not offload tc filters/)])
      expect(p.inject).toEqual([['ip', 'link', 'set', 'dev', 'ens3np0', 'down']])
      expect(p.revert).toEqual([
        ['ip', 'link', 'set', 'dev', 'ens3np0', 'up'],
        ['ip', '-6', 'addr', 'replace', 'fd00:3::5/64', 'dev', 'ens3np0'],
        [
          'ip',
          'route',
          'replace',
          '10.1.0.0/16',
          'via',
          '10.0.1.254',
          'dev',
          'ens3np0',
          'table',
          '101',
          'proto',
          'static',
        ],
        ['ip', '-6', 'route', 'replace', 'fd00:1::/64', 'dev', 'ens3np0', 'proto', 'static', 'metric', '1024'],
      ])
      expect(p.verifyInjected.map(x => x.argv)).toEqual([
        ['ip', '-j', 'link', 'show', 'dev', 'ens3np0'],
        ['sh', '-c', COUNTERS_SCRIPT, 'sh', '1', ...counterFiles({netdev: 'ens3np0', rdmaDevice: 'mlx5_3'})],
      ])
      expect(p.verifyClean.map(x => x.argv)).toEqual([
        ['ip', '-j', 'link', 'show', 'dev', 'ens3np0'],
        ['sh', '-c', ROUTES_SCRIPT, 'sh', 'ens3np0'],
      ])
      expect(p.description).toMatch(/drops every flow on it/)
      expect(stallKv.footprint(params({gpu: 1, allowLinkDown: true}), {autoMechanism: 'sigstop'}).exclusive).toMatch(
        /drops every flow/,
      )
      expectRenderable(p)
    },
  )

  it(
    "link down is judged by its effect: the link state and the NIC's counters standing still, not ip's exit " +
      'status',
    () => {
      const down = JSON.stringify([
        {ifindex: 5, ifname: 'ens3np0', flags: ['BROADCAST', 'MULTICAST'], operstate: 'DOWN'},
      ])
      const up = JSON.stringify([
        {ifindex: 5, ifname: 'ens3np0', flags: ['BROADCAST', 'MULTICAST', 'UP', 'LOWER_UP'], operstate: 'UP'},
      ])
      expect(judgeLinkDown('ens3np0', down, 0).ok).toBe(true)
      // `ip link set down` exited 0 but the link is still up: not injected.
      expect(judgeLinkDown('ens3np0', up, 0)).toMatchObject({
        ok: false,
        evidence: expect.stringContaining('is not down'),
      })
      expect(judgeLinkUp('ens3np0', up, 0)).toMatchObject({ok: true, evidence: expect.stringContaining('carrier up')})
      expect(judgeLinkUp('ens3np0', down, 0).ok).toBe(false)
      const files = counterFiles({netdev: 'ens3np0', rdmaDevice: 'mlx5_3'})
      const sample = (a: number[], b: number[]) =>
        `\u001E1\n${files.map((f, i) => `${f} ${a[i]}`).join('\n')}\n\u001E2\n${files.map((f, i) => `${f} ${b[i]}`).join('\n')}\n`
      expect(judgeCountersStill(sample([5, 6, 7, 8], [5, 6, 7, 8]), 0, files)).toMatchObject({
        ok: true,
        evidence: expect.stringContaining('no traffic for 1 s'),
      })
      // The command "succeeded" but the NIC still moves data: the stall is not in place.
      expect(judgeCountersStill(sample([5, 6, 7, 8], [5, 6, 900, 8]), 0, files)).toMatchObject({
        ok: false,
        evidence: expect.stringContaining('traffic still flows: mlx5_3/ports/1/counters/port_xmit_data 7 -> 900'),
      })
      expect(judgeCountersStill(`\u001E1\n${files[0]} none\n\u001E2\n`, 0, files).ok).toBe(false)
      // Routes back after the revert.
      const listed = `\u001E4\n${JSON.stringify([{dst: '10.1.0.0/16', gateway: '10.0.1.254', table: '101', protocol: 'static', flags: []}])}\n\u001E6\n${JSON.stringify([{dst: 'fd00:1::/64', protocol: 'static', metric: 1024, flags: []}])}\n`
      expect(judgeRoutesBack(routes, listed, 0)).toMatchObject({ok: true})
      expect(judgeRoutesBack(routes, '\u001E4\n[]\n\u001E6\n[]\n', 0)).toMatchObject({
        ok: false,
        evidence: expect.stringContaining('10.1.0.0/16 101'),
      })
    },
  )

  it("reads routes as ip -j prints them, leaving the kernel's own (connected, local, link-local) to the kernel", () => {
    const r = parseRoutes(
      JSON.stringify([
        {dst: '10.0.1.0/24', protocol: 'kernel', scope: 'link', prefsrc: '10.0.1.5', flags: []},
        {
          type: 'local',
          dst: '10.0.1.5',
          table: 'local',
          protocol: 'kernel',
          scope: 'host',
          prefsrc: '10.0.1.5',
          flags: [],
        },
        {dst: 'default', gateway: '10.0.1.254', table: '101', protocol: 'static', flags: ['onlink']},
        {dst: '10.9.0.0/16', nexthops: [{gateway: '10.0.1.1'}, {gateway: '10.0.1.2'}], protocol: 'static', flags: []},
      ]),
      4,
    )
    expect(r).toEqual([
      {family: 4, dst: 'default', gateway: '10.0.1.254', table: '101', protocol: 'static', flags: ['onlink']},
      {family: 4, dst: '10.9.0.0/16', protocol: 'static', multipath: true},
    ])
    expect(routeReplaceArgv(r[0]!, 'ens3np0')).toEqual([
      'ip',
      'route',
      'replace',
      'default',
      'via',
      '10.0.1.254',
      'dev',
      'ens3np0',
      'table',
      '101',
      'proto',
      'static',
      'onlink',
    ])
    // A multipath route pdchaos cannot rebuild: link down is refused.
    expect(
      refusal(() => plan({gpu: 1, allowLinkDown: true}, {nics: [roce({hwTcOffload: 'off', routes: r})]})).message,
    ).toMatch(/multipath route\(s\) pdchaos cannot rebuild \(ens3np0: 10\.9\.0\.0\/16\)/)
  })
})

describe('InfiniBand: the port can only be disabled', () => {
  it('refused without --allow-link-down, saying that no per-flow filter exists', () => {
    const e = refusal(() => plan({gpu: 1}, {nics: [ib()]}))
    expect(e.message).toMatch(
      /GPU 1's NIC is InfiniBand \(mlx5_3\): no per-flow filter exists for it \(tc and netfilter never see its traffic\); the only stall is disabling the port/,
    )
    expect(e.suggestion).toMatch(
      /--allow-link-down disables the port with ibportstate: taking the NIC down drops every flow on it/,
    )
    expect(
      refusal(() => plan({gpu: 1, allowLinkDown: true}, {nics: [ib({ibportstate: undefined})]})).suggestion,
    ).toMatch(/install infiniband-diags/)
  })

  it(
    'with the flag: ibportstate off on the local port by direct route; revert on (enables only a disabled port); ' +
      'verified by sysfs and the port counters',
    () => {
      const p = plan({gpu: 1, allowLinkDown: true}, {nics: [ib()]})
      expect(p.mechanism).toBe('ib-port-disable')
      expect(p.inject).toEqual([['ibportstate', '-C', 'mlx5_3', '-P', '1', '-D', '0', '1', 'off']])
      expect(p.revert).toEqual([['ibportstate', '-C', 'mlx5_3', '-P', '1', '-D', '0', '1', 'on']])
      const files = counterFiles({rdmaDevice: 'mlx5_3'})
      expect(files).toEqual([
        '/sys/class/infiniband/mlx5_3/ports/1/counters/port_xmit_data',
        '/sys/class/infiniband/mlx5_3/ports/1/counters/port_rcv_data',
      ])
      expect(p.verifyInjected.map(x => x.argv)).toEqual([
        ['sh', '-c', IB_PORT_STATE_SCRIPT, 'sh', 'mlx5_3'],
        ['sh', '-c', COUNTERS_SCRIPT, 'sh', '1', ...files],
      ])
      expect(p.verifyClean.map(x => x.argv)).toEqual([['sh', '-c', IB_PORT_STATE_SCRIPT, 'sh', 'mlx5_3']])
      expect(judgeIbPortDisabled('mlx5_3', '1: DOWN\n3: Disabled\n', 0).ok).toBe(true)
      // ibportstate "succeeded" but the port is still up.
      expect(judgeIbPortDisabled('mlx5_3', '4: ACTIVE\n5: LinkUp\n', 0)).toMatchObject({
        ok: false,
        evidence: expect.stringContaining('not disabled'),
      })
      expect(judgeIbPortEnabled('mlx5_3', '1: DOWN\n2: Polling\n', 0)).toMatchObject({
        ok: true,
        evidence: expect.stringContaining('subnet manager'),
      })
      expect(judgeIbPortEnabled('mlx5_3', '1: DOWN\n3: Disabled\n', 0).ok).toBe(false)
      expect(refusal(() => plan({gpu: 1, mechanism: 'tc-flower'}, {nics: [ib()]})).message).toMatch(
        /InfiniBand: tc and netfilter never see InfiniBand traffic/,
      )
      expectRenderable(p)
    },
  )
})

describe("the twin's rail NIC: kernel UDP to port 4791 on the GPU's own interface", () => {
  const twin = (over: Partial<FaultDiscovery> = {}): FaultDiscovery =>
    rdma(
      {
        transport: {
          backend: 'nixl',
          source: 'test',
          dataPath: 'rdma-roce-rails',
          rails: [0, 1, 2, 3, 4, 5, 6, 7].map(g => ({
            gpu: g,
            interface: `rail${g}`,
            address: `198.18.${g}.1`,
            udpPort: 4791,
          })),
        },
        twinFailpointUrl: 'http://127.0.0.1:30000/_pdchaos/twin/failpoint',
        ...over,
      },
      railHost(Array.from({length: 8}, (_, g) => `rail${g}`)),
    )
  const railNic: NicFacts = {
    label: 'NIC2',
    legend: 'rail2',
    netdev: 'rail2',
    evidence: ['NIC2: netdev rail2 (up) with no RDMA device: kernel traffic only'],
  }

  it(
    "nft: drop UDP 4791 (destination and source port) in on iifname and out on oifname, in the lease's own " + 'table',
    () => {
      const p = plan({gpu: 2}, {nics: [railNic], filterTool: 'nft', filterEvidence: 'nft 1.0.6'}, twin())
      expect(p.mechanism).toBe('packet-filter')
      expect(p.targets).toEqual([{service: 'prefill', tpRank: 2, pid: 1002, startTicks: 51_002, gpu: 2, nic: 'rail2'}])
      const t = nftTableName('L7')
      expect(p.inject).toEqual([
        [
          'nft',
          [
            `add table inet ${t}`,
            `add chain inet ${t} input { type filter hook input priority -10; policy accept; }`,
            `add chain inet ${t} output { type filter hook output priority -10; policy accept; }`,
            `add rule inet ${t} input iifname "rail2" udp dport 4791 counter drop comment "udp-in-rail2-dport-4791"`,
            `add rule inet ${t} input iifname "rail2" udp sport 4791 counter drop comment "udp-in-rail2-sport-4791"`,
            `add rule inet ${t} output oifname "rail2" udp dport 4791 counter drop comment "udp-out-rail2-dport-4791"`,
            `add rule inet ${t} output oifname "rail2" udp sport 4791 counter drop comment "udp-out-rail2-sport-4791"`,
          ].join('\n'),
        ],
      ])
      expect(p.revert).toEqual([['nft', 'add', 'table', 'inet', t, ';', 'delete', 'table', 'inet', t]])
      expect(p.verifyInjected[0]!.argv).toEqual(['nft', '-j', 'list', 'table', 'inet', t])
      expect(p.description).toMatch(/stall GPU 2's rail NIC rail2 .*drop UDP 4791 in and out of it/)
      expectRenderable(p)
      // Each rule on its own hook: an input rule listed only on output is missing.
      const listing = (rules: Array<[string, string]>, packets = 4) =>
        JSON.stringify({
          nftables: [
            {table: {family: 'inet', name: t}},
            {chain: {family: 'inet', table: t, name: 'input', hook: 'input'}},
            {chain: {family: 'inet', table: t, name: 'output', hook: 'output'}},
            ...rules.map(([chain, comment]) => ({
              rule: {family: 'inet', table: t, chain, comment, expr: [{counter: {packets, bytes: 4000}}, {drop: null}]},
            })),
          ],
        })
      const all: Array<[string, string]> = [
        ['input', 'udp-in-rail2-dport-4791'],
        ['input', 'udp-in-rail2-sport-4791'],
        ['output', 'udp-out-rail2-dport-4791'],
        ['output', 'udp-out-rail2-sport-4791'],
      ]
      expect(p.verifyInjected[0]!.judge(listing(all), 0)).toMatchObject({
        ok: true,
        evidence: expect.stringContaining('16 packet(s) matched'),
      })
      expect(
        p.verifyInjected[0]!.judge(listing([...all.slice(0, 3), ['input', 'udp-out-rail2-sport-4791']]), 0),
      ).toMatchObject({ok: false, evidence: expect.stringContaining('output:udp-out-rail2-sport-4791')})
      // nft exited 0 and added nothing: no table, no rules.
      expect(p.verifyInjected[0]!.judge(JSON.stringify({nftables: [{metainfo: {}}]}), 0).ok).toBe(false)
      expect(
        judgeNftInjected(
          t,
          ['to-1'],
          listing([
            ['input', 'to-1'],
            ['output', 'to-1'],
          ]),
          0,
        ).ok,
      ).toBe(true)
    },
  )

  it("iptables fallback: -i/-o rail2 UDP 4791 in the lease's chain (IPv4 only, said so)", () => {
    const p = plan({gpu: 2}, {nics: [railNic], filterTool: 'iptables', filterEvidence: 'iptables v1.8.9'}, twin())
    const chain = p.inject[0]![4]!
    expect(p.inject).toEqual([
      ['iptables', '-w', '5', '-N', chain],
      [
        'iptables',
        '-w',
        '5',
        '-A',
        chain,
        '-i',
        'rail2',
        '-p',
        'udp',
        '--dport',
        '4791',
        '-m',
        'comment',
        '--comment',
        'udp-in-rail2-dport-4791',
        '-j',
        'DROP',
      ],
      [
        'iptables',
        '-w',
        '5',
        '-A',
        chain,
        '-o',
        'rail2',
        '-p',
        'udp',
        '--dport',
        '4791',
        '-m',
        'comment',
        '--comment',
        'udp-out-rail2-dport-4791',
        '-j',
        'DROP',
      ],
      [
        'iptables',
        '-w',
        '5',
        '-A',
        chain,
        '-i',
        'rail2',
        '-p',
        'udp',
        '--sport',
        '4791',
        '-m',
        'comment',
        '--comment',
        'udp-in-rail2-sport-4791',
        '-j',
        'DROP',
      ],
      [
        'iptables',
        '-w',
        '5',
        '-A',
        chain,
        '-o',
        'rail2',
        '-p',
        'udp',
        '--sport',
        '4791',
        '-m',
        'comment',
        '--comment',
        'udp-out-rail2-sport-4791',
        '-j',
        'DROP',
      ],
      ['iptables', '-w', '5', '-I', 'INPUT', '1', '-j', chain],
      ['iptables', '-w', '5', '-I', 'OUTPUT', '1', '-j', chain],
    ])
    expect(p.revert).toEqual([['sh', '-c', IPTABLES_REVERT_SCRIPT, 'sh', chain]])
    expect(p.notes?.join(' ')).toMatch(/drops IPv4 only/)
  })

  it(
    "the twin's expectation comes from the same UCX variables; without a usable packet filter auto uses the " +
      "twin's failure point",
    () => {
      const slow = rdma().ranks.map(r => ({...r, env: {UCX_RC_TIMEOUT: '30s'}}))
      const p = plan({gpu: 2}, {nics: [railNic], filterTool: 'nft'}, twin({ranks: slow}))
      expect(p.expected).toMatchObject({kind: 'stall', outcome: 'watchdog'})
      const fp = plan({gpu: 2}, {nics: [railNic], filterEvidence: 'nft: permission denied'}, twin())
      expect(fp.mechanism).toBe('twin-failpoint')
      expect(fp.refusals?.[0]).toMatch(/packet filter not usable here \(nft: permission denied\)/)
      expect(fp.expected).toMatchObject({outcome: 'transport-error'})
    },
  )

  it(
    'never netfilter on a NIC with an RDMA device, whatever the twin states; no interface is refused; tc and link ' +
      'down are for hardware',
    () => {
      expect(
        refusal(() => plan({gpu: 2}, {nics: [{...railNic, rdmaDevice: 'mlx5_2'}], filterTool: 'nft'}, twin())).message,
      ).toMatch(/rail2 has an RDMA device \(mlx5_2\): its traffic is hardware RoCE, which netfilter never sees/)
      expect(
        refusal(() =>
          plan({gpu: 2}, {nics: [{label: 'NIC2', legend: 'rail2', evidence: ['missing']}], filterTool: 'nft'}, twin()),
        ).message,
      ).toMatch(/the host has no such interface/)
      expect(
        refusal(() => plan({gpu: 2, mechanism: 'tc-flower'}, {nics: [railNic], filterTool: 'nft'}, twin())).message,
      ).toMatch(/carries kernel UDP, which netfilter stalls exactly/)
    },
  )
})

describe('no stall mechanism: exit 2 with what would make one possible', () => {
  it('no nvidia-smi topology, no PIX/PXB NIC, a kernel-only NIC on an RDMA path, an unknown link layer', () => {
    const noTopo = refusal(() =>
      plan(
        {gpu: 1},
        {nics: []},
        rdma({topology: undefined, topologyError: '`nvidia-smi topo -m` failed: command not found'}),
      ),
    )
    expect(noTopo.message).toMatch(/the GPU's NIC is unknown \(`nvidia-smi topo -m` failed: command not found\)/)
    expect(noTopo.suggestion).toMatch(/UCX_TLS=tcp, MC_FORCE_TCP=1/)
    const far = refusal(() =>
      plan(
        {gpu: 7},
        {nics: []},
        rdma(
          {ranks: [...RANKS, {...rank('decode', 9), gpu: 7, pid: 2999}].filter(r => r.gpu !== 7 || r.pid === 2999)},
          FEWER_NICS,
        ),
      ),
    )
    expect(far.message).toMatch(/no NIC is PIX or PXB to GPU7/)
    expect(far.suggestion).toMatch(/a NIC on its own PCIe switch \(PIX\/PXB\)/)
    const kernel = refusal(() =>
      plan(
        {gpu: 1},
        {
          nics: [
            {label: 'NIC1', legend: 'mlx5_3', netdev: 'eth1', evidence: ['NIC1: netdev eth1 with no RDMA device']},
          ],
        },
      ),
    )
    expect(kernel.message).toMatch(/nothing states that the KV crosses it as kernel traffic/)
    expect(refusal(() => plan({gpu: 1}, {nics: [roce({linkLayer: 'Unknown'})]})).message).toMatch(
      /link layer is Unknown/,
    )
  })

  it('a PXB NIC shared by two GPUs: the plan names the other GPU; the footprint stays per GPU', () => {
    const d = rdma({}, FEWER_NICS)
    const p = plan({gpu: 2}, {nics: [roce({label: 'NIC1', legend: 'mlx5_1', rdmaDevice: 'mlx5_1', netdev: 'eth1'})]}, d)
    expect(p.notes?.join('\n')).toMatch(/GPU\(s\) 3 share that NIC: their KV stalls too/)
    expect(stallKv.footprint(params({gpu: 2}), {autoMechanism: 'sigstop'})).toEqual({
      gpus: [2],
      ports: ['kv:2', 'nic-of-gpu:2'],
      queue: 'inflight',
    })
    expect(stallKv.footprint(params({gpu: 2}), {}).exclusive).toMatch(/unknown when planning/)
  })
})

describe('the expected outcome (UCX RC limits against the watchdog deadline)', () => {
  const exp = (env: Record<string, string>, deadline = 60, backend = 'nixl', gpu = 1) => {
    const ranks = RANKS.map(r => ({...r, env}))
    const d = rdma({ranks, transport: {backend, source: 'test'}})
    return stallExpectation(
      {discovery: d, contract: {scope: 'inflight', deadlineSeconds: deadline, pollSeconds: 1}},
      ranks.find(r => r.gpu === gpu)!,
    )!
  }

  it('defaults: a transport error after about 8.6 s, before a 60 s deadline', () => {
    expect(exp({})).toMatchObject({outcome: 'transport-error', deadlineSeconds: 60})
    expect(exp({}).afterSecondsRange).toEqual([7.516, 8.59])
  })

  it('a long RC timeout: the pins stay Transferring for the watchdog', () => {
    const e = exp({UCX_RC_TIMEOUT: '30s'})
    expect(e.outcome).toBe('watchdog')
    expect(e.afterSeconds).toBeCloseTo(34.36 * 8, 0)
    expect(e.limits).toMatch(/timeout 30s \(UCX_RC_TIMEOUT\)/)
    expect(exp({UCX_RC_TIMEOUT: '10s'}).outcome).toBe('either')
    expect(exp({UCX_RC_MLX5_TIMEOUT: '300m'})).toMatchObject({outcome: 'watchdog', afterSeconds: null})
  })

  it(
    'a decode GPU reads the limits of the prefill rank that writes into it; Mooncake reads MC_TRANSFER_TIMEOUT; ' +
      'other backends state nothing',
    () => {
      const ranks = RANKS.map(r => ({...r, env: r.service === 'prefill' ? {UCX_RC_TIMEOUT: '30s'} : {}}))
      const d = rdma({ranks})
      const e = stallExpectation({discovery: d, contract: CONTRACT}, ranks.find(r => r.gpu === 6)!)!
      expect(e).toMatchObject({outcome: 'watchdog'})
      expect(e.limits).toMatch(/read from prefill TP2 .*the prefill rank that writes into decode TP2/)
      expect(exp({}, 60, 'mooncake')).toMatchObject({
        outcome: 'transport-error',
        afterSeconds: 30,
        raise: ['MC_TRANSFER_TIMEOUT'],
      })
      expect(exp({MC_TRANSFER_TIMEOUT: '600'}, 60, 'mooncake')).toMatchObject({outcome: 'watchdog'})
      expect(
        stallExpectation({discovery: rdma({transport: {backend: 'fake', source: 't'}}), contract: CONTRACT}, RANKS[0]!),
      ).toBeUndefined()
    },
  )

  it(
    "the wedge bound comes from the server's own health-check timeout (env or the twin's statement), never a " +
      'constant',
    () => {
      expect(wedgeExpectation({discovery: rdma()}, 'prefill')).toMatchObject({
        healthTimeoutSeconds: 20,
        detectWithinSeconds: 22.25,
        resumeWithinSeconds: 22.25,
        probePath: '/health',
        holdSeconds: 28,
      })
      const short = wedgeExpectation(
        {
          discovery: rdma({
            health: {decode: {timeoutSeconds: 3, source: 'SGLANG_HEALTH_CHECK_TIMEOUT=3', generates: false}},
          }),
        },
        'decode',
      )
      expect(short).toMatchObject({
        service: 'decode',
        healthTimeoutSeconds: 3,
        detectWithinSeconds: 5.25,
        probePath: '/health_generate',
        holdSeconds: 9,
      })
    },
  )
})

describe('gathering a NIC on the host (read-only)', () => {
  /** A host that answers the probes from a table, as the real tools print. */
  function fakeHost(answers: Record<string, string>): Host & {ran: string[][]} {
    const ran: string[][] = []
    return {
      ran,
      async run(argv): Promise<RunResult> {
        ran.push(argv)
        const key =
          argv[0] === 'sh'
            ? argv[2] === NIC_SCRIPT
              ? 'nic'
              : argv[2] === TC_CAPS_SCRIPT
                ? 'caps'
                : argv[2]!
            : argv.join(' ')
        const out = answers[key]
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

  it('a RoCE NIC: sysfs, ethtool, tc and the existing qdiscs', async () => {
    const host = fakeHost({
      nic:
        '\u001Emlx5_3\nrdma=mlx5_3\nlink_layer=Ethernet\nstate=4: ACTIVE\nphys_state=5: ' +
        'LinkUp\nnetdev=ens3np0\noperstate=up\n',
      'ethtool -k ens3np0':
        'Features for ens3np0:\nrx-checksumming: on\nhw-tc-offload: on\nesp-hw-offload: off [fixed]\n',
      caps:
        'version=tc utility, iproute2-6.1.0, libbpf ' +
        '1.1.0\ncls_flower=loaded\nact_gact=module\nsch_ingress=builtin\n',
      'tc -j qdisc show dev ens3np0':
        '[{"kind":"mq","handle":"0:","root":true},{"kind":"clsact","handle":"ffff:","parent":"ffff:fff1"}]',
    })
    const [nic] = await gatherNics(host, [{label: 'NIC1', device: 'mlx5_3'}])
    expect(nic).toMatchObject({
      label: 'NIC1',
      legend: 'mlx5_3',
      rdmaDevice: 'mlx5_3',
      netdev: 'ens3np0',
      linkLayer: 'Ethernet',
      hwTcOffload: 'on',
      hasClsact: true,
      tc: TC_OK,
    })
    expect(host.ran.map(a => a[0])).toEqual(['sh', 'ethtool', 'sh', 'tc'])
  })

  it("the twin's rail (a netdev without an RDMA device) and a name the host does not know", async () => {
    const host = fakeHost({nic: '\u001Erail2\nnetdev=rail2\noperstate=up\n\u001Emlx5_9\nmissing=1\n'})
    const nics = await gatherNics(host, [
      {label: 'NIC2', device: 'rail2'},
      {label: 'NIC9', device: 'mlx5_9'},
      {label: 'NIC10', device: 'bad name'},
    ])
    expect(nics[0]).toMatchObject({netdev: 'rail2', evidence: [expect.stringContaining('with no RDMA device')]})
    expect(nics[0]!.rdmaDevice).toBeUndefined()
    expect(nics[1]!.evidence[0]).toMatch(
      /neither \/sys\/class\/infiniband\/mlx5_9 nor \/sys\/class\/net\/mlx5_9 exists/,
    )
    expect(nics[2]!.evidence[0]).toMatch(/unexpected device name/)
    expect(host.ran).toHaveLength(1)
  })

  it('the NIC script on this machine: lo is a netdev with no RDMA device; an unknown name is missing', () => {
    const r = spawnSync('sh', ['-c', NIC_SCRIPT, 'sh', 'lo', 'pdchaos-none0'], {encoding: 'utf8'})
    expect(r.status).toBe(0)
    expect(r.stdout).toMatch(/\u001Elo\nnetdev=lo\noperstate=\w+\n/)
    expect(r.stdout).toMatch(/\u001Epdchaos-none0\nmissing=1\n/)
  })

  it('every constant script is valid sh', () => {
    for (const script of [
      NIC_SCRIPT,
      TC_CAPS_SCRIPT,
      COUNTERS_SCRIPT,
      ROUTES_SCRIPT,
      IB_PORT_STATE_SCRIPT,
      CLSACT_ADD_SCRIPT,
      TC_REVERT_SCRIPT,
      TC_LIST_SCRIPT,
    ]) {
      expect(spawnSync('sh', ['-n', '-c', script]).status).toBe(0)
    }
  })

  it("the counter sample really samples twice (this machine's lo)", () => {
    const files = ['/sys/class/net/lo/statistics/tx_bytes']
    const r = spawnSync('sh', ['-c', COUNTERS_SCRIPT, 'sh', '0.1', ...files], {encoding: 'utf8'})
    expect(r.status).toBe(0)
    expect(r.stdout.split('\u001E').length).toBe(3)
    expect(judgeCountersStill(r.stdout, r.status, files).evidence).toMatch(/lo\/statistics\/tx_bytes/)
  })
})
