import {z} from 'zod'

import type {StallExpectation} from '../checks/expectation.js'
import type {RankInfo, TwinRail} from '../engines/sglang/discovery/discover.js'
import {type GpuNics, nicsOfGpu} from '../discovery/topo.js'
import {mooncakeTimeoutFromEnv, rcLimitsFromEnv} from '../engines/sglang/discovery/transport-env.js'
import {badInput, oneLine} from '../errors.js'
import type {Host} from '../hosts/host.js'
import {
  checkLeaseId,
  describeRank,
  type Fault,
  type FaultContext,
  type FaultDiscovery,
  type FaultPlan,
  type HostFacts,
  type NicFacts,
  type Probe,
} from './fault.js'
import {
  classifyDataPath,
  dataConnectionsOf,
  type DataPath,
  pairedRanks,
  parseSsConnections,
  rankOnGpu,
  SS_ARGV,
} from './mechanisms/data-path.js'
import {buildIbPortDisable, buildLinkDown, gatherNics, linkDownEffectProbes} from './mechanisms/nic.js'
import {buildFilter, detectFilterTool, noFilterTool} from './mechanisms/packet-filter.js'
import {buildTcFlower, ROCE_V2_UDP_PORT, tcFlowerSupport} from './mechanisms/tc-flower.js'
import {buildTwinFailpoint} from './mechanisms/twin-failpoint.js'

/**
 * stall-kv --gpu N: the KV transfer of the rank on GPU N stops making progress while every scheduler keeps running
 * (so the watchdog, which runs in the scheduler loop, can do its job). The mechanism follows what the host is:
 * - a kernel TCP data path (UCX_TLS=tcp, MC_FORCE_TCP=1, the twin's TCP path): netfilter drops both directions of
 *   the rank's KV connections;
 * - the twin's rail NIC (its KV as kernel UDP to port 4791 on the GPU's own interface): netfilter drops UDP 4791 in
 *   and out of that interface;
 * - hardware RoCE (the GPU's NIC by PCIe affinity, `nvidia-smi topo -m`): a tc flower drop of RoCEv2 offloaded to
 *   the NIC, where it offloads tc; netfilter never sees that traffic, so it is never used there;
 * - only with --allow-link-down, where nothing narrower exists: the NIC's link down (RoCE) or its InfiniBand port
 *   disabled, which drops every flow on that NIC.
 * Never SIGSTOP: a stopped rank wedges its whole instance, watchdog included (that experiment is wedge-rank).
 * On RDMA the plan states which outcome to expect: UCX's RC transport gives up on a stalled QP after about
 * timeout × (retries + 1), a transport error that may come long before the watchdog deadline.
 */

const Params = z
  .object({
    gpu: z.number().int().min(0).max(1023).optional().describe('stall-kv: the GPU whose rank stalls (required).'),
    mechanism: z
      .enum(['auto', 'packet-filter', 'tc-flower', 'link-down', 'twin-failpoint', 'sigstop'])
      .default('auto')
      .describe(
        "stall-kv: how the stall is made: auto follows the host (netfilter on a TCP data path or the twin's rail " +
          'NIC, an offloaded tc flower drop on a RoCE NIC); link-down needs --allow-link-down; sigstop is refused ' +
          '(it wedges the instance: use wedge-rank).',
      ),
    allowLinkDown: z
      .boolean()
      .optional()
      .describe(
        "stall-kv: where nothing narrower can stall the GPU's NIC, take its link down (RoCE) or disable its " +
          'InfiniBand port: this drops every flow on that NIC.',
      ),
    side: z
      .enum(['prefill', 'decode'])
      .optional()
      .describe('stall-kv: not used any more (it picked the rank --mechanism sigstop stopped): see wedge-rank --side.'),
  })
  .strict()

export type StallKvParams = z.infer<typeof Params>

export const RDMA_REFUSAL = "a packet filter cannot stall hardware RDMA: netfilter never sees the NIC's traffic"
export const SIGSTOP_REFUSAL =
  'stall-kv never stops a process: SIGSTOP on a rank wedges its whole instance (the watchdog runs in that ' +
  'scheduler loop), so it would blame a correct watchdog'
export const WEDGE_SUGGESTION =
  'to see how the deployment detects and recovers from a wedged instance, run `pdchaos inject wedge-rank --gpu N ' +
  '[--side prefill|decode]`'
export const LINK_DOWN_WARNING =
  "taking the NIC down drops every flow on it (other GPUs' KV, any other traffic on that NIC)"

