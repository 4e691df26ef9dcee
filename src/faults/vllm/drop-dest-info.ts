import type {KvLeaseSettings, KvLeaseVerdict} from '../../checks/kv-lease.js'
import type {Sourced} from '../../engines/engine.js'
import type {LeaseContract} from '../../engines/vllm/lease-contract.js'
import {VLLM_LOG_RESOLUTION_MS} from '../../engines/vllm/log-lines.js'
import type {ScenarioRun} from '../../model/run.js'
import type {Verdict} from '../../model/verdict.js'

/**
 * drop-dest-info on vLLM (issue 31 item 3), pure: the plan and the scenario record. The "fault" is pdchaos withholding
 * the D leg: P is sent the request as vLLM's toy proxy sends it (`do_remote_decode: true`), answers with its
 * kv_transfer_params and keeps the blocks (pull_scheduler.py `request_finished` sets the lease deadline before it
 * answers); no D ever reads them or heartbeats, so P's reaper (nixl/base_worker.py `_reap_expired_send_leases`, run
 * from the worker's `get_finished` every engine step) must free them at grant + kv_lease_duration. Nothing is installed
 * on the host, so no fault lease is taken. docs/faults.md ("vLLM") has the sources.
 */

export const VLLM_DROP_FAULT = 'drop-dest-info'

/** One engine step on an otherwise idle P, and the reaper's period (it runs in every step): assumed bounds, since a
 * step's length is not readable from outside the engine. The window's upper edge is grant + duration + both. */
export const VLLM_STEP_BOUND_MS = 500

export interface VllmDropPlan {
  requests: number
  settings: KvLeaseSettings
  /** Each setting with where it was read. */
  sources: string[]
  window: string
  /** How long the run waits after the last grant before reading the evidence (ms). */
  waitAfterLastGrantMs: number
  evidence: string[]
  notes: string[]
}

const said = (s: Sourced<number>): string => `${s.value} s (${s.source}: ${s.detail})`

/**
 * The plan from P's discovered lease contract, or the one-line reason it cannot be judged: the lease settings were
 * not read and no legacy timeout is known to apply (a build without kv_lease_duration on its command line may run
 * either the lease (default 30 s) or the legacy timeout; pdchaos cannot tell which from outside).
 */
export function vllmDropPlan(
  lease: LeaseContract | undefined,
  o: {requests: number; logFile: string | undefined; problems: string[]},
): VllmDropPlan | {refusal: string; hint: string} {
  if (!lease)
    return {
      refusal: `P's lease settings could not be read: ${o.problems.join('; ') || 'no vllm serve process for P'}`,
      hint: 'run `pdchaos status -c FILE` to see what discovery read on the host',
    }
  if (lease.mode !== 'lease')
    return {
      refusal:
        "P's --kv-transfer-config has no kv_connector_extra_config.kv_lease_duration, so whether P runs the lease " +
        '(default 30 s) or the legacy VLLM_NIXL_ABORT_REQUEST_TIMEOUT cannot be told',
      hint: 'launch P with kv_lease_duration in --kv-transfer-config (its value is then read from the command line)',
    }
  const d = lease.leaseDurationS
  const settings: KvLeaseSettings = {
    mode: 'lease',
    duration: {seconds: d.value, source: `${d.source}: ${d.detail}`},
    extension: {seconds: lease.extensionS.value, source: `${lease.extensionS.source}: ${lease.extensionS.detail}`},
    stepMs: VLLM_STEP_BOUND_MS,
    reaperMs: VLLM_STEP_BOUND_MS,
  }
  const slackMs = 2 * VLLM_STEP_BOUND_MS
  return {
    requests: o.requests,
    settings,
    sources: [
      `kv_lease_duration ${said(d)}`,
      `extension ${said(lease.extensionS)} (unused: no D heartbeats)`,
      `engine step + reaper pass ${slackMs} ms (assumed bound: a step is not readable from outside)`,
    ],
    window: `[sent + ${d.value} s, answered + ${d.value} s + ${slackMs} ms] per request (no heartbeats: D never sent)`,
    // The last window's close, the log's whole-second resolution, and a margin for reading.
    waitAfterLastGrantMs: d.value * 1000 + slackMs + VLLM_LOG_RESOLUTION_MS + 500,
    evidence: [
      `P's log ${o.logFile ?? '(no services.prefill.logs.file: unreadable, verdicts unverified)'}: ` +
        '"Releasing expired KV blocks for request <id> ... before lease expired"',
      "P's /metrics vllm:nixl_num_kv_expired_reqs before the requests and after the windows closed",
    ],
    notes: [
      'no fault is installed on the host (pdchaos withholds the D leg), so no fault lease is taken',
      `${o.requests} P-only request(s) (kv_transfer_params.do_remote_decode: true); the D leg is never sent`,
    ],
  }
}

/** The plan as lines a person reads (dry run and the head of a run). */
export function renderVllmDropPlan(p: VllmDropPlan): string[] {
  return [
    `${VLLM_DROP_FAULT} on vLLM: P's blocks for requests whose D leg never arrives must be freed at lease expiry`,
    'lease settings:',
    ...p.sources.map(s => `  ${s}`),
    `window: ${p.window}`,
    `requests: ${p.requests} to P, each answered with its kv_transfer_params; no D leg`,
    `wait: ${(p.waitAfterLastGrantMs / 1000).toFixed(1)} s after the last answer`,
    'evidence:',
    ...p.evidence.map(e => `  ${e}`),
    ...p.notes.map(n => `note: ${n}`),
  ]
}

/** The scenario in the run model the SGLang inject uses, so report, JUnit and HTML render it with the engine named. */
export function vllmDropScenario(
  p: VllmDropPlan,
  r: {startedAt: number; finishedAt: number; verdicts: KvLeaseVerdict[]; notes?: string[]},
): ScenarioRun {
  const verdicts: Verdict[] = r.verdicts.map(v => ({...v, check: 'kv-lease'}))
  return {
    name: `${VLLM_DROP_FAULT} (vllm)`,
    kind: 'inject',
    fault: VLLM_DROP_FAULT,
    params: {pins: p.requests},
    startedAt: r.startedAt,
    finishedAt: r.finishedAt,
    verdicts,
    pins: [],
    leases: [],
    contract: {
      scope: 'all',
      deadlineSeconds: p.settings.duration!.seconds,
      pollSeconds: (2 * VLLM_STEP_BOUND_MS) / 1000,
    },
    mechanism: 'withhold-decode-leg',
    description: 'engine vllm: P-only requests, the D leg never sent; P must free the blocks at lease expiry',
    notes: ['engine: vllm', ...p.sources, `window: ${p.window}`, ...p.notes, ...(r.notes ?? [])],
  }
}

export function renderVllmDropVerdicts(verdicts: readonly KvLeaseVerdict[]): string[] {
  return verdicts.map(v => `  ${v.verdict.toUpperCase().padEnd(10)} ${v.subject}  ${v.summary}`)
}
