import {loadVllmDeployment} from '../engines/vllm/deployment-file.js'
import {discoverVllm} from '../engines/vllm/discover.js'
import type {VllmFaultOptions} from '../engines/vllm/experiments/experiment.js'
import {getVllmExperiment} from '../engines/vllm/experiments/registry.js'
import {badInput, PdError} from '../errors.js'
import {ExitCode} from '../exit-codes.js'
import {openHost} from '../hosts/open-host.js'
import type {SuiteRun} from '../model/run.js'
import {checkMayDisturb, guardedVllmRun, refuseVllmIfHalted} from './vllm-suite.js'

/**
 * `pdchaos inject <fault> -c <engine: vllm file>`: load the file, open its host, discover P and D, let the fault's
 * vLLM experiment (engines/vllm/experiments/) plan and run, and wrap its scenario as a run (model/run.ts). The
 * command renders and writes the outputs.
 */

export interface VllmInjectOptions {
  fault: string
  faultOptions: VllmFaultOptions
  dryRun: boolean
  signal: AbortSignal
  progress: (line: string) => void
  /** Stops the run from another source (a halt noticed on the host). */
  stop?: (reason: string) => void
  allowProduction: boolean
}

export type VllmInjectResult = {kind: 'dry-run'; plan: unknown; lines: string[]} | {kind: 'run'; run: SuiteRun}

export async function vllmInject(file: string, o: VllmInjectOptions): Promise<VllmInjectResult> {
  const experiment = getVllmExperiment(o.fault)
  const d = await loadVllmDeployment(file)
  if (!o.dryRun) checkMayDisturb(d, file, o.allowProduction, 'inject a fault into')
  const host = await openHost(d.host, {sudo: d.sudo})
  try {
    // A halted deployment (`pdchaos halt`) refuses before anything is discovered or planned (exit 2).
    if (!o.dryRun) await refuseVllmIfHalted(host, d, file, o.signal)
    const discovery = await discoverVllm(d, host, {timeoutMs: (d.probeTimeoutSeconds ?? 5) * 1000})
    const p = discovery.servers.find(s => s.role === 'prefill')!
    if (!p.health.ok) throw new PdError(`prefill is not healthy: ${p.health.detail}`, {exit: ExitCode.unreachable})
    const ctx = {file, deployment: d, host, discovery, signal: o.signal, progress: o.progress}
    const prepared = await experiment.prepare(ctx, o.faultOptions)
    if ('refusal' in prepared) throw badInput(prepared.refusal, prepared.hint)
    if (o.dryRun) return {kind: 'dry-run', plan: prepared.plan, lines: prepared.lines}
    for (const l of prepared.lines) o.progress(l)
    // Refused when halted, stopped by a halt, under the run lock (cli/vllm-suite.ts), as SGLang's inject.
    const guard = {
      ...o,
      say: o.progress,
      command: `inject ${o.fault}`,
      ttlMs: ((o.faultOptions.ttlS ?? 600) + 300) * 1000,
    }
    const scenario = await guardedVllmRun(host, d, file, guard, () => prepared.run())
    const run: SuiteRun = {
      name: `inject ${scenario.name}`,
      startedAt: scenario.startedAt,
      finishedAt: scenario.finishedAt,
      deployment: d.name ?? 'vllm',
      target: `${d.host.kind}`,
      scenarios: [scenario],
      notes: ['engine: vllm'],
    }
    return {kind: 'run', run}
  } finally {
    await host.close()
  }
}

/** The run as text: the scenario, its notes, and each verdict with its summary. */
export function renderVllmRun(run: SuiteRun): string {
  return run.scenarios
    .flatMap(s => [
      `${s.name}: ${s.description}`,
      ...(s.notes ?? []).map(n => `  ${n}`),
      'verdicts:',
      ...s.verdicts.map(v => `  ${v.verdict.toUpperCase().padEnd(10)} ${v.subject}  ${v.summary}`),
    ])
    .join('\n')
}
