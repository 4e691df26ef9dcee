import type {AbortedLeaseVerdict} from '../../../checks/kv-lease-abort.js'
import type {KvLeaseSettings} from '../../../checks/kv-lease.js'
import type {LeaseRecord, ScenarioRun} from '../../../model/run.js'
import type {Verdict} from '../../../model/verdict.js'
import type {LeaseContract} from '../lease-contract.js'
import {VLLM_LOG_RESOLUTION_MS} from '../log-lines.js'
import {VLLM_STEP_BOUND_MS, vllmDropPlan} from './drop-dest-info.js'

/**
 * abort-mid-transfer on vLLM (issue 31 item 3), pure: the plan and the scenario record. Each trial sends P its leg as
 * the toy proxy does, holds P's data path so D's READ cannot complete (the shared READ stall, faults/read-stall.ts,
 * under a fault lease), sends D its leg, waits for D's evidence that the request is in its READ (D's
 * vllm:num_requests_waiting_by_reason{reason="deferred"} rising), and aborts D's leg as a client going away does.
 * vLLM then stops the request's heartbeats and sends P nothing (the read notification rides on the READ:
 * nixl/pull_worker.py `_read_blocks`), so with the READ held P must free at lease expiry, unrenewed after the abort.
 * The check is checks/kv-lease-abort.ts; docs/faults.md ("abort-mid-transfer on vLLM") has the sources.
 */

export const VLLM_ABORT_FAULT = 'abort-mid-transfer'

/** How often D's /metrics is read while waiting for the READ to show, and for the abort to land (ms). */
export const ENTRY_POLL_MS = 50
/** The longest wait for the request to show in D's READ before aborting anyway (the trial then proves nothing). */
export const ENTRY_DEADLINE_MS = 10_000
/** The longest wait for D's gauge to fall back after the abort (else the window uses an assumed step). */
export const ABORT_SEEN_DEADLINE_MS = 5_000

export interface VllmAbortPlan {
  requests: number
  settings: KvLeaseSettings
  sources: string[]
  /** The READ stall's fault-lease TTL (s): the host reverts it by then even if pdchaos dies. */
  stallTtlS: number
  window: string
  evidence: string[]
  notes: string[]
}

/**
 * The plan from P's discovered lease contract (the same refusals as drop-dest-info's: settings not read, or a build
 * before the lease not declared), with the READ stall's TTL: every trial's entry wait, its window, and a margin.
 */
export function vllmAbortPlan(
  lease: LeaseContract | undefined,
  o: {
    requests: number
    ttlS?: number
    logFile: string | undefined
    problems: string[]
    declared?: Record<string, unknown>
  },
): VllmAbortPlan | {refusal: string; hint: string} {
  const base = vllmDropPlan(lease, {
    requests: o.requests,
    logFile: o.logFile,
    problems: o.problems,
    ...(o.declared ? {declared: o.declared} : {}),
  })
  if ('refusal' in base) return base
  const s = base.settings
  const d = s.duration!.seconds
  const ext = s.extension?.seconds ?? 0
  const perTrialS = (ENTRY_DEADLINE_MS + ABORT_SEEN_DEADLINE_MS) / 1000
  const needS = Math.ceil(o.requests * perTrialS + d + ext + (4 * VLLM_STEP_BOUND_MS + VLLM_LOG_RESOLUTION_MS) / 1000)
  const stallTtlS = o.ttlS ?? needS + 30
  const notes = [
    `${o.requests} trial(s), one after another under one READ stall: P's leg, D's leg, D's READ shown, client abort`,
    'the abort is timed from D\'s gauge vllm:num_requests_waiting_by_reason{reason="deferred"} rising, ' +
      'not from the send',
  ]
  if (o.ttlS !== undefined && o.ttlS < needS)
    notes.push(`--ttl ${o.ttlS} s is shorter than the run may take (${needS} s): the stall may lift inside a window`)
  return {
    requests: o.requests,
    settings: s,
    sources: base.sources.map(l => l.replace(' (unused: no D heartbeats)', ' (D heartbeats until the abort)')),
    stallTtlS,
    window:
      s.mode === 'legacy'
        ? `[max(abort, sent + ${d} s), answered + ${d} s + step + reaper] per trial (legacy: no heartbeats)`
        : `[max(abort, sent + ${d} s), max(answered + ${d} s, D's abort + step + ${ext} s) + step + reaper] per trial`,
    evidence: [
      `P's log ${o.logFile ?? '(no services.prefill.logs.file: unreadable, verdicts unverified)'}: ` +
        '"Releasing expired KV blocks for request <id> ..."',
      'D\'s /metrics: vllm:num_requests_waiting_by_reason{reason="deferred"} (else vllm:num_requests_waiting) ' +
        'before the abort (in the READ) and after it (D processed the abort)',
      "the READ stall verified in place until every window closed (else the READ may complete: P's free on its " +
        'notification is not logged)',
    ],
    notes,
  }
}