export const stallKv: Fault<StallKvParams> = {
  name: 'stall-kv',
  summary:
    "the KV transfer of one GPU's rank stalls (netfilter on a kernel data path, an offloaded tc drop on a RoCE NIC)",
  params: Params,
  flagNames: {allowLinkDown: 'allow-link-down'},
  mechanisms: ['packet-filter', 'tc-flower', 'link-down', 'ib-port-disable', 'twin-failpoint'],
  observe: 'pins',
  // A transfer that stops making progress leaves the room Transferring in prefill's inflight queue
  // (python/sglang/srt/disaggregation/prefill.py, process_disagg_prefill_inflight_queue).
  pins: {queue: 'inflight', kvPoll: 'Transferring'},

  refine(p, label) {
    if (p.gpu === undefined) return {key: 'gpu', why: `needs ${label('gpu')} N (pick the GPU from \`pdchaos status\`)`}
    if (p.side !== undefined)
      return {
        key: 'side',
        why:
          `takes no ${label('side')} any more: ${label('side')} chose the rank SIGSTOP stopped, ` +
          `and ${WEDGE_SUGGESTION}`,
      }
    if (p.mechanism === 'link-down' && !p.allowLinkDown)
      return {
        key: 'mechanism',
        why: `${label('mechanism')} link-down needs ${label('allowLinkDown')}: ${LINK_DOWN_WARNING}`,
      }
    if (p.allowLinkDown && p.mechanism !== 'auto' && p.mechanism !== 'link-down')
      return {
        key: 'allowLinkDown',
        why: `applies ${label('allowLinkDown')} to ${label('mechanism')} auto or link-down only`,
      }
    return undefined
  },

  footprint(p, ctx) {
    const gpu = p.gpu!
    if (p.mechanism === 'sigstop')
      return {
        exclusive: `SIGSTOP wedges the instance of GPU ${gpu} (refused by stall-kv when planned: use wedge-rank)`,
        gpus: [gpu],
        ports: [],
        queue: 'inflight',
      }
    if (p.mechanism === 'link-down' || p.allowLinkDown)
      return {
        exclusive: `may take GPU ${gpu}'s NIC down: ${LINK_DOWN_WARNING}`,
        gpus: [gpu],
        ports: [],
        queue: 'inflight',
      }
    const tcp =
      p.mechanism === 'packet-filter' ||
      p.mechanism === 'twin-failpoint' ||
      (p.mechanism === 'auto' && ctx.autoMechanism === 'packet-filter')
    if (tcp) return {gpus: [gpu], ports: [`kv:${gpu}`], queue: 'inflight'}
    if (p.mechanism === 'auto' && ctx.autoMechanism === undefined) {
      return {
        exclusive:
          `its mechanism follows the data path, unknown when planning (a NIC-wide drop reaches every GPU ` +
          `sharing GPU ${gpu}'s NIC)`,
        gpus: [gpu],
        ports: [],
        queue: 'inflight',
      }
    }
    // A drop on the GPU's NIC: on a rail-optimized host no other GPU shares it (the plan names any that do).
    return {gpus: [gpu], ports: [`kv:${gpu}`, `nic-of-gpu:${gpu}`], queue: 'inflight'}
  },

  async gather(host: Host, discovery, params, opts = {}): Promise<HostFacts> {
    if (params.mechanism === 'sigstop') throw sigstopRefused()
    if (params.mechanism === 'twin-failpoint') return {}
    const timeoutMs = opts.timeoutMs ?? 5000
    const facts: HostFacts = {}
    const path = classifyDataPath(discovery.transport)
    if (path.kind === 'tcp') {
      const t = await detectFilterTool(host, timeoutMs)
      facts.filterTool = t.tool
      facts.filterEvidence = t.evidence
      const ss = await host.run(SS_ARGV, {timeoutMs, sudo: true})
      if (ss.code !== 0)
        throw badInput(
          `\`ss -tnpH\` failed on ${host.describe()}: ${oneLine(ss.stderr) || `exit ${ss.code}`}`,
          'install iproute2 (ss) on the host',
        )
      facts.connections = parseSsConnections(ss.stdout)
      return facts
    }
    // Off TCP: the GPU's NIC(s) by PCIe affinity, and the twin's rail interface where it states one.
    const names = new Map<string, {label: string; device?: string}>()
    const gpuNics = discovery.topology ? nicsOfGpu(discovery.topology, params.gpu!) : undefined
    if (gpuNics?.ok) for (const n of gpuNics.nics) names.set(n.device ?? n.label, n)
    const rail = discovery.transport.rails?.find(r => r.gpu === params.gpu)
    if (rail && !names.has(rail.interface))
      names.set(rail.interface, {label: `rail of GPU ${params.gpu}`, device: rail.interface})
    facts.nics = names.size
      ? await gatherNics(host, [...names.values()], {timeoutMs, linkDown: params.allowLinkDown === true})
      : []
    if (facts.nics.some(n => !n.rdmaDevice && n.netdev)) {
      const t = await detectFilterTool(host, timeoutMs)
      facts.filterTool = t.tool
      facts.filterEvidence = t.evidence
    }
    return facts
  },

  plan(ctx: FaultContext<StallKvParams>): FaultPlan {
    checkLeaseId(ctx.leaseId)
    const {params, discovery} = ctx
    if (params.mechanism === 'sigstop') throw sigstopRefused()
    const rank = rankOnGpu(discovery, params.gpu!)
    const path = classifyDataPath(discovery.transport)
    const twinUrl = discovery.twinFailpointUrl
    if (params.mechanism === 'twin-failpoint') {
      if (!twinUrl)
        throw badInput(
          "--mechanism twin-failpoint works only against pdchaos's twin, and this prefill is not it",
          'use --mechanism auto',
        )
      return twinFailpointPlan(ctx, rank, twinUrl, [])
    }
    if (path.kind === 'tcp') {
      if (params.mechanism === 'tc-flower' || params.mechanism === 'link-down') {
        throw badInput(
          `--mechanism ${params.mechanism} is for a hardware RDMA NIC, and GPU ${params.gpu}'s KV is kernel TCP ` +
            `(${path.evidence})`,
          "use --mechanism auto (netfilter on the rank's KV connections)",
        )
      }
      if (!ctx.facts.filterTool && twinUrl && params.mechanism === 'auto') {
        return twinFailpointPlan(ctx, rank, twinUrl, [
          `packet filter not usable here (${ctx.facts.filterEvidence ?? 'not probed'}): using the twin's own ` +
            `failure point instead`,
        ])
      }
      return packetFilterPlan(ctx, rank, path.evidence)
    }
    return nicPlan(ctx, rank, path)
  },
}

