import {badInput, oneLine} from '../errors.js'
import type {Host} from '../hosts/host.js'
import {type AbortTrial, checkLeaseId, describeRank, type Fault, type FaultContext, type FaultPlan, type HostFacts, intParam} from './fault.js'
import {classifyDataPath, dataConnectionsOf, parseSsConnections, rankOnGpu, SS_ARGV} from './mechanisms/data-path.js'
import {buildFilter, detectFilterTool, noFilterTool} from './mechanisms/packet-filter.js'
import {buildTwinFailpoint} from './mechanisms/twin-failpoint.js'

/**
 * abort-mid-transfer: N trials, each a request with pdchaos's own rid and `POST /abort_request {rid}` fired on
 * prefill AND decode at an offset inside the transfer window (a sweep from the window's estimated start to its
 * end; the caller estimates the window from unfaulted requests). No host change by default. Optionally the window
 * is widened by rate-limiting one rank's KV connections with nft `limit rate` (only on a TCP data path): tc would
 * slow the whole device (every service on loopback), not one connection, so it is not used.
 */

export interface AbortMidTransferParams {
  trials: number
  /** Estimated transfer window, ms after a request is sent. */
  windowStartMs: number
  windowEndMs: number
  /** Widen the window: rate-limit the KV connections of the rank on this GPU... */
  gpu?: number
  /** ...to this many kbytes/s; 0 holds the transfer still (a stall), so every abort after the forward lands in Transferring. */
  widenKBytesPerSecond?: number
}

export const MAX_TRIALS = 200

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

function numParam(raw: unknown, name: string, min: number, max: number): number {
  const n = typeof raw === 'string' && raw.trim() !== '' ? Number(raw) : raw
  if (typeof n !== 'number' || !Number.isFinite(n) || n < min || n > max) throw badInput(`--${name} must be a number from ${min} to ${max} (got ${JSON.stringify(raw)})`)
  return n
}

