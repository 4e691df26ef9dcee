import type {KvLeaseSettings} from '../../../checks/kv-lease.js'
import type {Probe} from '../../../faults/fault.js'
import {KILL_SCRIPT, RESTART_UNLESS_SERVING} from '../../../faults/kill-prefill.js'
import {checkIdentity, goneProbe, type ProcIdentity} from '../../../faults/mechanisms/proc-identity.js'
import {displayArgv} from '../../../hosts/quote.js'
import type {VllmProcessTree} from '../detect.js'
import type {LeaseContract} from '../lease-contract.js'
import {renderTiming, type StopTiming, stopLeaseTtlMs, stopSettings, stopTiming, ttlRefusal} from './heartbeat-stop.js'

/**
 * kill-decode on vLLM (issue 31 item 3), pure: the plan. SIGKILL of D's API server and its engine core(s) and TP
 * workers, each by pid and start time checked on the host in the shell that sends the signal (faults/kill-prefill.ts
 * KILL_SCRIPT: a recycled pid is never signalled). D's heartbeats stop with it; P is not told (no notification is sent
 * by a dead D: P's side channel only answers handshakes and takes notifications), so P must free the blocks of the
 * requests D held at max(grant + duration, last renewal + extension) + one step + the reaper (checks/kv-wedge.ts;
 * "Decode Instance Crash" in docs/design/nixl_kv_cache_lease.md). The revert is D's restart command from the deployment
 * file, run by the experiment behind D's /health gate, and held by the fault lease too, guarded so that a D already
 * listening on its port is not restarted twice (kill-prefill's RESTART_UNLESS_SERVING). No restart command: refused.
 */

export const VLLM_KILL_DECODE_FAULT = 'kill-decode'

export interface KillTarget extends ProcIdentity {
  label: string
}

export interface VllmKillDecodePlan {
  targets: KillTarget[]
  kill: string[]
  revert: string[]
  restart: string[]
  port: number
  verifyKilled: Probe
  settings: KvLeaseSettings
  sources: string[]
  timing: StopTiming
  leaseTtlMs: number
  logFile: string | undefined
}

/** D's processes to kill, server first, as (pid, label); start times are read after. */
export function killTargets(tree: VllmProcessTree | undefined): Array<{pid: number; label: string}> | undefined {
  if (!tree) return undefined
  return [
    {pid: tree.server.pid, label: "D's API server"},
    ...tree.engineCores.map(e => ({pid: e.pid, label: `D's ${e.args.split(/\s+/)[0]}`})),
    ...tree.workers.map(w => ({pid: w.process.pid, label: `D's ${w.process.args.split(/\s+/)[0]}`})),
  ]
}

/** The plan, or the one-line reason it cannot be run. */
export function vllmKillDecodePlan(o: {
  targets: Array<{pid: number; label: string; startTicks?: number}> | undefined
  restart: string[] | undefined
  port: number
  p: LeaseContract | undefined
  d: LeaseContract | undefined
  requests: number
  ttlS?: number
  logFile: string | undefined
}): VllmKillDecodePlan | {refusal: string; hint: string} {
  if (!o.restart || o.restart.length === 0)
    return {
      refusal: 'kill-decode needs a restart command for D: its revert restarts the killed instance',
      hint: 'add services.decode.restart (an argv list) to the deployment file',
    }
  if (!o.targets || o.targets.length === 0)
    return {
      refusal: "D's `vllm serve` process was not found in the process table",
      hint: 'run `pdchaos status -c FILE` to see what discovery read on the host',
    }
  const s = stopSettings(o.p, o.d)
  if ('refusal' in s) return s
  const targets = o.targets.map(t => ({...checkIdentity(t, `${t.label} (pid ${t.pid})`), label: t.label}))
  const timing = stopTiming(s.settings, o.requests)
  const short = ttlRefusal(o.ttlS, timing)
  if (short) return short
  return {
    targets,
    kill: ['sh', '-c', KILL_SCRIPT, 'pdchaos-kill', ...targets.flatMap(t => [String(t.pid), String(t.startTicks)])],
    revert: ['sh', '-c', RESTART_UNLESS_SERVING, 'pdchaos-restart', String(o.port), ...o.restart],
    restart: o.restart,
    port: o.port,
    verifyKilled: goneProbe(targets, 'D'),
    ...s,
    timing,
    leaseTtlMs: o.ttlS === undefined ? stopLeaseTtlMs(timing) : o.ttlS * 1000,
    logFile: o.logFile,
  }
}

export function renderVllmKillDecodePlan(p: VllmKillDecodePlan): string[] {
  return [
    `${VLLM_KILL_DECODE_FAULT} on vLLM: D killed (SIGKILL) while it holds requests; P must free their blocks at ` +
      'max(grant + duration, last renewal + extension) + one step + the reaper',
    `targets: ${p.targets.map(t => `${t.label} pid ${t.pid} (start ${t.startTicks})`).join(', ')}`,
    '  each signalled only if its start time still matches (a recycled pid is never killed)',
    `revert: ${displayArgv(p.restart)} behind D's /health gate (the fault lease's host-side reverter runs it too ` +
      `unless port ${p.port} already listens; TTL ${(p.leaseTtlMs / 1000).toFixed(0)} s)`,
    'lease settings:',
    ...p.sources.map(s => `  ${s}`),
    ...renderTiming(p.timing, 'kill'),
    "evidence: P's log (Releasing expired KV blocks …; its DEBUG renewals when logged) " +
      `${p.logFile ?? '(no services.prefill.logs.file: verdicts unverified)'}`,
    "prerequisite: D's READs held (the READ stall on P's data path), so D heartbeats until the kill",
  ]
}
