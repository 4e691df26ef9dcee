import type {KvLeaseSettings, KvLeaseVerdict} from '../../../checks/kv-lease.js'
import type {KvPinnedVerdict} from '../../../checks/kv-pinned.js'
import type {LeaseRecord, ScenarioRun} from '../../../model/run.js'
import type {Verdict} from '../../../model/verdict.js'
import type {Sourced} from '../../engine.js'
import type {LeaseContract} from '../lease-contract.js'
import {VLLM_LOG_RESOLUTION_MS} from '../log-lines.js'
import {VLLM_STEP_BOUND_MS} from './drop-dest-info.js'

/**
 * stall-kv on vLLM (issue 31 item 3), pure: the plan and the scenario record. P's data path is stalled (read-stall.ts:
 * TCP to P's data listener dropped under a fault lease) while D stays alive; `--pins` requests are sent to P and then
 * to D (the toy proxy's two legs), so D's READ hangs and D heartbeats P's lease; one bystander request is sent to P
 * only (its D leg never sent) after them, so the reaper must still free it at its own expiry (the reaper-head-block
 * defect strands it behind a renewed head). The run observes until the last stalled request's bound
 * (answered + 2 x duration + extension + slack: any READ deadline up to one lease duration has failed the READ, D's
 * last renewal has run out and the reaper has run by then), reads P's log and counters and D's /health and
 * /metrics, lifts the filter, and waits (bounded) for D's READs to complete after it. docs/faults.md ("stall-kv on
 * vLLM") has the sources.
 */

export const VLLM_STALL_FAULT = 'stall-kv'

export interface VllmStallPlan {
  requests: number
  bystanders: number
  settings: KvLeaseSettings
  sources: string[]
  /** Observe until the last stalled request's answer + this (ms), before the revert. */
  observeAfterLastAnswerMs: number
  /** After the revert, wait at most this long (ms) for D's legs to finish (TCP's SYN retries reach the port again). */
  afterRevertMs: number
  bound: string
  evidence: string[]
  notes: string[]
}

const said = (s: Sourced<number>): string => `${s.value} s (${s.source}: ${s.detail})`
const STEP_SOURCE =
  `engine step + reaper pass ${2 * VLLM_STEP_BOUND_MS} ms ` + '(assumed bound: a step is not readable from outside)'

/** The plan from P's discovered lease contract, or the one-line reason it cannot be judged. */
export function vllmStallPlan(
  lease: LeaseContract | undefined,
  o: {requests: number; logFile: string | undefined; problems: string[]; gpu?: number},
): VllmStallPlan | {refusal: string; hint: string} {
  if (!lease)
    return {
      refusal: `P's lease settings could not be read: ${o.problems.join('; ') || 'no vllm serve process for P'}`,
      hint: 'run `pdchaos status -c FILE` to see what discovery read on the host',
    }
  if (lease.mode !== 'lease')
    return {
      refusal:
        "P's --kv-transfer-config has no kv_connector_extra_config.kv_lease_duration: a stalled READ is judged " +
        "against D's heartbeats, which only a lease-era P (kv_lease_duration on its command line) is known to take",
      hint: 'launch P with kv_lease_duration in --kv-transfer-config (or use drop-dest-info for a legacy build)',
    }
  if (!Number.isInteger(o.requests) || o.requests < 1 || o.requests > 16)
    return {refusal: `--pins ${o.requests} is out of range for stall-kv on vLLM`, hint: 'pass --pins 1 to 16'}
  const d = lease.leaseDurationS.value
  const e = lease.extensionS.value
  const slack = 2 * VLLM_STEP_BOUND_MS + VLLM_LOG_RESOLUTION_MS
  return {
    requests: o.requests,
    bystanders: 1,
    settings: {
      mode: 'lease',
      duration: {seconds: d, source: `${lease.leaseDurationS.source}: ${lease.leaseDurationS.detail}`},
      extension: {seconds: e, source: `${lease.extensionS.source}: ${lease.extensionS.detail}`},
      heartbeatInterval: {
        seconds: lease.heartbeatIntervalS.value,
        source: `${lease.heartbeatIntervalS.source}: ${lease.heartbeatIntervalS.detail}`,
      },
      stepMs: VLLM_STEP_BOUND_MS,
      reaperMs: VLLM_STEP_BOUND_MS,
      stepAssumed: STEP_SOURCE,
    },
    sources: [
      `kv_lease_duration ${said(lease.leaseDurationS)}`,
      `extension ${said(lease.extensionS)}, heartbeat interval ${said(lease.heartbeatIntervalS)}`,
      STEP_SOURCE,
    ],
    observeAfterLastAnswerMs: (2 * d + e) * 1000 + slack + 500,
    // TCP's SYN retries back off (1, 3, 7, 15, 31, 63 s after the connect): the next one reaches the port again.
    afterRevertMs: Math.min(Math.max(20_000, 2 * d * 1000), 130_000),
    bound:
      `answered + 2 x ${d} s + extension ${e} s + ${slack} ms per stalled request: a READ deadline up to one lease ` +
      'has failed the READ, D stopped renewing and its last extension ran out by then',
    evidence: [
      `P's log ${o.logFile ?? '(no services.prefill.logs.file: unreadable, verdicts unverified)'}: ` +
        '"Releasing expired KV blocks for request <id> ... before lease expired"',
      "P's /metrics vllm:nixl_num_kv_expired_reqs before the requests and at the bound",
      "D's legs (unanswered = D still holds the request), D's /health and vllm:num_requests_waiting at the bound",
      "the filter's dropped-packet counter (the READ met the stall)",
    ],
    notes: [
      `${o.requests} stalled request(s): P's leg, then D's leg with P's kv_transfer_params (D READs and heartbeats)`,
      "1 bystander: P's leg only, sent after the stalled ones; judged by kv-lease (must be freed at its own expiry)",
      o.gpu === undefined
        ? "every TP rank's data listener of P is dropped (P's whole data path); --gpu N stalls one rank's"
        : `only the data listener of P's rank on GPU ${o.gpu} is dropped: the READ completes on the other ranks ` +
          "and waits on that one (D's worker reads its share from each P rank)",
    ],
  }
}