export const abortMidTransfer: Fault<AbortMidTransferParams> = {
  name: 'abort-mid-transfer',
  summary: 'aborts fired on prefill and decode inside the KV transfer window, N trials with a sweep of offsets',

  parseParams(raw) {
    if (raw.windowStartMs === undefined || raw.windowEndMs === undefined) {
      throw badInput('abort-mid-transfer needs the transfer window (windowStartMs, windowEndMs)', 'estimate it from unfaulted requests first')
    }
    const windowStartMs = numParam(raw.windowStartMs, 'window-start-ms', 0, 3_600_000)
    const windowEndMs = numParam(raw.windowEndMs, 'window-end-ms', 0, 3_600_000)
    if (windowEndMs < windowStartMs) throw badInput(`the transfer window ends (${windowEndMs} ms) before it starts (${windowStartMs} ms)`)
    const p: AbortMidTransferParams = {trials: raw.trials === undefined ? 10 : intParam(raw.trials, 'trials', 1, MAX_TRIALS), windowStartMs, windowEndMs}
    if (raw.widenKBytesPerSecond !== undefined) {
      p.widenKBytesPerSecond = intParam(raw.widenKBytesPerSecond, 'widen-kbytes', 0, 10_000_000)
      if (raw.gpu === undefined) throw badInput('widening the window needs --gpu N (whose KV connections to slow)')
    }
    if (raw.gpu !== undefined) p.gpu = intParam(raw.gpu, 'gpu', 0, 1023)
    return p
  },

  async gather(host: Host, _discovery, params, opts = {}): Promise<HostFacts> {
    if (params.widenKBytesPerSecond === undefined) return {}
    const timeoutMs = opts.timeoutMs ?? 5000
    const t = await detectFilterTool(host, timeoutMs)
    const ss = await host.run(SS_ARGV, {timeoutMs, sudo: true})
    if (ss.code !== 0) throw badInput(`\`ss -tnpH\` failed on ${host.describe()}: ${oneLine(ss.stderr) || `exit ${ss.code}`}`, 'install iproute2 (ss) on the host')
    return {filterTool: t.tool, filterEvidence: t.evidence, connections: parseSsConnections(ss.stdout)}
  },

  plan(ctx: FaultContext<AbortMidTransferParams>): FaultPlan {
    checkLeaseId(ctx.leaseId)
    const p = ctx.params
    if (!Number.isInteger(p.trials) || p.trials < 1 || p.trials > MAX_TRIALS) throw badInput(`--trials must be 1 to ${MAX_TRIALS}`)
    if (!(p.windowEndMs >= p.windowStartMs && p.windowStartMs >= 0)) throw badInput(`invalid transfer window [${p.windowStartMs}, ${p.windowEndMs}] ms`)
    const trials: AbortTrial[] = sweepOffsets(p.trials, p.windowStartMs, p.windowEndMs).map((offsetMs, index) => {
      const rid = trialRid(ctx.leaseId, index)
      return {
        index, rid, offsetMs,
        aborts: (['prefill', 'decode'] as const).map((service) => ({service, method: 'POST' as const, path: '/abort_request' as const, body: {rid}})),
      }
    })
    const base = {
      fault: 'abort-mid-transfer' as const,
      mechanism: 'abort-requests' as const,
      leaseId: ctx.leaseId,
      trials,
    }
    const sweep = `${p.trials} trial(s), aborts on prefill and decode at ${p.windowStartMs}..${p.windowEndMs} ms after each request is sent`
    if (p.widenKBytesPerSecond === undefined) {
      return {
        ...base, targets: [], inject: [], revert: [], sudo: false, verifyInjected: [], verifyClean: [], readOnlyProbes: [],
        description: `${sweep}; no change on the host`,
      }
    }
    const rank = rankOnGpu(ctx.discovery, p.gpu!)
    const path = classifyDataPath(ctx.discovery.transport)
    if (path.kind !== 'tcp') throw badInput(`cannot widen the window by slowing the data path: ${path.evidence}; a rate limit cannot slow hardware RDMA`, 'run without widening')
    if (!ctx.facts.filterTool && ctx.discovery.twinFailpointUrl && p.widenKBytesPerSecond === 0 && rank.service === 'prefill') {
      // No packet filter usable here (not root?), but the target is the twin: hold the window open with its own
      // stall-kv failure point on that rank, and say so.
      const fp = buildTwinFailpoint(ctx.discovery.twinFailpointUrl, 'stall-kv', [rank.tpRank])
      return {
        ...base, targets: [{service: 'prefill', tpRank: rank.tpRank, pid: rank.pid, ...(rank.gpu === undefined ? {} : {gpu: rank.gpu})}],
        inject: fp.inject, revert: fp.revert, sudo: false, verifyInjected: [fp.verifyInjected], verifyClean: [fp.verifyClean], readOnlyProbes: fp.readOnlyProbes,
        description: `${sweep}; window held open by ${fp.summary} (the twin's failure point, not a host mechanism)`,
        refusals: [`packet filter not usable here (${ctx.facts.filterEvidence ?? 'not probed'}): using the twin's own failure point instead`],
      }
    }
    const conns = dataConnectionsOf(rank, ctx.discovery, ctx.facts.connections ?? [])
    if (conns.length === 0) throw badInput(`no open KV data connection of ${describeRank(rank)} to slow`, 'send one request through the deployment first')
    if (!ctx.facts.filterTool) throw noFilterTool(ctx.facts.filterEvidence)
    const filter = buildFilter({
      tool: ctx.facts.filterTool, leaseId: ctx.leaseId,
      action: p.widenKBytesPerSecond === 0 ? {kind: 'drop'} : {kind: 'rate', kbytesPerSecond: p.widenKBytesPerSecond},
      matches: conns.map((c) => ({kind: 'flow', a: c.local, b: c.peer})),
    })
    return {
      ...base,
      targets: [{
        service: rank.service, tpRank: rank.tpRank, pid: rank.pid, ...(rank.startTicks === undefined ? {} : {startTicks: rank.startTicks}),
        ...(rank.gpu === undefined ? {} : {gpu: rank.gpu}), connections: conns.map((c) => ({local: c.local, peer: c.peer})),
      }],
      inject: filter.inject, revert: filter.revert, sudo: true,
      verifyInjected: [filter.verifyInjected], verifyClean: [filter.verifyClean],
      readOnlyProbes: [...filter.readOnlyProbes, SS_ARGV],
      description: `${sweep}; window widened: ${filter.summary} (re-estimate the window with the limit in place)`,
      notes: [`data path: ${path.evidence}`],
    }
  },
}