function sigstopRefused(): Error {
  return badInput(`stall-kv refuses --mechanism sigstop: ${SIGSTOP_REFUSAL}`, WEDGE_SUGGESTION)
}

function twinFailpointPlan(
  ctx: FaultContext<StallKvParams>,
  rank: RankInfo,
  url: string,
  refusals: string[],
): FaultPlan {
  if (rank.service !== 'prefill')
    throw badInput(
      `the twin's stall-kv failure point holds a prefill rank's KV writes; GPU ${ctx.params.gpu} ` +
        `is ${describeRank(rank)}`,
      'pick --gpu of a prefill rank',
    )
  const fp = buildTwinFailpoint(url, 'stall-kv', [rank.tpRank])
  return {
    fault: 'stall-kv',
    mechanism: 'twin-failpoint',
    leaseId: ctx.leaseId,
    targets: [
      {service: 'prefill', tpRank: rank.tpRank, pid: rank.pid, ...(rank.gpu === undefined ? {} : {gpu: rank.gpu})},
    ],
    inject: fp.inject,
    revert: fp.revert,
    sudo: false,
    verifyInjected: [fp.verifyInjected],
    verifyClean: [fp.verifyClean],
    readOnlyProbes: fp.readOnlyProbes,
    description:
      `${fp.summary}: ${describeRank(rank)} holds its KV writes, so rooms being transferred stay Transferring ` +
      `while the schedulers run. ` +
      "This is the twin's failure point, not a host mechanism: it exists only on the twin.",
    ...(refusals.length ? {refusals} : {}),
  }
}

function targetOf(rank: RankInfo, extra: Record<string, unknown> = {}) {
  return {
    service: rank.service,
    tpRank: rank.tpRank,
    pid: rank.pid,
    ...(rank.startTicks === undefined ? {} : {startTicks: rank.startTicks}),
    ...(rank.gpu === undefined ? {} : {gpu: rank.gpu}),
    ...extra,
  }
}

