import type {KvLeaseSettings, KvLeaseVerdict} from '../../../checks/kv-lease.js'
import type {Sourced} from '../../engine.js'
import type {LeaseContract} from '../lease-contract.js'
import {VLLM_LOG_RESOLUTION_MS} from '../log-lines.js'
import type {ScenarioRun} from '../../../model/run.js'
import type {Verdict} from '../../../model/verdict.js'

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
  o: {requests: number; logFile: string | undefined; problems: string[]; declared?: Record<string, unknown>},
): VllmDropPlan | {refusal: string; hint: string} {
  if (!lease)
    return {
      refusal: `P's lease settings could not be read: ${o.problems.join('; ') || 'no vllm serve process for P'}`,
      hint: 'run `pdchaos status -c FILE` to see what discovery read on the host',
    }
  if (lease.mode === 'lease') return leasePlan(lease, o)
  const legacy = declaredLegacy(lease, o.declared)
  if (legacy) return legacyPlan(legacy, o)
  return {
    refusal:
      "P's --kv-transfer-config has no kv_connector_extra_config.kv_lease_duration and the deployment file states no " +
      'legacy lease (vllm.lease.mode: legacy), so whether P runs the lease (default 30 s) or the legacy ' +
      'VLLM_NIXL_ABORT_REQUEST_TIMEOUT cannot be told',
    hint:
      'launch P with kv_lease_duration in --kv-transfer-config, or state `vllm: {lease: {mode: legacy}}` in the ' +
      'deployment file for a build before the lease',
  }
}

/**
 * A build before the lease (PR #41383) when the deployment file says so (`vllm.lease.mode: legacy`): its timeout is
 * P's VLLM_NIXL_ABORT_REQUEST_TIMEOUT when read from its environment, else the file's `abortRequestTimeoutSeconds`,
 * else vLLM's default (480 s).
 */
function declaredLegacy(
  lease: LeaseContract,
  declared: Record<string, unknown> | undefined,
): Sourced<number> | undefined {
  if (declared?.mode !== 'legacy') return undefined
  const env = lease.legacyAbortTimeoutS
  const fromFile = declared.abortRequestTimeoutSeconds
  if (env.source === 'env' || typeof fromFile !== 'number' || !(fromFile > 0)) return env
  return {value: fromFile, source: 'file', detail: 'vllm.lease.abortRequestTimeoutSeconds'}
}

const slackMs = 2 * VLLM_STEP_BOUND_MS
const STEP_SOURCE = `engine step + reaper pass ${slackMs} ms (assumed bound: a step is not readable from outside)`

function common(o: {requests: number; logFile: string | undefined}, durationS: number, line: string) {
  return {
    requests: o.requests,
    // The last window's close, the log's whole-second resolution, and a margin for reading.
    waitAfterLastGrantMs: durationS * 1000 + slackMs + VLLM_LOG_RESOLUTION_MS + 500,
    window: `[sent + ${durationS} s, answered + ${durationS} s + ${slackMs} ms] per request (no D leg, no heartbeats)`,
    evidence: [
      `P's log ${o.logFile ?? '(no services.prefill.logs.file: unreadable, verdicts unverified)'}: ${line}`,
      "P's /metrics every 200 ms from before the requests until the windows closed: vllm:nixl_num_kv_expired_reqs " +
        'with vllm:request_success and vllm:kv_cache_usage_perc (on a P otherwise idle, a clock finer than the log)',
    ],
    notes: [
      'no fault is installed on the host (pdchaos withholds the D leg), so no fault lease is taken',
      `${o.requests} P-only request(s) (kv_transfer_params.do_remote_decode: true); the D leg is never sent`,
    ],
  }
}

function leasePlan(lease: LeaseContract, o: {requests: number; logFile: string | undefined}): VllmDropPlan {
  const d = lease.leaseDurationS
  return {
    ...common(o, d.value, '"Releasing expired KV blocks for request <id> ... before lease expired"'),
    settings: {
      mode: 'lease',
      duration: {seconds: d.value, source: `${d.source}: ${d.detail}`},
      extension: {seconds: lease.extensionS.value, source: `${lease.extensionS.source}: ${lease.extensionS.detail}`},
      stepMs: VLLM_STEP_BOUND_MS,
      reaperMs: VLLM_STEP_BOUND_MS,
      stepAssumed: STEP_SOURCE,
    },
    sources: [
      `kv_lease_duration ${said(d)}`,
      `extension ${said(lease.extensionS)} (unused: no D heartbeats)`,
      STEP_SOURCE,
    ],
  }
}

function legacyPlan(t: Sourced<number>, o: {requests: number; logFile: string | undefined}): VllmDropPlan {
  return {
    ...common(o, t.value, '"Releasing expired KV blocks for request <id> ... within <n> seconds"'),
    settings: {
      mode: 'legacy',
      duration: {seconds: t.value, source: `${t.source}: ${t.detail}`},
      stepMs: VLLM_STEP_BOUND_MS,
      reaperMs: VLLM_STEP_BOUND_MS,
      stepAssumed: STEP_SOURCE,
    },
    sources: [
      `legacy VLLM_NIXL_ABORT_REQUEST_TIMEOUT ${said(t)} (no kv_lease_duration: a build before the lease)`,
      STEP_SOURCE,
    ],
  }
}

/** The plan as lines a person reads (dry run and the head of a run). */
export function renderVllmDropPlan(p: VllmDropPlan): string[] {
  return [
    `${VLLM_DROP_FAULT} on vLLM: P's blocks for requests whose D leg never arrives must be freed at ` +
      (p.settings.mode === 'legacy' ? 'the legacy abort timeout' : 'lease expiry'),
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
