import {z} from 'zod'

import type {RankInfo} from '../engines/sglang/discovery/discover.js'
import {badInput} from '../errors.js'
import type {Host} from '../hosts/host.js'
import {
  checkLeaseId,
  describeRank,
  type Fault,
  type FaultContext,
  type FaultPlan,
  type FaultTarget,
  type HostFacts,
} from './fault.js'
import {buildFilter, detectFilterTool, noFilterTool, type FilterMatch} from './mechanisms/packet-filter.js'
import {buildTwinFailpoint} from './mechanisms/twin-failpoint.js'

/**
 * drop-dest-info: decode's destination info (TransferInfo over ZMQ PUSH) and its ABORT never reach the prefill
 * ranks, because every packet to each prefill rank's ZMQ PULL port (from the bootstrap route) is dropped. The
 * request then sits in prefill's bootstrap queue at KVPoll.Bootstrapping. The control plane is ZMQ over kernel TCP
 * whatever the KV backend is, so this works on RDMA hosts too.
 */

const Params = z
  .object({
    rank: z
      .number()
      .int()
      .min(0)
      .max(1023)
      .optional()
      .describe('drop-dest-info: only this prefill TP rank (default: every prefill rank).'),
    mechanism: z
      .enum(['auto', 'packet-filter', 'twin-failpoint'])
      .default('auto')
      .describe(
        "drop-dest-info: how the fault is made: auto uses the host's packet filter, or the twin's own failure " +
          'point where none is usable (twin only).',
      ),
  })
  .strict()

export type DropDestInfoParams = z.infer<typeof Params>

export const dropDestInfo: Fault<DropDestInfoParams> = {
  name: 'drop-dest-info',
  summary: "decode's destination info and ABORT never reach prefill: requests stay Bootstrapping",
  params: Params,
  mechanisms: ['packet-filter', 'twin-failpoint'],
  observe: 'pins',
  // Decode's TransferInfo never arrives: SGLang keeps the request in its bootstrap queue at Bootstrapping
  // (python/sglang/srt/disaggregation/prefill.py, PrefillBootstrapQueue.pop_bootstrapped).
  pins: {queue: 'bootstrap', kvPoll: 'Bootstrapping'},
  // Decode sends its destination info to every prefill rank, on whatever node it runs: all of them lose it.
  onEveryNode: params => (params.rank === undefined ? 'prefill' : undefined),

  footprint(params) {
    return {gpus: [], ports: [params.rank === undefined ? 'zmq:all' : `zmq:${params.rank}`], queue: 'bootstrap'}
  },

  async gather(host: Host, _discovery, _params, opts = {}): Promise<HostFacts> {
    const t = await detectFilterTool(host, opts.timeoutMs)
    return {filterTool: t.tool, filterEvidence: t.evidence}
  },

  plan(ctx: FaultContext<DropDestInfoParams>): FaultPlan {
    checkLeaseId(ctx.leaseId)
    const {prefill, chosen} = chosenPrefillRanks(ctx)
    const twinUrl = ctx.discovery.twinFailpointUrl
    const mech = ctx.params.mechanism ?? 'auto'
    if (mech === 'twin-failpoint' && !twinUrl)
      throw badInput(
        "--mechanism twin-failpoint works only against pdchaos's twin, and this prefill is not it",
        'use --mechanism packet-filter',
      )
    if (mech === 'twin-failpoint' || (mech === 'auto' && !ctx.facts.filterTool && twinUrl))
      return twinPlan(ctx, chosen, twinUrl!, mech)
    return filterPlan(ctx, chosen, prefill)
  },
}

/** The prefill ranks (all, or the one asked for), each with the ZMQ port the bootstrap route gave. */
function chosenPrefillRanks(ctx: FaultContext<DropDestInfoParams>): {prefill: RankInfo[]; chosen: RankInfo[]} {
  const prefill = ctx.discovery.ranks.filter(r => r.service === 'prefill')
  if (prefill.length === 0)
    throw badInput('discovery found no prefill rank processes', 'check `pdchaos status`: is the prefill server up?')
  let chosen = prefill
  if (ctx.params.rank !== undefined) {
    chosen = prefill.filter(r => r.tpRank === ctx.params.rank)
    if (chosen.length === 0)
      throw badInput(
        `no prefill rank TP${ctx.params.rank} (prefill ranks: ${prefill.map(r => `TP${r.tpRank}`).join(', ')})`,
      )
    if (chosen.length > 1)
      throw badInput(
        `${chosen.length} prefill ranks are TP${ctx.params.rank} (data parallel?): ambiguous target`,
        'this fault supports DP size 1',
      )
  }
  const noPort = chosen.filter(r => r.zmqPort === undefined)
  if (noPort.length > 0) {
    // Dropping only some ranks' ports would let the others answer: a partial fault is no fault.
    throw badInput(
      `the bootstrap route gave no ZMQ port for ${noPort.map(describeRank).join(', ')}`,
      'wait until prefill has registered with its bootstrap server (GET /route answers), then retry',
    )
  }
  return {prefill, chosen}
}

