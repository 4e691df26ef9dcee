import {Flags} from '@oclif/core'

import type {LayoutUpOptions} from '../sim/lifecycle/layout-options.js'

/**
 * The layout flags of `pdchaos sim up` (docs/twin.md, "Layouts"): each server's SGLang layout (`--prefill-dp 2
 * --prefill-dp-attention`, `--decode-pp 2`, `--decode-base-gpu-id 6`, `--prefill-cuda-visible-devices 4,5`), and how
 * the
 * host shows it (docker-proxy on the service ports, `--config FILE` launches, nvidia-smi's process list).
 */
function roleFlags<R extends 'prefill' | 'decode'>(role: R) {
  const group = 'LAYOUT'
  return {
    [`${role}-dp`]: Flags.integer({
      summary: `${role}: --dp-size (plain DP runs dp whole TP groups).`,
      helpGroup: group,
    }),
    [`${role}-dp-attention`]: Flags.boolean({
      summary: `${role}: --enable-dp-attention (the TP group split into dp attention groups).`,
      default: false,
      helpGroup: group,
    }),
    [`${role}-pp`]: Flags.integer({summary: `${role}: --pp-size.`, helpGroup: group}),
    [`${role}-ep`]: Flags.integer({
      summary: `${role}: --ep-size (its EP rank shows in the scheduler titles).`,
      helpGroup: group,
    }),
    [`${role}-base-gpu-id`]: Flags.integer({
      summary: `${role}: --base-gpu-id (default: prefill 0, decode after prefill).`,
      helpGroup: group,
    }),
    [`${role}-cuda-visible-devices`]: Flags.string({
      summary: `${role}: CUDA_VISIBLE_DEVICES of the server, e.g. 4,5,6,7.`,
      helpGroup: group,
    }),
  } as Record<`${R}-dp` | `${R}-pp` | `${R}-ep` | `${R}-base-gpu-id`, ReturnType<typeof Flags.integer>> &
    Record<`${R}-dp-attention`, ReturnType<typeof Flags.boolean<boolean>>> &
    Record<`${R}-cuda-visible-devices`, ReturnType<typeof Flags.string>>
}

export const layoutFlags = {
  ...roleFlags('prefill'),
  ...roleFlags('decode'),
  'docker-proxy': Flags.boolean({
    summary: 'docker-proxy owns the prefill and decode ports; the servers listen on container ports (base +150, +250).',
    default: false,
    helpGroup: 'LAYOUT',
  }),
  'server-config-file': Flags.boolean({
    summary: "Launch the servers with --config FILE (SGLang's YAML) instead of flags.",
    default: false,
    helpGroup: 'LAYOUT',
  }),
  'hide-gpu-processes': Flags.boolean({
    summary: 'nvidia-smi lists no compute processes, as inside a container.',
    default: false,
    helpGroup: 'LAYOUT',
  }),
  'stray-cuda-context': Flags.boolean({
    summary: 'Each scheduler also holds a small context on its first visible GPU, which nvidia-smi lists first.',
    default: false,
    helpGroup: 'LAYOUT',
  }),
}

type Values = Record<string, unknown>

function roleOptions(f: Values, role: 'prefill' | 'decode'): LayoutUpOptions {
  const n = (k: string) => (typeof f[`${role}-${k}`] === 'number' ? (f[`${role}-${k}`] as number) : undefined)
  const cvd = f[`${role}-cuda-visible-devices`]
  const o: LayoutUpOptions = {
    dp: n('dp'),
    pp: n('pp'),
    ep: n('ep'),
    baseGpuId: n('base-gpu-id'),
    ...(f[`${role}-dp-attention`] === true ? {dpAttention: true} : {}),
    ...(typeof cvd === 'string' ? {cudaVisibleDevices: cvd} : {}),
  }
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== undefined)) as LayoutUpOptions
}

/** layoutFlags' values as `sim up` options. */
export function layoutUpOptions(f: Values): {
  prefillLayout: LayoutUpOptions
  decodeLayout: LayoutUpOptions
  dockerProxy: boolean
  serverConfigFile: boolean
  hideGpuProcesses: boolean
  strayCudaContext: boolean
} {
  return {
    prefillLayout: roleOptions(f, 'prefill'),
    decodeLayout: roleOptions(f, 'decode'),
    dockerProxy: f['docker-proxy'] === true,
    serverConfigFile: f['server-config-file'] === true,
    hideGpuProcesses: f['hide-gpu-processes'] === true,
    strayCudaContext: f['stray-cuda-context'] === true,
  }
}
