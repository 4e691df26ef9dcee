import type {KvLeaseSettings} from '../../../checks/kv-lease.js'
import type {MechanismPlan} from '../../../faults/fault.js'
import {checkIdentity} from '../../../faults/mechanisms/proc-identity.js'
import {buildSigstop} from '../../../faults/mechanisms/signals.js'
import type {VllmProcessTree} from '../detect.js'
import type {LeaseContract} from '../lease-contract.js'
import {renderTiming, type StopTiming, stopLeaseTtlMs, stopSettings, stopTiming, ttlRefusal} from './heartbeat-stop.js'

/**
 * wedge-rank on vLLM (issue 31 item 3), pure: the plan and its target. `--side decode [--gpu N]` SIGSTOPs D's
 * `VLLM::Worker_TP<N>` (or, without --gpu, D's `VLLM::EngineCore`) by pid and start time, under a fault lease whose
 * host-side reverter SIGCONTs it even if pdchaos dies (faults/mechanisms/signals.ts). The engine core's busy loop
 * steps only when every worker answered (the executor's collective_rpc), and D's heartbeats are sent from that loop
 * (pull_worker.py `start_load_kv` → `_send_heartbeats`, "in the forward loop, not in a background thread":
 * docs/design/nixl_kv_cache_lease.md), so a stopped worker or engine core stops D's heartbeats while D's server stays
 * up. P must then free the blocks of the requests D held at max(grant + duration, last renewal + extension) + one
 * step + the reaper (checks/kv-wedge.ts).
 *
 * `--side prefill` is refused: a wedged P runs neither its reaper nor its heartbeat handler (both in its forward loop:
 * base_worker.py `get_finished` → `_get_new_notifs`, then the expiry sweep), so no release is due while it is stopped;
 * after SIGCONT its first step applies the heartbeats D queued meanwhile before it sweeps, so with D alive nothing
 * expires at all, and vLLM's /health answers 503 only for a dead engine (EngineDeadError), not a stopped one: there is
 * neither a lease deadline nor a detection to judge.
 */

export const VLLM_WEDGE_FAULT = 'wedge-rank'

export const PREFILL_REFUSAL = {
  refusal:
    'wedge-rank --side prefill on vLLM has nothing to judge: a stopped P runs neither its reaper nor its heartbeat ' +
    'handler (both in its forward loop, base_worker.py get_finished), so no release is due while it is stopped; ' +
    'after SIGCONT it applies the heartbeats D queued before it sweeps, so with D alive no lease expires; and ' +
    "vLLM's /health turns 503 only for a dead engine, not a stopped one",
  hint: 'use --side decode (D stops heartbeating: P must free at lease expiry), or kill-decode',
}

export interface WedgeTarget {
  /** The process title, e.g. VLLM::Worker_TP1 or VLLM::EngineCore. */
  title: string
  pid: number
  tpRank?: number
}

/** D's process to stop: its TP worker N, or (without --gpu) its engine core; or why none fits. */
export function pickWedgeTarget(
  tree: VllmProcessTree | undefined,
  gpu: number | undefined,
): WedgeTarget | {refusal: string; hint: string} {
  if (!tree)
    return {
      refusal: "D's `vllm serve` process was not found in the process table",
      hint: 'run `pdchaos status -c FILE` to see what discovery read on the host',
    }
  if (gpu === undefined) {
    const core = tree.engineCores[0]
    if (!core || tree.engineCores.length > 1)
      return {
        refusal: `D has ${tree.engineCores.length} engine core processes: ${core ? 'which one is ambiguous' : 'none'}`,
        hint: 'pass --gpu N to stop one TP worker instead',
      }
    return {title: core.args.split(/\s+/)[0]!, pid: core.pid}
  }
  const w = tree.workers.find(x => x.tpRank === gpu)
  if (!w)
    return {
      refusal:
        `D has no VLLM::Worker_TP${gpu} process (TP workers: ${tree.workers.map(x => x.tpRank).join(', ') || 'none'}` +
        '; at TP 1 the worker runs inside the engine core)',
      hint: "omit --gpu to stop D's engine core, or pick a TP rank `pdchaos status` lists",
    }
  return {title: w.process.args.split(/\s+/)[0]!, pid: w.process.pid, tpRank: gpu}
}

export interface VllmWedgePlan {
  side: 'decode'
  target: WedgeTarget & {startTicks: number}
  sigstop: MechanismPlan
  settings: KvLeaseSettings
  sources: string[]
  timing: StopTiming
  leaseTtlMs: number
  logFile: string | undefined
}

/** The plan, or the one-line reason it cannot be run. */
export function vllmWedgePlan(o: {
  side: 'prefill' | 'decode' | undefined
  target: (WedgeTarget & {startTicks?: number}) | {refusal: string; hint: string}
  p: LeaseContract | undefined
  d: LeaseContract | undefined
  requests: number
  ttlS?: number
  logFile: string | undefined
}): VllmWedgePlan | {refusal: string; hint: string} {
  if (o.side === 'prefill') return PREFILL_REFUSAL
  if ('refusal' in o.target) return o.target
  const s = stopSettings(o.p, o.d)
  if ('refusal' in s) return s
  const label = `D's ${o.target.title}`
  const id = checkIdentity(o.target, label)
  const timing = stopTiming(s.settings, o.requests)
  const short = ttlRefusal(o.ttlS, timing)
  if (short) return short
  return {
    side: 'decode',
    target: {...o.target, startTicks: id.startTicks},
    sigstop: buildSigstop(id, label),
    ...s,
    timing,
    leaseTtlMs: o.ttlS === undefined ? stopLeaseTtlMs(timing) : o.ttlS * 1000,
    logFile: o.logFile,
  }
}

export function renderVllmWedgePlan(p: VllmWedgePlan): string[] {
  return [
    `${VLLM_WEDGE_FAULT} --side decode on vLLM: D's heartbeats stop (${p.target.title} stopped); P must free the ` +
      'blocks of the requests D held at max(grant + duration, last renewal + extension) + one step + the reaper',
    `target: ${p.target.title} pid ${p.target.pid} (start ${p.target.startTicks})`,
    `mechanism: ${p.sigstop.summary}`,
    `  revert (also the fault lease's host-side reverter, TTL ${(p.leaseTtlMs / 1000).toFixed(0)} s): SIGCONT`,
    'lease settings:',
    ...p.sources.map(s => `  ${s}`),
    ...renderTiming(p.timing, 'SIGSTOP'),
    "evidence: P's log (Releasing expired KV blocks …; its DEBUG renewals when logged) " +
      `${p.logFile ?? '(no services.prefill.logs.file: verdicts unverified)'}`,
    "prerequisite: D's READs held (the READ stall on P's data path), so D heartbeats until the stop",
  ]
}
