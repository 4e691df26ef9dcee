import {z} from 'zod'

import type {RankInfo} from '../engines/sglang/discovery/discover.js'
import {badInput, oneLine} from '../errors.js'
import {sleep} from '../util/time.js'
import type {Host} from '../hosts/host.js'
import {
  type AbortTrial,
  checkLeaseId,
  describeRank,
  type Fault,
  type FaultContext,
  type FaultDiscovery,
  type FaultPlan,
  type HostFacts,
  type TransferWindow,
} from './fault.js'
import {classifyDataPath, dataConnectionsOf, parseSsConnections, rankOnGpu, SS_ARGV} from './mechanisms/data-path.js'
import {buildFilter, detectFilterTool, noFilterTool} from './mechanisms/packet-filter.js'
import {buildTwinFailpoint} from './mechanisms/twin-failpoint.js'

/**
 * abort-mid-transfer: N trials, each a request with pdchaos's own rid and `POST /abort_request {rid}` fired on
 * prefill AND decode (--side both, the gateway's way; or on one side only: prefill alone shows whether prefill's own
 * abort path releases a Transferring request, with no ABORT from decode to rescue it) at an offset inside the
 * transfer window: a sweep planned from the calibration the runner measured on unfaulted requests (an input to
 * plan(), never patched afterwards). On a TCP data path the window is widened by holding one prefill rank's KV
 * connections still (or rate-limiting them with nft `limit rate`); tc
 * would slow the whole device (every service on loopback), not one connection, so it is not used. Elsewhere
 * nothing on the host changes and the sweep covers the deployment's own window.
 */

export const MAX_TRIALS = 200

const Params = z
  .object({
    trials: z.number().int().min(1).max(MAX_TRIALS).default(10).describe('abort-mid-transfer: number of trials.'),
    gpu: z
      .number()
      .int()
      .min(0)
      .max(1023)
      .optional()
      .describe(
        "abort-mid-transfer: widen the transfer window on this GPU's rank (default on a TCP data path: the first " +
          'prefill GPU).',
      ),
    widenKBytesPerSecond: z
      .number()
      .int()
      .min(0)
      .max(10_000_000)
      .optional()
      .describe(
        "abort-mid-transfer: rate-limit --gpu's KV connections to this many kB/s (0, the default on a TCP data " +
          'path, holds the transfer still).',
      ),
    side: z
      .enum(['prefill', 'decode', 'both'])
      .default('both')
      .describe(
        'abort-mid-transfer: where each abort goes: both (as the gateway does when a client goes away), prefill ' +
          'alone (its own abort path, no ABORT from decode to rescue it) or decode alone (its ABORT over ZMQ is what ' +
          'releases prefill).',
      ),
  })
  .strict()

export type AbortMidTransferParams = z.infer<typeof Params>

export type AbortSide = AbortMidTransferParams['side']

/** The services a trial's abort goes to. */
export const servicesOfSide = (side: AbortSide): Array<'prefill' | 'decode'> =>
  side === 'both' ? ['prefill', 'decode'] : [side]

/** "prefill and decode", "prefill alone", "decode alone". */
export const describeSide = (side: AbortSide): string => (side === 'both' ? 'prefill and decode' : `${side} alone`)

/**
 * SGLang's scheduler aborts by rid PREFIX: no trial's rid may be a prefix of another's (or of another lease's).
 * ':' cannot occur in a lease id and the trial number has a fixed width, so none is.
 */
export function trialRid(leaseId: string, index: number): string {
  return `pdchaos-abort:${leaseId}:${String(index).padStart(3, '0')}`
}

/** Offsets swept evenly from start to end inclusive (one trial: the middle), rounded to 0.1 ms. */
export function sweepOffsets(n: number, startMs: number, endMs: number): number[] {
  if (n === 1) return [Math.round(((startMs + endMs) / 2) * 10) / 10]
  return Array.from({length: n}, (_, i) => Math.round((startMs + ((endMs - startMs) * i) / (n - 1)) * 10) / 10)
}

/** Widening on a TCP data path unless told otherwise: hold one prefill rank's KV connections still, so the sweep
 * lands inside Transferring rather than around a sub-millisecond transfer. No widening where the path is not TCP. */
export function wideningOf(
  p: AbortMidTransferParams,
  d: FaultDiscovery,
): {gpu: number; kbytesPerSecond: number} | undefined {
  if (p.widenKBytesPerSecond !== undefined) return {gpu: p.gpu!, kbytesPerSecond: p.widenKBytesPerSecond}
  if (classifyDataPath(d.transport).kind !== 'tcp') return undefined
  const gpu = p.gpu ?? d.ranks.find((r: RankInfo) => r.service === 'prefill' && r.gpu !== undefined)?.gpu
  return gpu === undefined ? undefined : {gpu, kbytesPerSecond: DEFAULT_WIDEN_KBYTES}
}

/** Widening by default holds the transfer still (0 kB/s): on loopback one KV segment can be the whole transfer,
 * so a rate limit cannot stretch it. */
export const DEFAULT_WIDEN_KBYTES = 0

