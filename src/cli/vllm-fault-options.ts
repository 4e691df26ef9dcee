import type {VllmFaultOptions} from '../engines/vllm/experiments/experiment.js'
import {getVllmExperiment} from '../engines/vllm/experiments/registry.js'
import {badInput} from '../errors.js'
import {faultFlags} from './fault-flags.js'

/** The inject flags a vLLM experiment reads, by option; every other fault flag is refused for it. */
const FLAG_OF: Record<keyof VllmFaultOptions, string> = {
  requests: 'pins',
  gpu: 'gpu',
  side: 'side',
  mechanism: 'mechanism',
  ttlS: 'ttl',
}

/** `inject`'s flags as a vLLM experiment's options: what it takes, or a one-line refusal naming what it does take. */
export function vllmFaultOptions(flags: Record<string, unknown>, fault: string, pinsGiven: boolean): VllmFaultOptions {
  const e = getVllmExperiment(fault)
  const takes = e.takes.map(k => `--${FLAG_OF[k]}`)
  const refuse = (flag: string) =>
    badInput(
      `${fault} on vLLM takes no --${flag}`,
      `${fault} on vLLM takes ${takes.length ? takes.join(', ') : 'no fault flags'}`,
    )
  const given = (flag: string) => (flag === 'pins' ? pinsGiven : flags[flag] !== undefined && flags[flag] !== false)
  for (const flag of Object.keys(faultFlags())) {
    const key = (Object.keys(FLAG_OF) as (keyof VllmFaultOptions)[]).find(k => FLAG_OF[k] === flag)
    if (given(flag) && (key === undefined || !e.takes.includes(key))) throw refuse(flag)
  }
  // --ttl is inject's own flag, not a fault flag: a fault that installs nothing (drop-dest-info) holds no lease.
  if (given('ttl') && !e.takes.includes('ttlS')) throw refuse('ttl')
  const o: VllmFaultOptions = {}
  if (pinsGiven) o.requests = flags.pins as number
  if (given('gpu') && e.takes.includes('gpu')) {
    const gpu = Number(flags.gpu)
    if (!Number.isInteger(gpu) || gpu < 0 || gpu > 1023)
      throw badInput(`--gpu ${String(flags.gpu)} is no GPU index`, 'pass --gpu N (0, 1, …)')
    o.gpu = gpu
  }
  if (given('side') && e.takes.includes('side')) {
    if (flags.side !== 'prefill' && flags.side !== 'decode')
      throw badInput(
        `--side ${String(flags.side)} is neither prefill nor decode`,
        'pass --side prefill or --side decode',
      )
    o.side = flags.side
  }
  if (given('mechanism') && e.takes.includes('mechanism')) o.mechanism = String(flags.mechanism)
  if (given('ttl') && e.takes.includes('ttlS')) o.ttlS = flags.ttl as number
  return o
}

/** A fault only vLLM has (kill-decode), named for an SGLang target: one line saying so, exit 2. */
export function refuseVllmOnlyFault(fault: string, sglangFaults: readonly string[]): void {
  if (sglangFaults.includes(fault)) return
  throw badInput(
    `${fault} is a vLLM fault, and this target is an SGLang deployment`,
    `use one of ${sglangFaults.join(', ')}, or pass -c with an \`engine: vllm\` deployment file`,
  )
}