function packetFilterPlan(ctx: FaultContext<StallKvParams>, rank: RankInfo, pathEvidence: string): FaultPlan {
  if (!ctx.facts.connections)
    throw badInput('no connection listing was gathered for the plan', 'run gather() before plan()')
  const conns = dataConnectionsOf(rank, ctx.discovery, ctx.facts.connections)
  if (conns.length === 0) {
    throw badInput(
      `no open KV data connection of ${describeRank(rank)} (ss shows none besides ZMQ and service ports)`,
      'send one request through the deployment first (data connections open on first use)',
    )
  }
  if (!ctx.facts.filterTool) throw noFilterTool(ctx.facts.filterEvidence)
  const filter = buildFilter({
    tool: ctx.facts.filterTool,
    leaseId: ctx.leaseId,
    matches: conns.map(c => ({kind: 'flow', a: c.local, b: c.peer})),
  })
  const peers = conns.map(c => c.peerRank).filter((r): r is RankInfo => r !== undefined)
  return {
    fault: 'stall-kv',
    mechanism: 'packet-filter',
    leaseId: ctx.leaseId,
    targets: [targetOf(rank, {connections: conns.map(c => ({local: c.local, peer: c.peer}))})],
    inject: filter.inject,
    revert: filter.revert,
    sudo: true,
    verifyInjected: [filter.verifyInjected],
    verifyClean: [filter.verifyClean],
    readOnlyProbes: [...filter.readOnlyProbes, SS_ARGV],
    description:
      `stall the KV data path of ${describeRank(rank)}: drop both directions of ${conns.length} TCP connection(s)` +
      `${
        peers.length ? ` to ${[...new Set(peers.map(p => `${p.service} ` + `TP${p.tpRank}`))].join(', ')}` : ''
      }; ${filter.summary}. ` +
      'Rooms being transferred stay Transferring (prefill inflight queue); the schedulers keep running.',
    notes: [
      `data path: ${pathEvidence}`,
      `packet filter: ${ctx.facts.filterEvidence ?? ctx.facts.filterTool}`,
      'expected outcome: the kernel keeps retransmitting a dropped TCP segment for minutes ' +
        '(net.ipv4.tcp_retries2), so the pins wait for the watchdog; a transport error would be judged unverified',
    ],
  }
}

// ---------------------------------------------------------------- off TCP: the GPU's NIC

/** No stall mechanism: exit 2, saying what was found and what would make one possible. */
function noMechanism(gpu: number, why: string, fix: string): Error {
  return badInput(`no way to stall GPU ${gpu}'s KV transfer here: ${why}`, fix)
}

type NicPlanInputs = {
  gpu: number
  nics: NicFacts[]
  topo: GpuNics | undefined
  /** The plan's notes so far; each step appends what it found. */
  notes: string[]
  expected: StallExpectation | undefined
}

function nicPlan(ctx: FaultContext<StallKvParams>, rank: RankInfo, path: DataPath): FaultPlan {
  const {params, discovery} = ctx
  const gpu = params.gpu!
  const rail = discovery.transport.rails?.find(r => r.gpu === gpu)
  const expected = stallExpectation(ctx, rank)
  const inputs: NicPlanInputs = {
    gpu,
    nics: ctx.facts.nics ?? [],
    topo: discovery.topology ? nicsOfGpu(discovery.topology, gpu) : undefined,
    notes: [`data path: ${path.evidence}`, ...expectationNotes(expected)],
    expected,
  }
  // The twin's rail: kernel UDP on the GPU's own interface, as the twin states and the host confirms (no RDMA device).
  if (rail) return railPlan(ctx, rank, rail, railNic(ctx, rail, inputs), inputs)
  const {chosen, layers} = rdmaNicsOfGpu(ctx, path, inputs)
  return rdmaPlan(ctx, rank, chosen, layers, inputs)
}

/** The twin's rail interface on the host, checked to carry kernel UDP (no RDMA device) and the mechanism to fit. */
function railNic(ctx: FaultContext<StallKvParams>, rail: TwinRail, inputs: NicPlanInputs): NicFacts {
  const {params} = ctx
  const {gpu, nics, topo, notes} = inputs
  const nic = nics.find(n => n.netdev === rail.interface || n.legend === rail.interface)
  if (!nic?.netdev)
    throw noMechanism(
      gpu,
      `the twin states GPU ${gpu}'s rail is ${rail.interface}, but the host has no such interface ` +
        `(${nic?.evidence.join('; ') ?? 'not probed'})`,
      'bring the twin up with `pdchaos sim up --rail-nics`, or check the interface names',
    )
  if (nic.rdmaDevice) {
    throw noMechanism(
      gpu,
      `${rail.interface} has an RDMA device (${nic.rdmaDevice}): its traffic is hardware RoCE, which netfilter ` +
        `never sees, whatever the twin states`,
      'stall it with --mechanism tc-flower where the NIC offloads tc, or --allow-link-down',
    )
  }
  if (nic.rdmaUnknown)
    notes.push(
      `${rail.interface}: sysfs does not show this network namespace, so no RDMA device could be ruled out; the ` +
        `twin states its KV is kernel UDP`,
    )
  if (params.mechanism === 'tc-flower' || params.mechanism === 'link-down') {
    throw badInput(
      `--mechanism ${params.mechanism} is for a hardware RDMA NIC; GPU ${gpu}'s rail ${rail.interface} carries ` +
        `kernel UDP, which netfilter stalls exactly`,
      'use --mechanism auto',
    )
  }
  if (topo?.ok && !topo.nics.some(n => n.device === rail.interface)) {
    notes.push(
      `nvidia-smi topo -m names ${topo.nics.map(n => n.device ?? n.label).join(', ')} for GPU ${gpu}, the twin ` +
        `states ${rail.interface}: using the twin's statement`,
    )
  } else if (topo?.ok) {
    notes.push(topo.evidence)
  }
  return nic
}

