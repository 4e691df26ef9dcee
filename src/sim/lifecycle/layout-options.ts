import {badInput} from './sim-error.js'
import {rankCount, type ServerLayout} from '../server/layout.js'
import type {Role, SimConfig} from '../sim-config.js'

/** One server's layout flags of `sim up` (`--prefill-dp 2 --prefill-dp-attention …`), by SGLang's flag names. */
export interface LayoutUpOptions {
  dp?: number
  pp?: number
  ep?: number
  dpAttention?: boolean
  baseGpuId?: number
  /** CUDA_VISIBLE_DEVICES for the server, comma-separated GPU indices. */
  cudaVisibleDevices?: string
}

function int(flag: string, v: number | undefined, fallback: number, min: number, max: number): number {
  const x = v ?? fallback
  if (!Number.isInteger(x) || x < min || x > max)
    throw badInput(`${flag} must be an integer from ${min} to ${max}, got ${x}`, `pass ${flag} ${fallback}`)
  return x
}

/** Check one server's layout the way SGLang's ServerArgs would refuse it, and place it on the host's GPUs. */
function layoutOf(role: Role, tp: number, o: LayoutUpOptions, defaultBase: number, gpus: number): ServerLayout {
  const f = (name: string) => `--${role}-${name}`
  const dp = int(f('dp'), o.dp, 1, 1, 64)
  const pp = int(f('pp'), o.pp, 1, 1, 64)
  const ep = int(f('ep'), o.ep, 1, 1, 64)
  const dpAttention = o.dpAttention ?? false
  if (dpAttention && (dp < 2 || tp % dp !== 0))
    throw badInput(
      `${f('dp-attention')} needs ${f('dp')} of at least 2 dividing --${role}-tp ${tp}, got ${f('dp')} ${dp}`,
      `pass for example --${role}-tp ${2 * dp} ${f('dp')} ${dp}`,
    )
  if (tp % ep !== 0) throw badInput(`${f('ep')} ${ep} must divide --${role}-tp ${tp}`, `pass ${f('ep')} ${tp}`)
  const baseGpuId = int(f('base-gpu-id'), o.baseGpuId, defaultBase, 0, 63)
  let cudaVisibleDevices: number[] | undefined
  if (o.cudaVisibleDevices !== undefined) {
    cudaVisibleDevices = o.cudaVisibleDevices
      .split(',')
      .map(x => x.trim())
      .map(x => (/^\d+$/.test(x) ? Number(x) : Number.NaN))
    if (
      cudaVisibleDevices.some(g => !(g >= 0 && g < gpus)) ||
      new Set(cudaVisibleDevices).size !== cudaVisibleDevices.length
    ) {
      throw badInput(
        `${f('cuda-visible-devices')} must list distinct GPU indices below --gpus ${gpus}, got ` +
          `"${o.cudaVisibleDevices}"`,
        `pass for example ${f('cuda-visible-devices')} 4,5,6,7`,
      )
    }
  }
  const l: ServerLayout = {tp, dp, pp, dpAttention, ep, baseGpuId, ...(cudaVisibleDevices ? {cudaVisibleDevices} : {})}
  const visible = cudaVisibleDevices?.length ?? gpus
  if (baseGpuId + rankCount(l) > visible) {
    throw badInput(
      `${role} needs GPUs ${baseGpuId}..${baseGpuId + rankCount(l) - 1} (base GPU id + ${rankCount(l)} schedulers) ` +
        `but ${cudaVisibleDevices ? `${f('cuda-visible-devices')} lists` : '--gpus is'} ${visible}`,
      `pass a smaller ${f('base-gpu-id')} or layout`,
    )
  }
  return l
}

export const anyGiven = (o: LayoutUpOptions | undefined): boolean =>
  o !== undefined && Object.values(o).some(v => v !== undefined && v !== false)

/**
 * The layouts of `sim up`, or undefined for the plain one. Both servers' GPUs must be distinct: each scheduler holds
 * its GPU alone, as on a real host.
 */
export function buildLayouts(
  o: {prefillLayout?: LayoutUpOptions; decodeLayout?: LayoutUpOptions},
  prefillTp: number,
  decodeTp: number,
  gpus: number,
): SimConfig['layout'] | undefined {
  if (!anyGiven(o.prefillLayout) && !anyGiven(o.decodeLayout)) return undefined
  const prefill = layoutOf('prefill', prefillTp, o.prefillLayout ?? {}, 0, gpus)
  const decode = layoutOf('decode', decodeTp, o.decodeLayout ?? {}, rankCount(prefill), gpus)
  const held = new Map<number, string>()
  for (const [role, l] of [
    ['prefill', prefill],
    ['decode', decode],
  ] as const) {
    for (let k = 0; k < rankCount(l); k++) {
      const local = l.baseGpuId + k
      const g = l.cudaVisibleDevices ? l.cudaVisibleDevices[local]! : local
      const other = held.get(g)
      if (other)
        throw badInput(
          `GPU ${g} would hold both ${other} and ${role} scheduler ${k}`,
          'give the servers disjoint GPUs with --decode-base-gpu-id or --<role>-cuda-visible-devices',
        )
      held.set(g, `${role} scheduler ${k}`)
    }
  }
  return {prefill, decode}
}
