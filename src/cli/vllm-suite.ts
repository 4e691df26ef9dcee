import {assertMayDisturb} from '../deployment/protection.js'
import {loadVllmDeployment, type VllmDeployment, vllmStateDir} from '../engines/vllm/deployment-file.js'
import type {VllmSuite} from '../engines/vllm/experiments/builtin-suite.js'
import {runVllmSuite} from '../engines/vllm/experiments/suite.js'
import {acquireHostLock} from '../faults/lease/host-lock.js'
import {onSignalExit} from '../faults/lease/lease-guard.js'
import {guardRun, type HaltGuard, refuseIfHalted} from '../halt/watch.js'
import type {Host} from '../hosts/host.js'
import {openHost} from '../hosts/open-host.js'
import {shellQuote} from '../hosts/quote.js'
import type {SuiteRun} from '../model/run.js'
import type {GateSpec} from '../suite/suite-file.js'
import {abortable, throwIfStopped} from '../util/stop.js'

/**
 * `pdchaos suite` on an `engine: vllm` deployment (-c FILE, or --sim --engine vllm): the file loaded, the production
 * guard, the host opened once, the halt (a halted deployment refuses, a halt while it runs stops it) and the run lock
 * in the file's stateDir, then the built-in vLLM suite (engines/vllm/experiments/suite.ts). The command renders the run
 * and writes its outputs as it does SGLang's.
 */

export interface VllmSuiteRunOptions {
  signal: AbortSignal
  /** Stops the run from another source (a halt noticed on the host). */
  stop?: (reason: string) => void
  say: (line: string) => void
  onPlan: (lines: string[]) => void
  allowProduction: boolean
  runId?: string
  gate?: GateSpec
  /** Trust and record the host key of a host not yet in known_hosts (--accept-new-host-key). */
  acceptNewHostKey?: boolean
  /** Learns the deployment's name as soon as the file is read (for a failure journal). */
  onDeployment?: (name: string) => void
}

export async function vllmSuiteRun(file: string, suite: VllmSuite, o: VllmSuiteRunOptions): Promise<SuiteRun> {
  const d = await loadVllmDeployment(file)
  o.onDeployment?.(d.name ?? 'vllm')
  checkMayDisturb(d, file, o.allowProduction, 'run a suite against')
  const opening = openHost(d.host, {sudo: d.sudo, ...(o.acceptNewHostKey ? {acceptNewHostKey: true} : {})})
  const host = await abortable(opening, o.signal, 'opening the host')
  try {
    const ttlMs = vllmSuiteTtlMs(suite)
    return await guardedVllmRun(host, d, file, {...o, command: `suite ${suite.name}`, ttlMs}, () =>
      runVllmSuite(d, host, suite, {
        file,
        signal: o.signal,
        progress: o.say,
        onPlan: o.onPlan,
        ...(o.runId ? {runId: o.runId} : {}),
        ...(o.gate ? {gate: o.gate} : {}),
        restart: {healthTimeoutS: 120, commandTimeoutS: 120, canaries: 3, settleS: 1, canaryTimeoutS: 30},
      }),
    )
  } finally {
    await host.close()
  }
}

/** The vLLM suite's run lock TTL: every entry waits out at most a few leases (each at most a few minutes), then the
 * co-restart's gates. A fleet bounds the run by it (cli/fleet-member.ts). */
export const vllmSuiteTtlMs = (suite: VllmSuite): number => (suite.entries.length * 600 + 3 * 240 + 300) * 1000

/** Exit 2 for a deployment labelled environment: production, unless allowed (as every SGLang run that disturbs). */
export function checkMayDisturb(d: VllmDeployment, file: string, allow: boolean, action: string): void {
  assertMayDisturb({name: d.name ?? file, labels: d.labels ?? {}} as never, allow, action)
}

/**
 * A vLLM run that changes the deployment, on its open host: refused when the deployment is halted (exit 2), stopped by
 * a halt while it runs (the run model records it), and under the deployment's run lock (its stateDir), released on
 * every exit, a signal's included. Without a stateDir in the file neither applies (nowhere to keep them).
 */
export async function guardedVllmRun<R>(
  host: Host,
  d: VllmDeployment,
  file: string,
  o: {
    signal: AbortSignal
    stop?: (reason: string) => void
    say: (line: string) => void
    command: string
    ttlMs: number
  },
  fn: () => Promise<R>,
): Promise<R> {
  const stateDir = vllmStateDir(d)
  const halt = await haltGuard(host, stateDir, file, o)
  try {
    const lock = await acquireHostLock(host, stateDir, {command: o.command, ttlMs: o.ttlMs})
    const off = onSignalExit(() => lock.release().catch(() => {}))
    try {
      throwIfStopped(o.signal, 'taking the run lock')
      return halt.record(await fn())
    } finally {
      off()
      await lock.release().catch(() => {})
    }
  } finally {
    await halt.close()
  }
}

/** Exit 2 (E_HALTED) when the deployment is halted: before a run discovers or plans anything, as SGLang's runs. */
export function refuseVllmIfHalted(host: Host, d: VllmDeployment, file: string, signal?: AbortSignal): Promise<void> {
  return refuseIfHalted([{name: 'host', host, stateDir: vllmStateDir(d)}], resumeOf(file), signal)
}

const resumeOf = (file: string): string => `pdchaos resume -c ${shellQuote(file)}`

/** A halted deployment refuses the run (exit 2); a halt while it runs stops it (the halt file in the stateDir). */
function haltGuard(
  host: Host,
  stateDir: string,
  file: string,
  o: {signal: AbortSignal; stop?: (reason: string) => void; say: (line: string) => void},
): Promise<HaltGuard> {
  return guardRun([{name: 'host', host, stateDir}], {
    // -c the file the run read: the vLLM twin's own file too (`--sim --engine vllm` reads it the same way).
    resume: resumeOf(file),
    ...(o.stop ? {stop: o.stop} : {}),
    say: o.say,
    signal: o.signal,
  })
}