/** A netfilter drop of the rail's UDP port (or, without a packet filter, the twin's own failure point). */
function railPlan(
  ctx: FaultContext<StallKvParams>,
  rank: RankInfo,
  rail: TwinRail,
  nic: NicFacts,
  inputs: NicPlanInputs,
): FaultPlan {
  const {params, discovery} = ctx
  const {gpu, notes, expected} = inputs
  if (!ctx.facts.filterTool) {
    if (discovery.twinFailpointUrl && params.mechanism === 'auto') {
      return {
        ...twinFailpointPlan(ctx, rank, discovery.twinFailpointUrl, [
          `packet filter not usable here (${ctx.facts.filterEvidence ?? 'not probed'}): using the twin's own ` +
            `failure point instead`,
        ]),
        ...(expected ? {expected} : {}),
        notes,
      }
    }
    throw noFilterTool(ctx.facts.filterEvidence)
  }
  const filter = buildFilter({
    tool: ctx.facts.filterTool,
    leaseId: ctx.leaseId,
    matches: [{kind: 'iface-udp', iface: rail.interface, port: rail.udpPort}],
  })
  return {
    fault: 'stall-kv',
    mechanism: 'packet-filter',
    leaseId: ctx.leaseId,
    targets: [targetOf(rank, {nic: rail.interface})],
    inject: filter.inject,
    revert: filter.revert,
    sudo: true,
    verifyInjected: [filter.verifyInjected],
    verifyClean: [filter.verifyClean],
    readOnlyProbes: [...filter.readOnlyProbes, ['ip', '-j', 'link', 'show', 'dev', rail.interface]],
    description:
      `stall GPU ${gpu}'s rail NIC ${rail.interface} (the twin's kernel UDP stand-in for RoCEv2): drop ` +
      `UDP ${rail.udpPort} in and out of it; ${filter.summary}. ` +
      `${describeRank(rank)}'s transfers stop making progress while the schedulers run.`,
    notes: [
      ...notes,
      `${nic.evidence.join('; ')}`,
      `packet filter: ${ctx.facts.filterEvidence ?? ctx.facts.filterTool}`,
      ...(ctx.facts.filterTool === 'iptables'
        ? ["the iptables fallback drops IPv4 only (the twin's rails are IPv4)"]
        : []),
    ],
    ...(expected ? {expected} : {}),
  }
}

/** The GPU's RDMA NICs by PCIe affinity, each shown to be RDMA with a netdev (or InfiniBand), and their link layers. */
function rdmaNicsOfGpu(
  ctx: FaultContext<StallKvParams>,
  path: DataPath,
  inputs: NicPlanInputs,
): {chosen: NicFacts[]; layers: Set<NicFacts['linkLayer']>} {
  const {params, discovery} = ctx
  const {gpu, nics, topo, notes} = inputs
  if (params.mechanism === 'packet-filter')
    throw badInput(
      `${RDMA_REFUSAL} (${path.evidence})`,
      "use --mechanism auto (tc flower on the GPU's NIC where it offloads tc)",
    )
  if (!discovery.topology) {
    throw noMechanism(
      gpu,
      `the data path is not kernel TCP (${path.evidence}) and the GPU's NIC is unknown ` +
        `(${discovery.topologyError ?? 'nvidia-smi topo -m was not read'})`,
      'run the KV over TCP (UCX_TLS=tcp, MC_FORCE_TCP=1) for a packet filter, or make `nvidia-smi topo -m` answer ' +
        "on the host so pdchaos can find the GPU's NIC",
    )
  }
  if (!topo?.ok) {
    throw noMechanism(
      gpu,
      `the data path is not kernel TCP (${path.evidence}) and ${topo?.evidence ?? 'no NIC is known'}`,
      'run the KV over TCP (UCX_TLS=tcp, MC_FORCE_TCP=1) for a packet filter, or give the GPU a NIC on its own ' +
        'PCIe switch (PIX/PXB)',
    )
  }
  notes.push(topo.evidence)
  if (topo.sharedWithGpus.length)
    notes.push(`GPU(s) ${topo.sharedWithGpus.join(', ')} share that NIC: their KV stalls too`)
  const chosen = topo.nics.map(t => nics.find(n => n.label === t.label)).filter((n): n is NicFacts => n !== undefined)
  if (chosen.length !== topo.nics.length)
    throw noMechanism(
      gpu,
      `the host did not describe ${topo.nics.map(n => n.label).join(', ')}`,
      'run gather() before plan()',
    )
  // Without a twin's statement, a netdev that is not (or cannot be shown to be) an RDMA NIC carries nothing we can
  // stall.
  const kernelOnly = chosen.filter(n => !n.rdmaDevice)
  if (kernelOnly.length) {
    throw noMechanism(
      gpu,
      `${kernelOnly.map(n => n.evidence.join('; ')).join('; ')}, yet the data path is RDMA (${path.evidence}) and ` +
        `nothing states that the KV crosses it as kernel traffic`,
      'run the KV over TCP (UCX_TLS=tcp, MC_FORCE_TCP=1) for a packet filter on its connections',
    )
  }
  const noNetdev = chosen.filter(n => !n.netdev && n.linkLayer !== 'InfiniBand')
  if (noNetdev.length)
    throw noMechanism(
      gpu,
      `${noNetdev.map(n => `${n.rdmaDevice} has no netdev`).join(', ')}`,
      "check the RDMA device's netdev (/sys/class/infiniband/<dev>/device/net)",
    )
  const layers = new Set(chosen.map(n => n.linkLayer))
  if (layers.size !== 1)
    throw noMechanism(
      gpu,
      `its NICs mix link layers (${[...layers].join(', ')})`,
      'pick a GPU whose NICs are all RoCE or all InfiniBand',
    )
  return {chosen, layers}
}

