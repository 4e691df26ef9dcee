import type {KvLeaseSettings} from '../../../checks/kv-lease.js'
import type {KvLeaseVerdict} from '../../../checks/kv-lease.js'
import type {LeaseRecord, ScenarioRun} from '../../../model/run.js'
import type {Verdict} from '../../../model/verdict.js'
import type {Sourced} from '../../engine.js'
import type {LeaseContract} from '../lease-contract.js'
import {VLLM_STEP_BOUND_MS} from './drop-dest-info.js'

/**
 * What wedge-rank --side decode and kill-decode on vLLM share (pure): D's heartbeats stop while D holds requests in
 * WAITING_FOR_REMOTE_KVS (their READ stalled), and P must free the blocks at
 * max(grant + duration, last renewal + extension) + one step + the reaper. The timing of a run, the lease settings
 * (P's duration and extension: P's worker applies them, nixl/base_worker.py `__init__`, `_handle_heartbeat`; D's
 * heartbeat interval: D's scheduler throttles by it, nixl/base_scheduler.py `__init__`, `build_connector_meta`) and the
 * scenario record.
 *
 * Two groups of requests, so that both edges of the deadline are judged in one run:
 * - renewed: sent first and held (READ stalled, D heartbeating) long enough that at the stop their deadline is
 *   D's last heartbeat + extension, past their grant + duration;
 * - fresh: sent just before the stop, so their deadline is still grant + duration (a lease shortened at the grant,
 *   e.g. the twin's expire-early, frees them early).
 */

export interface StopTiming {
  renewed: number
  fresh: number
  /** After the renewed requests are held, before the fresh ones are sent (ms). */
  holdRenewedMs: number
  /** How long the stop is held after it took (ms): every window closes, then the log's resolution and a margin. */
  holdStopMs: number
}

const said = (s: Sourced<number>): string => `${s.value} s (${s.source}: ${s.detail})`
const STEP_SOURCE =
  `engine step ${VLLM_STEP_BOUND_MS} ms + reaper pass ${VLLM_STEP_BOUND_MS} ms (assumed bound: a step is not ` +
  'readable from outside the engine)'

/** The lease settings the check judges by, each with where it was read, or the reason it cannot be judged. */
export function stopSettings(
  p: LeaseContract | undefined,
  d: LeaseContract | undefined,
): {settings: KvLeaseSettings; sources: string[]} | {refusal: string; hint: string} {
  if (p?.mode !== 'lease')
    return {
      refusal:
        "P's --kv-transfer-config states no kv_connector_extra_config.kv_lease_duration, so whether P runs the lease " +
        '(whose heartbeats D stops) or the legacy VLLM_NIXL_ABORT_REQUEST_TIMEOUT (no heartbeats at all) cannot be ' +
        'told',
      hint: 'launch P (and D) with kv_lease_duration in --kv-transfer-config',
    }
  const interval = d?.heartbeatIntervalS ?? p.heartbeatIntervalS
  const dur = p.leaseDurationS
  const ext = p.extensionS
  return {
    settings: {
      mode: 'lease',
      duration: {seconds: dur.value, source: `P ${dur.source}: ${dur.detail}`},
      extension: {seconds: ext.value, source: `P ${ext.source}: ${ext.detail}`},
      heartbeatInterval: {
        seconds: interval.value,
        source: `${d ? 'D' : "P (D's not read)"} ${interval.source}: ${interval.detail}`,
      },
      stepMs: VLLM_STEP_BOUND_MS,
      reaperMs: VLLM_STEP_BOUND_MS,
      stepAssumed: STEP_SOURCE,
    },
    sources: [
      `P's kv_lease_duration ${said(dur)}`,
      `P's extension ${said(ext)} (each renewal: max(old, now + extension))`,
      `D's heartbeat interval ${said(interval)}${d ? '' : " (D's lease settings not read: P's used)"}`,
      STEP_SOURCE,
    ],
  }
}

/**
 * The run's timing from the settings: the renewed requests are held until duration − extension + interval + a step
 * + 1 s past their grant (their deadline at the stop is then D's last heartbeat + extension, past grant + duration),
 * and the stop is held until the last window closes (extension past the stop, or duration past the fresh grants),
 * then the log's 1 s resolution and 1.5 s to read.
 */
export function stopTiming(s: KvLeaseSettings, requests: number): StopTiming {
  const d = s.duration!.seconds * 1000
  const e = (s.extension?.seconds ?? 0) * 1000
  const i = (s.heartbeatInterval?.seconds ?? 0) * 1000
  const step = s.stepMs ?? VLLM_STEP_BOUND_MS
  const renewed = Math.max(1, Math.ceil(requests / 2))
  return {
    renewed,
    fresh: requests - renewed,
    holdRenewedMs: d - e + i + step + 1000,
    holdStopMs: Math.max(d, e + step) + step + (s.reaperMs ?? step) + 2500,
  }
}

/** The fault lease's TTL: the whole run (both holds, sending, the revert) and a minute, at most an hour. */
export function stopLeaseTtlMs(t: StopTiming): number {
  return Math.min(3_600_000, Math.ceil(t.holdRenewedMs + t.holdStopMs + 60_000))
}

/** --ttl shorter than the run: the host's reverter would take the fault out mid-run, so refuse it. */
export function ttlRefusal(ttlS: number | undefined, t: StopTiming): {refusal: string; hint: string} | undefined {
  const needS = Math.ceil((t.holdRenewedMs + t.holdStopMs) / 1000) + 10
  if (ttlS === undefined || ttlS >= needS) return undefined
  return {
    refusal: `--ttl ${ttlS} s is shorter than the run (${needS} s: both holds and 10 s to send and revert)`,
    hint: `pass --ttl ${needS} or more, or leave it out (the plan's TTL covers the run and a minute)`,
  }
}

export function renderTiming(t: StopTiming, what: string): string[] {
  return [
    `requests: ${t.renewed} renewed (held ${(t.holdRenewedMs / 1000).toFixed(1)} s before the ${what}, so that ` +
      `D's heartbeats govern their deadline) and ${t.fresh} fresh (sent just before it: their grant governs)`,
    `${what} held ${(t.holdStopMs / 1000).toFixed(1)} s: past every window, the log's 1 s resolution and a margin`,
  ]
}

/** The scenario in the run model, so journal, JUnit and HTML render it with the engine named. */
export function stopScenario(o: {
  fault: string
  mechanism: string
  description: string
  requests: number
  durationS: number
  startedAt: number
  finishedAt: number
  verdicts: KvLeaseVerdict[]
  others: Verdict[]
  leases: LeaseRecord[]
  notes: string[]
}): ScenarioRun {
  return {
    name: `${o.fault} (vllm)`,
    kind: 'inject',
    fault: o.fault,
    params: {pins: o.requests},
    startedAt: o.startedAt,
    finishedAt: o.finishedAt,
    verdicts: [...o.verdicts.map(v => ({...v, check: 'kv-lease' as const})), ...o.others],
    pins: [],
    leases: o.leases,
    contract: {scope: 'all', deadlineSeconds: o.durationS, pollSeconds: (2 * VLLM_STEP_BOUND_MS) / 1000},
    mechanism: o.mechanism,
    description: o.description,
    notes: ['engine: vllm', ...o.notes],
  }
}
