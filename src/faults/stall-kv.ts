import {z} from 'zod'

import {buildTwinFailpoint} from './mechanisms/twin-failpoint.js'
import {badInput, oneLine} from '../errors.js'
import type {RankInfo} from '../discovery/discover.js'
import type {Host} from '../hosts/host.js'
import {checkLeaseId, describeRank, type Fault, type FaultContext, type FaultPlan, type HostFacts} from './fault.js'
import {classifyDataPath, dataConnectionsOf, pairedRanks, parseSsConnections, rankOnGpu, SS_ARGV} from './mechanisms/data-path.js'
import {buildFilter, detectFilterTool, noFilterTool} from './mechanisms/packet-filter.js'
import {checkIdentity} from './mechanisms/proc-identity.js'
import {buildSigstop} from './mechanisms/signals.js'

/**
 * stall-kv --gpu N: the KV transfer of the rank on GPU N stops making progress while the schedulers stay alive.
 * The mechanism follows the detected transport:
 * - packet-filter: drop both directions of that rank's KV data connections. Only where the data path is known
 *   to be kernel TCP (the twin; UCX's TCP lane); on RDMA it would be a silent no-op and is refused.
 * - sigstop: stop the rank (side prefill) or its paired decode rank (side decode), by pid + start time.
 */

const Params = z.object({
  gpu: z.number().int().min(0).max(1023).optional().describe('stall-kv: the GPU whose rank stalls (required).'),
  mechanism: z.enum(['auto', 'packet-filter', 'sigstop', 'twin-failpoint']).default('auto')
    .describe("stall-kv: how the stall is made: auto follows the detected transport (packet filter on a TCP data path); twin-failpoint is the twin's own."),
  side: z.enum(['prefill', 'decode']).optional().describe('stall-kv: with --mechanism sigstop, stop the prefill rank or its decode peer (default prefill).'),
}).strict()

export type StallKvParams = z.infer<typeof Params>
export type Side = 'prefill' | 'decode'

export const RDMA_REFUSAL = 'a packet filter cannot stall hardware RDMA: use --mechanism sigstop'