/** The transfer window aborts sweep, ms after send, from the calibrated prefill time (nominal 50 ms without one). */
export function transferWindow(
  ctx: Pick<FaultContext<AbortMidTransferParams>, 'calibration' | 'contract'>,
  widened: boolean,
): {startMs: number; endMs: number; why: string} {
  const p = ctx.calibration?.prefillMs ?? 50
  if (!widened)
    return {
      startMs: Math.round(Math.max(0, p * 0.6)),
      endMs: Math.round(Math.max(p, 3)),
      why: 'around the calibrated prefill time',
    }
  // Held (or slowed): every request sits in Transferring once its forward is done, for as long as the watchdog
  // leaves it alone, so the window runs from the prefill time for a share of the deadline (at most 1 s). It opens
  // one spread past the median prefill time: at the median itself, half the requests are still being prefilled,
  // and an abort there meets the waiting queue, not a transfer.
  const deadlineMs = (ctx.contract?.deadlineSeconds ?? 2.5) * 1000
  const start = p + (ctx.calibration?.prefillSpreadMs ?? 0)
  return {
    startMs: Math.round(start * 10) / 10,
    endMs: Math.round((start + Math.min(1000, deadlineMs * 0.4)) * 10) / 10,
    why: 'held open by the widening',
  }
}

export const abortMidTransfer: Fault<AbortMidTransferParams> = {
  name: 'abort-mid-transfer',
  summary:
    'aborts fired on prefill and decode (or one side: --side) inside the KV transfer window, N trials, offsets swept',
  params: Params,
  flagNames: {widenKBytesPerSecond: 'widen-kbytes'},
  mechanisms: ['abort-requests', 'packet-filter', 'twin-failpoint'],
  observe: 'trials',
  pins: 'trials',

  refine(p, label) {
    return p.widenKBytesPerSecond !== undefined && p.gpu === undefined
      ? {key: 'gpu', why: `needs ${label('gpu')} N to widen the window (whose KV connections to slow)`}
      : undefined
  },

  footprint(p, ctx) {
    // Widening holds one GPU's KV connections. On a TCP data path the plan widens by itself, on the first prefill
    // GPU (0) unless told; elsewhere, without a GPU, the window is the deployment's own.
    const gpu = p.gpu ?? (ctx.autoMechanism === 'packet-filter' ? 0 : undefined)
    return {gpus: gpu === undefined ? [] : [gpu], ports: gpu === undefined ? [] : [`kv:${gpu}`], queue: 'inflight'}
  },

  async gather(host: Host, discovery, params, opts = {}): Promise<HostFacts> {
    const widen = wideningOf(params, discovery)
    if (!widen) return {}
    const timeoutMs = opts.timeoutMs ?? 5000
    const t = await detectFilterTool(host, timeoutMs)
    const read = async () => {
      const ss = await host.run(SS_ARGV, {timeoutMs, sudo: true})
      if (ss.code !== 0)
        throw badInput(
          `\`ss -tnpH\` failed on ${host.describe()}: ${oneLine(ss.stderr) || `exit ${ss.code}`}`,
          'install iproute2 (ss) on the host',
        )
      return parseSsConnections(ss.stdout)
    }
    let connections = await read()
    // A KV connection being opened again (a transport reconnects after an error) is missing for a moment: read once
    // more before the plan refuses for want of one.
    // The rank the plan widens (its refusal of a GPU no rank or several hold comes first, as the plan's would).
    const rank = rankOnGpu(discovery, widen.gpu)
    if (dataConnectionsOf(rank, discovery, connections).length === 0) {
      await sleep(500)
      connections = await read()
    }
    return {filterTool: t.tool, filterEvidence: t.evidence, connections}
  },

  plan(ctx: FaultContext<AbortMidTransferParams>): FaultPlan {
    checkLeaseId(ctx.leaseId)
    const p = ctx.params
    if (!Number.isInteger(p.trials) || p.trials < 1 || p.trials > MAX_TRIALS)
      throw badInput(`--trials must be 1 to ${MAX_TRIALS}`)
    const widen = wideningOf(p, ctx.discovery)
    const window = transferWindow(ctx, widen !== undefined)
    const sweep: Sweep = {
      base: {
        fault: 'abort-mid-transfer' as const,
        mechanism: 'abort-requests' as const,
        leaseId: ctx.leaseId,
        trials: abortTrials(ctx.leaseId, p, window),
      },
      window,
      summary:
        `${p.trials} trial(s), aborts on ${describeSide(p.side ?? 'both')} at ${window.startMs}..${window.endMs} ms ` +
        `after each request is sent (${window.why})`,
    }
    if (widen === undefined) {
      return {
        ...sweep.base,
        transferWindow: sweptWindow(window, 'none'),
        targets: [],
        inject: [],
        revert: [],
        sudo: false,
        verifyInjected: [],
        verifyClean: [],
        readOnlyProbes: [],
        description: `${sweep.summary}; no change on the host`,
      }
    }
    return widenedPlan(ctx, widen, sweep)
  },
}