/** By link layer: a tc flower drop on RoCE (or its link down, when allowed), an InfiniBand port disabled. */
function rdmaPlan(
  ctx: FaultContext<StallKvParams>,
  rank: RankInfo,
  chosen: NicFacts[],
  layers: Set<NicFacts['linkLayer']>,
  inputs: NicPlanInputs,
): FaultPlan {
  const {params} = ctx
  const {gpu, notes, expected} = inputs
  const layer = [...layers][0]
  const evidence = chosen.flatMap(n => n.evidence)

  if (layer === 'Ethernet') {
    const support = chosen.map(n => ({n, s: tcFlowerSupport(n)}))
    const blocked = support.filter(x => !x.s.ok) as Array<{n: NicFacts; s: {ok: false; why: string; fix: string}}>
    if (blocked.length === 0 && params.mechanism !== 'link-down')
      return tcPlan(ctx, rank, chosen, [...notes, ...evidence], expected)
    const why = blocked.map(b => b.s.why).join('; ')
    if (params.mechanism === 'tc-flower')
      throw noMechanism(gpu, `--mechanism tc-flower: ${why}`, blocked.map(b => b.s.fix).join('; '))
    if (!params.allowLinkDown) {
      throw noMechanism(
        gpu,
        `GPU ${gpu}'s NIC is RoCE and ${why}: a tc flower drop cannot be offloaded, and netfilter never sees ` +
          `hardware RoCE`,
        `${blocked.map(b => b.s.fix).join('; ')}. --allow-link-down would take the NIC down ` +
          `instead: ${LINK_DOWN_WARNING}`,
      )
    }
    const refusals = params.mechanism === 'link-down' ? [] : [`tc-flower refused: ${why}`]
    return linkDownPlan(ctx, rank, chosen, [...notes, ...evidence], refusals, expected)
  }
  if (layer === 'InfiniBand') {
    if (params.mechanism === 'tc-flower')
      throw noMechanism(
        gpu,
        'its NIC is InfiniBand: tc and netfilter never see InfiniBand traffic',
        `--allow-link-down disables the HCA port instead (${LINK_DOWN_WARNING})`,
      )
    if (!params.allowLinkDown) {
      throw noMechanism(
        gpu,
        `GPU ${gpu}'s NIC is InfiniBand (${chosen.map(n => n.rdmaDevice).join(', ')}): no per-flow filter exists ` +
          `for it (tc and netfilter never see its traffic); the only stall is disabling the port`,
        `--allow-link-down disables the port with ibportstate: ${LINK_DOWN_WARNING}, IPoIB and the subnet ` +
          `manager's view of the port included`,
      )
    }
    const noTool = chosen.filter(n => !n.ibportstate)
    if (noTool.length)
      throw noMechanism(
        gpu,
        `ibportstate is not installed (${noTool.map(n => n.rdmaDevice).join(', ')})`,
        'install infiniband-diags (rdma-core) on the host',
      )
    return ibPlan(ctx, rank, chosen, [...notes, ...evidence], expected)
  }
  throw noMechanism(
    gpu,
    `its NIC's link layer is ${layer ?? 'unknown'} (${evidence.join('; ')})`,
    'a RoCE (Ethernet) or InfiniBand NIC, or the KV over TCP',
  )
}