export const stallKv: Fault<StallKvParams> = {
  name: 'stall-kv',
  summary: 'the KV transfer of one GPU\'s rank stalls (packet filter on its TCP data path, or SIGSTOP)',
  params: Params,
  mechanisms: ['packet-filter', 'sigstop', 'twin-failpoint'],
  // A transfer that stops making progress leaves the room Transferring in prefill's inflight queue
  // (python/sglang/srt/disaggregation/prefill.py, process_disagg_prefill_inflight_queue).
  pins: {queue: 'inflight', kvPoll: 'Transferring'},

  refine(p, label) {
    if (p.gpu === undefined) return {key: 'gpu', why: `needs ${label('gpu')} N (pick the GPU from \`pdchaos status\`)`}
    if (p.side !== undefined && p.mechanism !== 'sigstop' && p.mechanism !== 'auto') return {key: 'side', why: `applies ${label('side')} to ${label('mechanism')} sigstop only`}
    return undefined
  },

  footprint(p, ctx) {
    const mech = p.mechanism === 'auto' ? (ctx.autoMechanism ?? 'sigstop') : p.mechanism
    if (mech === 'sigstop') return {exclusive: `SIGSTOP wedges the ${p.side ?? 'prefill'} instance of GPU ${p.gpu}`, gpus: [p.gpu!], ports: [], queue: 'inflight'}
    return {gpus: [p.gpu!], ports: [`kv:${p.gpu}`], queue: 'inflight'}
  },

  async gather(host: Host, _discovery, params, opts = {}): Promise<HostFacts> {
    const timeoutMs = opts.timeoutMs ?? 5000
    const facts: HostFacts = {}
    if (params.mechanism !== 'sigstop') {
      const t = await detectFilterTool(host, timeoutMs)
      facts.filterTool = t.tool
      facts.filterEvidence = t.evidence
    }
    // Connections are read for both mechanisms: they also tell which decode rank a prefill rank feeds.
    const ss = await host.run(SS_ARGV, {timeoutMs, sudo: true})
    if (ss.code !== 0) throw badInput(`\`ss -tnpH\` failed on ${host.describe()}: ${oneLine(ss.stderr) || `exit ${ss.code}`}`, 'install iproute2 (ss) on the host')
    facts.connections = parseSsConnections(ss.stdout)
    return facts
  },

  plan(ctx: FaultContext<StallKvParams>): FaultPlan {
    checkLeaseId(ctx.leaseId)
    const {params, discovery} = ctx
    const rank = rankOnGpu(discovery, params.gpu!)
    const path = classifyDataPath(discovery.transport)
    const refusals: string[] = []
    let mechanism: 'packet-filter' | 'sigstop'
    const twinUrl = discovery.twinFailpointUrl
    if (params.mechanism === 'twin-failpoint' || (params.mechanism === 'auto' && path.kind === 'tcp' && !ctx.facts.filterTool && twinUrl)) {
      if (!twinUrl) throw badInput('--mechanism twin-failpoint works only against pdchaos\'s twin, and this prefill is not it', 'use --mechanism packet-filter or sigstop')
      return twinFailpointPlan(ctx, rank, twinUrl, params.mechanism === 'auto' ? [`packet filter not usable here (${ctx.facts.filterEvidence ?? 'not probed'}): using the twin's own failure point instead`] : [])
    }
    if (params.mechanism === 'packet-filter') {
      if (path.kind !== 'tcp') throw badInput(`${RDMA_REFUSAL} (${path.evidence})`, 'use --mechanism sigstop --side prefill|decode')
      mechanism = 'packet-filter'
    } else if (params.mechanism === 'sigstop') {
      mechanism = 'sigstop'
    } else if (path.kind === 'tcp') {
      mechanism = 'packet-filter'
    } else {
      mechanism = 'sigstop'
      refusals.push(`packet-filter refused: ${RDMA_REFUSAL} (${path.evidence})`)
    }
    return mechanism === 'packet-filter' ? packetFilterPlan(ctx, rank, path.evidence, refusals) : sigstopPlan(ctx, rank, path.evidence, refusals)
  },
}

function twinFailpointPlan(ctx: FaultContext<StallKvParams>, rank: RankInfo, url: string, refusals: string[]): FaultPlan {
  if (rank.service !== 'prefill') throw badInput(`the twin's stall-kv failure point holds a prefill rank's KV writes; GPU ${ctx.params.gpu} is ${describeRank(rank)}`, 'pick --gpu of a prefill rank')
  const fp = buildTwinFailpoint(url, 'stall-kv', [rank.tpRank])
  return {
    fault: 'stall-kv', mechanism: 'twin-failpoint', leaseId: ctx.leaseId,
    targets: [{service: 'prefill', tpRank: rank.tpRank, pid: rank.pid, ...(rank.gpu === undefined ? {} : {gpu: rank.gpu})}],
    inject: fp.inject, revert: fp.revert, sudo: false, verifyInjected: [fp.verifyInjected], verifyClean: [fp.verifyClean], readOnlyProbes: fp.readOnlyProbes,
    description: `${fp.summary}: ${describeRank(rank)} holds its KV writes, so rooms being transferred stay Transferring while the schedulers run. ` +
      'This is the twin\'s failure point, not a host mechanism: it exists only on the twin.',
    ...(refusals.length ? {refusals} : {}),
  }
}

