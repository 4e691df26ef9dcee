import {isIP} from 'node:net'

import type {RankInfo} from '../../engines/sglang/discovery/discover.js'
import {badInput} from '../../errors.js'
import type {Connection, Endpoint, FaultDiscovery} from '../fault.js'

/**
 * The KV data path: is it plain kernel TCP (a packet filter can stall it) or something the kernel stack never
 * sees (RDMA, NVLink/cuda_ipc — a packet filter would be a silent no-op)? And which TCP connections carry a
 * rank's KV bytes? Both are read from what discovery and `ss` report, never from the twin's internals.
 */

export type DataPathKind = 'tcp' | 'rdma' | 'unknown'

export interface DataPath {
  kind: DataPathKind
  evidence: string
}

/** Transport as discovery reports it; `dataPath` and `env` are optional hints a discovery may carry. */
export interface TransportInput {
  backend: string
  source?: string
  /** An explicit data-path statement (e.g. a server_info field), when the deployment reports one. */
  dataPath?: string
  /** Transport-related environment of a rank (UCX_*, MC_*, NIXL_*), from /proc/<pid>/environ. */
  env?: Record<string, string>
}

/** UCX transports that are kernel TCP or host-local memory (none of them moves KV over RDMA or NVLink). */
const UCX_NON_RDMA = new Set([
  'tcp',
  'self',
  'sm',
  'shm',
  'posix',
  'sysv',
  'cma',
  'knem',
  'xpmem',
  'cuda_copy',
  'rocm_copy',
])

/**
 * Classify the data path. TCP only when something positively says so; anything else is rdma (a known RDMA
 * backend with no TCP statement) or unknown — and a packet filter is refused for both.
 */
export function classifyDataPath(t: TransportInput): DataPath {
  const stated = t.dataPath?.trim().toLowerCase()
  if (stated) {
    if (stated === 'tcp')
      return {kind: 'tcp', evidence: `the deployment reports its KV data path as tcp (${t.source ?? 'discovery'})`}
    return {
      kind:
        stated.includes('rdma') || stated.includes('ib') || stated.includes('nvlink') || stated.includes('cuda_ipc')
          ? 'rdma'
          : 'unknown',
      evidence: `the deployment reports its KV data path as ${stated}`,
    }
  }
  const backend = t.backend.toLowerCase()
  const env = t.env ?? {}
  if (backend === 'nixl') {
    const tls = env.UCX_TLS?.trim()
    if (tls) {
      // UCX_TLS lists allowed transports; a leading ^ means "all except", which still allows RDMA.
      const lanes = tls
        .split(',')
        .map(s => s.trim().toLowerCase())
        .filter(Boolean)
      if (!tls.startsWith('^') && lanes.includes('tcp') && lanes.every(l => UCX_NON_RDMA.has(l))) {
        return {kind: 'tcp', evidence: `nixl with UCX_TLS=${tls}: UCX may only use TCP for inter-process KV`}
      }
      return {kind: 'rdma', evidence: `nixl with UCX_TLS=${tls}: UCX may pick a non-TCP lane`}
    }
    return {kind: 'rdma', evidence: 'nixl without UCX_TLS: UCX picks RDMA or cuda_ipc where it can'}
  }
  if (backend === 'mooncake') {
    const force = env.MC_FORCE_TCP?.trim().toLowerCase()
    if (force === '1' || force === 'true' || force === 'yes')
      return {kind: 'tcp', evidence: `mooncake with MC_FORCE_TCP=${env.MC_FORCE_TCP}`}
    return {kind: 'rdma', evidence: 'mooncake: RDMA transfer engine (no MC_FORCE_TCP)'}
  }
  return {
    kind: 'unknown',
    evidence: `backend ${JSON.stringify(t.backend)} (${t.source ?? 'discovery'}): data path not known to be TCP`,
  }
}

// ---------------------------------------------------------------- ss

function endpoint(text: string): Endpoint | undefined {
  const colon = text.lastIndexOf(':')
  if (colon < 0) return undefined
  const port = Number(text.slice(colon + 1))
  let addr = text.slice(0, colon).replace(/^\[|\]$/g, '')
  const pct = addr.indexOf('%')
  if (pct >= 0) addr = addr.slice(0, pct)
  // A dual-stack socket talking to an IPv4 peer puts IPv4 packets on the wire.
  const mapped = /^::ffff:(\d+\.\d+\.\d+\.\d+)$/i.exec(addr)
  if (mapped) addr = mapped[1]!
  if (!Number.isInteger(port) || port < 1 || port > 65_535 || isIP(addr) === 0) return undefined
  return {addr, port}
}

/** Lines of `ss -tnpH` (established TCP, numeric): state, queues, local, peer, then users:(("name",pid=N,fd=M),...). */
export function parseSsConnections(text: string): Connection[] {
  const out: Connection[] = []
  for (const line of text.split('\n')) {
    const cols = line.trim().split(/\s+/)
    if (cols.length < 5) continue
    const local = endpoint(cols[3]!)
    const peer = endpoint(cols[4]!)
    if (!local || !peer) continue
    const pids = [...new Set([...line.matchAll(/pid=(\d+)/g)].map(m => Number(m[1])))]
    out.push({state: cols[0]!, local, peer, pids})
  }
  return out
}