/** The twin's own failure point: its ranks drop every frame decode sends. */
function twinPlan(
  ctx: FaultContext<DropDestInfoParams>,
  chosen: RankInfo[],
  twinUrl: string,
  mech: NonNullable<DropDestInfoParams['mechanism']>,
): FaultPlan {
  const fp = buildTwinFailpoint(
    twinUrl,
    'drop-dest-info',
    chosen.map(r => r.tpRank),
  )
  return {
    fault: 'drop-dest-info',
    mechanism: 'twin-failpoint',
    leaseId: ctx.leaseId,
    targets: chosen.map(r => ({service: 'prefill', tpRank: r.tpRank, pid: r.pid, ports: [r.zmqPort!]})),
    inject: fp.inject,
    revert: fp.revert,
    sudo: false,
    verifyInjected: [fp.verifyInjected],
    verifyClean: [fp.verifyClean],
    readOnlyProbes: fp.readOnlyProbes,
    description:
      `${fp.summary}: the ranks drop every frame decode sends (destination info and ABORT), as a packet filter ` +
      `on their ZMQ ports would. ` +
      "New requests stay in the prefill bootstrap queue at Bootstrapping. This is the twin's failure point, " +
      'not a host mechanism: it exists only on the twin.',
    ...(mech === 'auto'
      ? {
          refusals: [
            `packet filter not usable here (${ctx.facts.filterEvidence ?? 'not probed'}): using the twin's own ` +
              `failure point instead`,
          ],
        }
      : {}),
  }
}

/** A packet filter dropping all TCP to each chosen rank's ZMQ port. */
function filterPlan(ctx: FaultContext<DropDestInfoParams>, chosen: RankInfo[], prefill: RankInfo[]): FaultPlan {
  if (!ctx.facts.filterTool) throw noFilterTool(ctx.facts.filterEvidence)

  // By port alone, on every address: rank_ip may be 0.0.0.0, an alias or a NAT'd address, and a rule on the
  // wrong address would be a silent no-op. A ZMQ port is a random port bound by the rank, so nothing else uses it.
  const matches: FilterMatch[] = chosen.map(r => ({kind: 'to', port: r.zmqPort!}))
  const filter = buildFilter({tool: ctx.facts.filterTool, leaseId: ctx.leaseId, matches})
  const targets: FaultTarget[] = chosen.map(r => ({
    service: 'prefill',
    tpRank: r.tpRank,
    pid: r.pid,
    ...(r.startTicks === undefined ? {} : {startTicks: r.startTicks}),
    ...(r.gpu === undefined ? {} : {gpu: r.gpu}),
    ports: [r.zmqPort!],
  }))
  return {
    fault: 'drop-dest-info',
    mechanism: 'packet-filter',
    leaseId: ctx.leaseId,
    targets,
    inject: filter.inject,
    revert: filter.revert,
    sudo: true,
    verifyInjected: [filter.verifyInjected],
    verifyClean: [filter.verifyClean],
    readOnlyProbes: filter.readOnlyProbes,
    description:
      `drop all TCP to the ZMQ port ` +
      `of ${chosen
        .map(r => `prefill TP${r.tpRank} ` + `(${r.zmqHost ?? '*'}:${r.zmqPort})`)
        .join(', ')}; ${filter.summary}. ` +
      "New requests stay in the prefill bootstrap queue at Bootstrapping; decode's ABORT is dropped too.",
    notes: [
      `packet filter: ${ctx.facts.filterEvidence ?? ctx.facts.filterTool}`,
      ...(ctx.params.rank !== undefined && prefill.length > 1
        ? [
            `only TP${ctx.params.rank} of ${prefill.length} prefill ranks: the all-reduce (MIN) still holds ` +
              `every request at Bootstrapping`,
          ]
        : []),
    ],
  }
}