/** The plan's sweep: what every plan of it carries, the window it sweeps, and the line that says so. */
interface Sweep {
  base: {fault: 'abort-mid-transfer'; mechanism: 'abort-requests'; leaseId: string; trials: AbortTrial[]}
  window: ReturnType<typeof transferWindow>
  summary: string
}

/** One trial per offset, each a request id of its own aborted on the side(s) asked for. */
function abortTrials(
  leaseId: string,
  p: AbortMidTransferParams,
  window: ReturnType<typeof transferWindow>,
): AbortTrial[] {
  return sweepOffsets(p.trials, window.startMs, window.endMs).map((offsetMs, index) => {
    const rid = trialRid(leaseId, index)
    return {
      index,
      rid,
      offsetMs,
      aborts: servicesOfSide(p.side ?? 'both').map(service => ({
        service,
        method: 'POST' as const,
        path: '/abort_request' as const,
        body: {rid},
      })),
    }
  })
}

function sweptWindow(window: ReturnType<typeof transferWindow>, widening: TransferWindow['widening']): TransferWindow {
  return {startMs: window.startMs, endMs: window.endMs, why: window.why, widening}
}

/** The window widened on one prefill rank's TCP KV connections: a packet filter, or the twin's failure point. */
function widenedPlan(
  ctx: FaultContext<AbortMidTransferParams>,
  widen: NonNullable<ReturnType<typeof wideningOf>>,
  sweep: Sweep,
): FaultPlan {
  const rank = rankOnGpu(ctx.discovery, widen.gpu)
  const path = classifyDataPath(ctx.discovery.transport)
  if (path.kind !== 'tcp')
    throw badInput(
      `cannot widen the window by slowing the data path: ${path.evidence}; a rate limit cannot slow hardware RDMA`,
      'run without widening',
    )
  if (
    !ctx.facts.filterTool &&
    ctx.discovery.twinFailpointUrl &&
    widen.kbytesPerSecond === 0 &&
    rank.service === 'prefill'
  ) {
    // No packet filter usable here (not root?), but the target is the twin: hold the window open with its own
    // stall-kv failure point on that rank, and say so.
    const fp = buildTwinFailpoint(ctx.discovery.twinFailpointUrl, 'stall-kv', [rank.tpRank])
    return {
      ...sweep.base,
      transferWindow: sweptWindow(sweep.window, 'twin-failpoint'),
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
        `${sweep.summary}; window held open by ${fp.summary} ` + "(the twin's failure point, not a host mechanism)",
      refusals: [
        `packet filter not usable here (${ctx.facts.filterEvidence ?? 'not probed'}): using the twin's own ` +
          `failure point instead`,
      ],
    }
  }
  return filterWidenedPlan(ctx, widen, sweep, rank, path.evidence)
}

/** A packet filter holding still (or rate-limiting) both directions of the rank's KV data connections. */
function filterWidenedPlan(
  ctx: FaultContext<AbortMidTransferParams>,
  widen: NonNullable<ReturnType<typeof wideningOf>>,
  sweep: Sweep,
  rank: RankInfo,
  pathEvidence: string,
): FaultPlan {
  const conns = dataConnectionsOf(rank, ctx.discovery, ctx.facts.connections ?? [])
  if (conns.length === 0) {
    // What ss showed of the rank, so a refusal says why (none at all, or only control and service ports).
    const own = (ctx.facts.connections ?? [])
      .filter(c => c.pids.includes(rank.pid))
      .map(c => `${c.state} ${c.local.addr}:${c.local.port} -> ${c.peer.addr}:${c.peer.port}`)
    const seen =
      own.length === 0
        ? 'ss showed no TCP connection of that pid'
        : `ss showed only control or service connections of that pid: ${own.slice(0, 8).join(', ')}`
    throw badInput(
      `no open KV data connection of ${describeRank(rank)} to slow (${seen})`,
      'send one request through the deployment first',
    )
  }
  if (!ctx.facts.filterTool) throw noFilterTool(ctx.facts.filterEvidence)
  const filter = buildFilter({
    tool: ctx.facts.filterTool,
    leaseId: ctx.leaseId,
    action: widen.kbytesPerSecond === 0 ? {kind: 'drop'} : {kind: 'rate', kbytesPerSecond: widen.kbytesPerSecond},
    matches: conns.map(c => ({kind: 'flow', a: c.local, b: c.peer})),
  })
  return {
    ...sweep.base,
    transferWindow: sweptWindow(sweep.window, 'packet-filter'),
    targets: [
      {
        service: rank.service,
        tpRank: rank.tpRank,
        pid: rank.pid,
        ...(rank.startTicks === undefined ? {} : {startTicks: rank.startTicks}),
        ...(rank.gpu === undefined ? {} : {gpu: rank.gpu}),
        connections: conns.map(c => ({local: c.local, peer: c.peer})),
      },
    ],
    inject: filter.inject,
    revert: filter.revert,
    sudo: true,
    verifyInjected: [filter.verifyInjected],
    verifyClean: [filter.verifyClean],
    readOnlyProbes: [...filter.readOnlyProbes, SS_ARGV],
    description: `${sweep.summary}; window widened: ${filter.summary}`,
    notes: [`data path: ${pathEvidence}`],
  }
}