export function renderVllmStallPlan(p: VllmStallPlan, stall: string[]): string[] {
  return [
    `${VLLM_STALL_FAULT} on vLLM: D's READ of P's blocks stalls on P's data path while D stays alive and heartbeats`,
    ...stall,
    'lease settings:',
    ...p.sources.map(s => `  ${s}`),
    `bound: ${p.bound}`,
    `observe: ${(p.observeAfterLastAnswerMs / 1000).toFixed(1)} s after the last stalled request's answer, then ` +
      `lift the filter and wait up to ${(p.afterRevertMs / 1000).toFixed(0)} s for D's READs to complete`,
    'evidence:',
    ...p.evidence.map(e => `  ${e}`),
    ...p.notes.map(n => `note: ${n}`),
  ]
}

export function vllmStallScenario(
  p: VllmStallPlan,
  r: {
    startedAt: number
    finishedAt: number
    pinned: KvPinnedVerdict[]
    bystanders: KvLeaseVerdict[]
    lease?: LeaseRecord
    notes?: string[]
  },
): ScenarioRun {
  const verdicts: Verdict[] = [
    ...r.pinned.map(v => ({...v, check: 'kv-pinned' as const})),
    ...r.bystanders.map(v => ({...v, check: 'kv-lease' as const})),
  ]
  return {
    name: `${VLLM_STALL_FAULT} (vllm)`,
    kind: 'inject',
    fault: VLLM_STALL_FAULT,
    params: {pins: p.requests, bystanders: p.bystanders},
    startedAt: r.startedAt,
    finishedAt: r.finishedAt,
    verdicts,
    pins: [],
    leases: r.lease ? [r.lease] : [],
    contract: {
      scope: 'all',
      deadlineSeconds: p.settings.duration!.seconds,
      pollSeconds: (2 * VLLM_STEP_BOUND_MS) / 1000,
    },
    mechanism: 'packet-filter',
    description: "engine vllm: D's READ stalled on P's data path while D heartbeats; P's blocks judged",
    notes: ['engine: vllm', ...p.sources, `bound: ${p.bound}`, ...p.notes, ...(r.notes ?? [])],
  }
}

/** `ss -tinH state established '( sport = :PORT )'`: the argv reading the connections into P's side channel. */
export const sideChannelSsArgv = (port: number): string[] => [
  'ss',
  '-tinH',
  'state',
  'established',
  `( sport = :${port} )`,
]

/**
 * Bytes P received on its side-channel connections, from `ss -tinH` (each socket a line, then an indented line of
 * TCP info with `bytes_received:N`); undefined when there is no connection. Pure.
 */
export function sideChannelBytesIn(text: string): number | undefined {
  let sum: number | undefined
  for (const line of text.split('\n')) {
    const m = /\bbytes_received:(\d+)/.exec(line)
    if (m) sum = (sum ?? 0) + Number(m[1])
  }
  return sum
}

/** Did anything flow from D into P's side channel between two readings (the twin's heartbeats do)? */
export function heartbeatsSeen(
  port: number | undefined,
  before: number | undefined,
  after: number | undefined,
): {reachedP: boolean; evidence: string} {
  if (port === undefined) return {reachedP: false, evidence: "P's side-channel port unknown: heartbeats not observed"}
  if (before !== undefined && after !== undefined && after > before)
    return {
      reachedP: true,
      evidence:
        `P's side channel :${port} received ${after - before} byte(s) from D during the stall (bytes_received ` +
        `${before} -> ${after}): D's heartbeats reached P on a path the filter left open`,
    }
  return {
    reachedP: false,
    evidence:
      `no traffic from D into P's side channel :${port} during the stall ` +
      `(bytes_received ${before ?? 'no connection'} ` +
      `-> ${after ?? 'no connection'}): vLLM's heartbeats ride NIXL notifications, which may share the stalled path`,
  }
}