function packetFilterPlan(ctx: FaultContext<StallKvParams>, rank: RankInfo, pathEvidence: string, refusals: string[]): FaultPlan {
  if (!ctx.facts.connections) throw badInput('no connection listing was gathered for the plan', 'run gather() before plan()')
  const conns = dataConnectionsOf(rank, ctx.discovery, ctx.facts.connections)
  if (conns.length === 0) {
    throw badInput(`no open KV data connection of ${describeRank(rank)} (ss shows none besides ZMQ and service ports)`,
      'send one request through the deployment first (data connections open on first use), or use --mechanism sigstop')
  }
  if (!ctx.facts.filterTool) throw noFilterTool(ctx.facts.filterEvidence)
  const filter = buildFilter({
    tool: ctx.facts.filterTool, leaseId: ctx.leaseId,
    matches: conns.map((c) => ({kind: 'flow', a: c.local, b: c.peer})),
  })
  const peers = conns.map((c) => c.peerRank).filter((r): r is RankInfo => r !== undefined)
  return {
    fault: 'stall-kv',
    mechanism: 'packet-filter',
    leaseId: ctx.leaseId,
    targets: [{
      service: rank.service, tpRank: rank.tpRank, pid: rank.pid,
      ...(rank.startTicks === undefined ? {} : {startTicks: rank.startTicks}), ...(rank.gpu === undefined ? {} : {gpu: rank.gpu}),
      connections: conns.map((c) => ({local: c.local, peer: c.peer})),
    }],
    inject: filter.inject,
    revert: filter.revert,
    sudo: true,
    verifyInjected: [filter.verifyInjected],
    verifyClean: [filter.verifyClean],
    readOnlyProbes: [...filter.readOnlyProbes, SS_ARGV],
    description: `stall the KV data path of ${describeRank(rank)}: drop both directions of ${conns.length} TCP connection(s)` +
      `${peers.length ? ` to ${[...new Set(peers.map((p) => `${p.service} TP${p.tpRank}`))].join(', ')}` : ''}; ${filter.summary}. ` +
      'Rooms being transferred stay Transferring (prefill inflight queue); the schedulers keep running.',
    ...(refusals.length ? {refusals} : {}),
    notes: [`data path: ${pathEvidence}`, `packet filter: ${ctx.facts.filterEvidence ?? ctx.facts.filterTool}`,
      ...(ctx.params.side !== undefined ? ['--side applies to sigstop only; the packet filter cuts both directions'] : [])],
  }
}

function sigstopPlan(ctx: FaultContext<StallKvParams>, rank: RankInfo, pathEvidence: string, refusals: string[]): FaultPlan {
  const side = ctx.params.side ?? 'prefill'
  let target = rank
  const notes = [`data path: ${pathEvidence}`]
  if (rank.service !== side) {
    const paired = pairedRanks(rank, ctx.discovery, ctx.facts.connections)
    if (paired.ranks.length === 0) throw badInput(`cannot tell which ${side} rank is paired with ${describeRank(rank)}: ${paired.evidence}`, `send one request first, or pick --gpu of a ${side} rank`)
    if (paired.ranks.length > 1) {
      throw badInput(`${describeRank(rank)} is paired with ${paired.ranks.length} ${side} ranks (${paired.ranks.map(describeRank).join(', ')}): ambiguous target`,
        `pick --gpu of one of those ${side} ranks with --side ${side}`)
    }
    target = paired.ranks[0]!
    notes.push(`pairing: ${paired.evidence}`)
  }
  const label = describeRank(target)
  const id = checkIdentity(target, label)
  const stop = buildSigstop(id, label)
  if (side === 'decode') {
    notes.push('a stopped decode rank is a receiver stall: one-sided RDMA writes into its memory still complete on real hardware, and its own timeouts stop too')
  }
  return {
    fault: 'stall-kv',
    mechanism: 'sigstop',
    leaseId: ctx.leaseId,
    targets: [{service: target.service, tpRank: target.tpRank, pid: id.pid, startTicks: id.startTicks, ...(target.gpu === undefined ? {} : {gpu: target.gpu})}],
    inject: stop.inject,
    revert: stop.revert,
    sudo: true,
    verifyInjected: [stop.verifyInjected],
    verifyClean: [stop.verifyClean],
    readOnlyProbes: stop.readOnlyProbes,
    description: `${stop.summary}. The ${target.service} instance wedges in its all-reduce (every rank waits for the stopped one); ` +
      `rooms in flight stay ${side === 'prefill' ? 'Transferring/WaitingForInput' : 'Transferring'}.`,
    ...(refusals.length ? {refusals} : {}),
    notes,
  }
}