/** The plan as lines a person reads (dry run and the head of a run). */
export function renderVllmAbortPlan(p: VllmAbortPlan): string[] {
  return [
    `${VLLM_ABORT_FAULT} on vLLM: a client abort of D's request while its READ is held; P must free its blocks at ` +
      (p.settings.mode === 'legacy' ? 'the legacy abort timeout' : 'lease expiry, no longer renewed'),
    'lease settings:',
    ...p.sources.map(s => `  ${s}`),
    `window: ${p.window}`,
    `READ stall: P's data path held under a fault lease of ${p.stallTtlS} s (reverted on every exit path)`,
    'evidence:',
    ...p.evidence.map(e => `  ${e}`),
    ...p.notes.map(n => `note: ${n}`),
  ]
}

/** One trial as run: its times (epoch ms) and what showed the request in D's READ. */
export interface AbortTrialRecord {
  requestId: string
  sentMs: number
  answeredMs: number
  decodeSentMs: number
  entrySeenMs?: number
  abortedMs: number
  dAbortSeenMs?: number
}

/** A trial as one line of the scenario's notes (the abort's epoch ms among them). */
export function trialNote(t: AbortTrialRecord): string {
  const rel = (x: number | undefined) => (x === undefined ? 'not seen' : `+${x - t.sentMs} ms`)
  return (
    `${t.requestId}: P's leg sent ${t.sentMs} answered ${rel(t.answeredMs)}, D's leg ${rel(t.decodeSentMs)}, ` +
    `READ seen ${rel(t.entrySeenMs)}, aborted at ${t.abortedMs} (${rel(t.abortedMs)}), ` +
    `D's gauge fell ${rel(t.dAbortSeenMs)}`
  )
}

/** The scenario in the run model, so report, JUnit and HTML render it with the engine named. */
export function vllmAbortScenario(
  p: VllmAbortPlan,
  r: {
    startedAt: number
    finishedAt: number
    verdicts: AbortedLeaseVerdict[]
    trials: AbortTrialRecord[]
    leases: LeaseRecord[]
    notes?: string[]
  },
): ScenarioRun {
  const verdicts: Verdict[] = r.verdicts.map(v => ({...v, check: 'kv-lease'}))
  return {
    name: `${VLLM_ABORT_FAULT} (vllm)`,
    kind: 'inject',
    fault: VLLM_ABORT_FAULT,
    params: {pins: p.requests, abortedAt: r.trials.map(t => t.abortedMs)},
    startedAt: r.startedAt,
    finishedAt: r.finishedAt,
    verdicts,
    pins: [],
    leases: r.leases,
    contract: {
      scope: 'all',
      deadlineSeconds: p.settings.duration!.seconds,
      pollSeconds: (2 * VLLM_STEP_BOUND_MS) / 1000,
    },
    mechanism: 'read-stall + client abort',
    description: "engine vllm: D's request aborted while its READ is held; P must free the blocks at lease expiry",
    notes: [
      'engine: vllm',
      ...p.sources,
      `window: ${p.window}`,
      ...p.notes,
      ...r.trials.map(trialNote),
      ...(r.notes ?? []),
    ],
  }
}