export const SS_ARGV = ['ss', '-tnpH']

const sameEnd = (a: Endpoint, b: Endpoint): boolean => a.port === b.port && a.addr === b.addr

export interface DataConnection {
  local: Endpoint
  peer: Endpoint
  /** The rank at the other end, when that end is on this host and ss showed its pid. */
  peerRank?: RankInfo
}

/**
 * The TCP connections that carry one rank's KV bytes: established connections owned by the rank's pid, except
 * ZMQ control traffic (any prefill rank's ZMQ port) and the service ports (HTTP, bootstrap, router). When the other
 * end is on this host, it must belong to a rank of the other role (prefill <-> decode); anything else is not KV.
 */
export function dataConnectionsOf(
  rank: RankInfo,
  discovery: FaultDiscovery,
  connections: Connection[],
): DataConnection[] {
  const control = new Set<number>([...discovery.servicePorts])
  for (const r of discovery.ranks) if (r.zmqPort !== undefined) control.add(r.zmqPort)
  const rankByPid = new Map(discovery.ranks.map(r => [r.pid, r]))
  const out: DataConnection[] = []
  const seen = new Set<string>()
  for (const c of connections) {
    if (c.state !== 'ESTAB' || !c.pids.includes(rank.pid)) continue
    if (control.has(c.local.port) || control.has(c.peer.port)) continue
    // The other end, if it is on this host: the connection seen from the peer's side.
    const mirror = connections.find(m => sameEnd(m.local, c.peer) && sameEnd(m.peer, c.local))
    let peerRank: RankInfo | undefined
    if (mirror && mirror.pids.length > 0) {
      peerRank = mirror.pids.map(p => rankByPid.get(p)).find(r => r !== undefined)
      if (!peerRank || peerRank.service === rank.service) continue
    }
    const key = `${c.local.addr}:${c.local.port}-${c.peer.addr}:${c.peer.port}`
    if (seen.has(key)) continue
    seen.add(key)
    out.push({local: c.local, peer: c.peer, ...(peerRank ? {peerRank} : {})})
  }
  return out
}

/** The rank on GPU n, or badInput naming what discovery saw. */
export function rankOnGpu(discovery: FaultDiscovery, gpu: number): RankInfo {
  const on = discovery.ranks.filter(r => r.gpu === gpu)
  const known = discovery.ranks.filter(r => r.gpu !== undefined).map(r => `GPU ${r.gpu}: ${r.service} TP${r.tpRank}`)
  if (on.length === 0) {
    throw badInput(
      `no rank holds ` +
        `GPU ${gpu}${
          known.length
            ? ` (ranks seen: ${known.join(', ')})`
            : ' (discovery mapped no rank to a GPU: ' + 'is nvidia-smi on the host?)'
        }`,
      'pick --gpu from `pdchaos status`',
    )
  }
  if (on.length > 1) {
    throw badInput(
      `GPU ${gpu} is held by ${on.length} ranks ` +
        `(${on.map(r => `${r.service} TP${r.tpRank} pid ${r.pid}`).join(', ')}): ambiguous target`,
      'stop the extra processes or pick another GPU',
    )
  }
  return on[0]!
}

/**
 * The rank(s) of the other role paired with `rank` for KV transfer: first as observed (live data connections
 * between them), else by SGLang's equal-TP pairing (TP k <-> TP k). Unequal TP sizes without observed
 * connections have no safe answer.
 */
export function pairedRanks(
  rank: RankInfo,
  discovery: FaultDiscovery,
  connections: Connection[] | undefined,
): {ranks: RankInfo[]; evidence: string} {
  const other = rank.service === 'prefill' ? 'decode' : 'prefill'
  const seen = new Map<number, RankInfo>()
  for (const c of dataConnectionsOf(rank, discovery, connections ?? []))
    if (c.peerRank) seen.set(c.peerRank.pid, c.peerRank)
  if (seen.size > 0)
    return {
      ranks: [...seen.values()],
      evidence:
        `observed KV connections from ${rank.service} TP${rank.tpRank} ` +
        `to ${[...seen.values()].map(r => `${other} TP${r.tpRank}`).join(', ')}`,
    }
  const mine = discovery.ranks.filter(r => r.service === rank.service).length
  const theirs = discovery.ranks.filter(r => r.service === other)
  if (mine === theirs.length && mine > 0) {
    const twin = theirs.filter(r => r.tpRank === rank.tpRank)
    if (twin.length === 1)
      return {
        ranks: twin,
        evidence: `equal TP sizes (${mine}): ${rank.service} TP${rank.tpRank} pairs with ${other} TP${rank.tpRank}`,
      }
  }
  return {
    ranks: [],
    evidence:
      `no KV connection of ${rank.service} TP${rank.tpRank} observed and TP sizes differ ` +
      `(${rank.service} ${mine}, ${other} ${theirs.length})`,
  }
}