function tcPlan(
  ctx: FaultContext<StallKvParams>,
  rank: RankInfo,
  nics: NicFacts[],
  notes: string[],
  expected: StallExpectation | undefined,
): FaultPlan {
  const plans = nics.map(n => buildTcFlower(n, ctx.leaseId))
  return {
    fault: 'stall-kv',
    mechanism: 'tc-flower',
    leaseId: ctx.leaseId,
    targets: [targetOf(rank, {nic: nics.map(n => n.netdev).join(',')})],
    inject: plans.flatMap(p => p.inject),
    revert: plans.flatMap(p => p.revert),
    sudo: true,
    verifyInjected: plans.map(p => p.verifyInjected),
    verifyClean: plans.map(p => p.verifyClean),
    readOnlyProbes: [...plans.flatMap(p => p.readOnlyProbes), ['sh', '-c', 'tc -V']],
    description:
      `stall GPU ${ctx.params.gpu}'s RoCE NIC${nics.length > 1 ? 's' : ''} in ` +
      `hardware: ${plans.map(p => p.summary).join('; ')}. ` +
      `${describeRank(rank)}'s transfers stop making progress while the schedulers run.`,
    notes,
    ...(expected ? {expected} : {}),
  }
}

function linkDownPlan(
  ctx: FaultContext<StallKvParams>,
  rank: RankInfo,
  nics: NicFacts[],
  notes: string[],
  refusals: string[],
  expected: StallExpectation | undefined,
): FaultPlan {
  const multipath = nics.flatMap(n => (n.routes ?? []).filter(r => r.multipath).map(r => `${n.netdev}: ${r.dst}`))
  if (multipath.length) {
    throw noMechanism(
      ctx.params.gpu!,
      `taking the NIC down would delete multipath route(s) pdchaos cannot rebuild (${multipath.join(', ')})`,
      'remove the multipath routes, or stall the GPU another way',
    )
  }
  const plans = nics.map(n => ({n, p: buildLinkDown(n), e: linkDownEffectProbes(n)}))
  return {
    fault: 'stall-kv',
    mechanism: 'link-down',
    leaseId: ctx.leaseId,
    targets: [targetOf(rank, {nic: nics.map(n => n.netdev).join(',')})],
    inject: plans.flatMap(x => x.p.inject),
    revert: plans.flatMap(x => x.p.revert),
    sudo: true,
    verifyInjected: plans.flatMap(x => [x.p.verifyInjected, ...x.e.injected]),
    verifyClean: plans.flatMap(x => [x.p.verifyClean, ...x.e.clean]),
    readOnlyProbes: plans.flatMap(x => x.p.readOnlyProbes),
    description:
      `take GPU ${ctx.params.gpu}'s NIC down ` +
      `(--allow-link-down): ${plans.map(x => x.p.summary).join('; ')}. ${LINK_DOWN_WARNING[0]!.toUpperCase()}` +
      `${LINK_DOWN_WARNING.slice(1)}.`,
    refusals,
    notes: [
      ...notes,
      `link down: ${LINK_DOWN_WARNING}; the kernel deletes the NIC's routes, which the revert puts back`,
    ],
    ...(expected ? {expected} : {}),
  }
}

function ibPlan(
  ctx: FaultContext<StallKvParams>,
  rank: RankInfo,
  nics: NicFacts[],
  notes: string[],
  expected: StallExpectation | undefined,
): FaultPlan {
  const plans = nics.map(n => buildIbPortDisable(n))
  return {
    fault: 'stall-kv',
    mechanism: 'ib-port-disable',
    leaseId: ctx.leaseId,
    targets: [targetOf(rank, {nic: nics.map(n => n.rdmaDevice).join(',')})],
    inject: plans.flatMap(p => p.inject),
    revert: plans.flatMap(p => p.revert),
    sudo: true,
    verifyInjected: plans.flatMap((p): Probe[] => [p.verifyInjected, p.effect]),
    verifyClean: plans.map(p => p.verifyClean),
    readOnlyProbes: plans.flatMap(p => p.readOnlyProbes),
    description:
      `disable GPU ${ctx.params.gpu}'s InfiniBand port (--allow-link-down): ${plans.map(p => p.summary).join('; ')}. ` +
      `It drops every flow on that port (IPoIB included), and the subnet manager sees the port go away.`,
    notes: [...notes, 'an InfiniBand port cannot be filtered per flow: disabling it is the only stall'],
    ...(expected ? {expected} : {}),
  }
}

// ---------------------------------------------------------------- what to expect

/**
 * The environment that sets the requester's limits: the prefill rank posts the WRITEs (NIXL) or the transfers
 * (Mooncake).
 */
function requesterEnv(d: FaultDiscovery, rank: RankInfo): {env: Record<string, string>; whose: string} {
  if (rank.service === 'prefill' && rank.env) return {env: rank.env, whose: describeRank(rank)}
  if (rank.service === 'decode') {
    const paired = pairedRanks(rank, d, undefined).ranks[0]
    if (paired?.env)
      return {
        env: paired.env,
        whose: `${describeRank(paired)} (the prefill rank that writes into ${rank.service} TP${rank.tpRank})`,
      }
  }
  const any = d.ranks.find(r => r.service === 'prefill' && r.env)
  if (any?.env) return {env: any.env, whose: describeRank(any)}
  return {env: d.transport.env ?? {}, whose: "the prefill server's first rank"}
}

const fmt = (s: number): string => (Number.isFinite(s) ? (s < 10 ? s.toFixed(2) : s.toFixed(1)) : '∞')

/**
 * Which outcome a stall of the GPU's KV leads to: UCX's RC transport fails a QP that made no progress for about
 * timeout × (retries + 1) (IBV_WC_RETRY_EXC_ERR, "Transport retry count exceeded"); Mooncake fails a transfer after
 * MC_TRANSFER_TIMEOUT. Compared with the watchdog deadline: the earlier of the two releases the pins.
 */
export function stallExpectation(
  ctx: Pick<FaultContext<StallKvParams>, 'discovery' | 'contract'>,
  rank: RankInfo,
): StallExpectation | undefined {
  const d = ctx.discovery
  const backend = d.transport.backend.toLowerCase()
  const deadline = ctx.contract?.deadlineSeconds
  const poll = ctx.contract?.pollSeconds ?? 0
  const {env, whose} = requesterEnv(d, rank)
  let range: [number, number]
  let limits: string
  let raise: string[]
  if (backend === 'mooncake') {
    const mc = mooncakeTimeoutFromEnv(env)
    range = [mc.seconds, mc.seconds]
    limits =
      `MC_TRANSFER_TIMEOUT ${mc.seconds} s ` +
      `(${mc.from === 'default' ? "Mooncake's documented default" : `${whose}`})`
    raise = ['MC_TRANSFER_TIMEOUT']
  } else if (backend === 'nixl') {
    const rc = rcLimitsFromEnv(env)
    range = rc.giveUpSeconds
    limits =
      `${rc.transport}: timeout ${rc.timeout.text} ` +
      `(${rc.timeout.from === 'default' ? 'UCX default' : rc.timeout.from}) -> QP ACK ` +
      `timeout ${fmt(rc.qpTimeout.seconds)} s, ` +
      `retry count ${rc.retryCount.value} ` +
      `(${rc.retryCount.from === 'default' ? 'UCX default' : rc.retryCount.from}), read ` +
      `from ${whose}${rc.warnings.length ? `; ${rc.warnings.join('; ')}` : ''}`
    raise = rc.settings
  } else {
    return undefined
  }
  const [low, high] = range
  const after = high
  let outcome: StallExpectation['outcome']
  let why: string
  if (deadline === undefined) {
    outcome = 'transport-error'
    why =
      `the transport fails a stalled transfer after about ${fmt(after)} s; no watchdog deadline was given to ` +
      `compare with`
  } else if (high < deadline) {
    outcome = 'transport-error'
    why =
      `a stall longer than about ${fmt(after)} s becomes a transport error, before the ${deadline} s watchdog ` +
      `deadline: the pins are released by the transport and the watchdog is not exercised ` +
      `(raise ${raise.slice(0, 2).join(' or ')})`
  } else if (low > deadline + poll) {
    outcome = 'watchdog'
    why =
      `the transport waits about ${fmt(after)} s before failing, longer than the ${deadline} s watchdog ` +
      `deadline (+ ${poll} s poll): the pins stay Transferring for the watchdog`
  } else {
    outcome = 'either'
    why =
      `the transport gives up after ${fmt(low)}-${fmt(high)} s, around the ${deadline} s watchdog deadline: ` +
      `either may release a pin first (raise ${raise.slice(0, 2).join(' or ')} to be sure)`
  }
  return {
    kind: 'stall',
    outcome,
    afterSeconds: Number.isFinite(after) ? Math.round(after * 1000) / 1000 : null,
    ...(Number.isFinite(high)
      ? {afterSecondsRange: [Math.round(low * 1000) / 1000, Math.round(high * 1000) / 1000] as [number, number]}
      : {}),
    ...(deadline === undefined ? {} : {deadlineSeconds: deadline}),
    limits,
    raise,
    why,
  }
}

function expectationNotes(e: StallExpectation | undefined): string[] {
  if (!e) return []
  return [`expected outcome: ${e.outcome} — ${e.why}`, `transport limits: ${e.limits}`]
}

export {ROCE_V2_UDP_PORT}
