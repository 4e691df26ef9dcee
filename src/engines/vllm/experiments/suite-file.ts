import {z} from 'zod'

import {loadYamlFile, type YamlFileKind} from '../../../deployment/yaml-file.js'
import {badInput} from '../../../errors.js'
import type {VllmSuite, VllmSuiteEntry} from './builtin-suite.js'
import type {VllmFaultOptions} from './experiment.js'
import {VLLM_EXPERIMENTS, VLLM_FAULT_NAMES} from './registry.js'
import {SUITE_FILE} from '../../../suite/suite-file.js'

/**
 * A vLLM suite file (`pdchaos suite FILE` on a vLLM deployment): `engine: vllm`, a name, and scenarios run in order,
 * each a registered vLLM fault with the options `inject` would take (pins, gpu, side, mechanism, ttl), then the
 * co-restart unless `coRestart: false`. A fault not built for vLLM, or an option its experiment does not take, is bad
 * input naming the scenario (exit 2), before anything is reached.
 *
 *     engine: vllm
 *     name: nightly-vllm
 *     scenarios:
 *       - {fault: drop-dest-info, pins: 3}
 *     coRestart: true
 */

const Scenario = z
  .object({
    fault: z.string().min(1).max(80),
    pins: z.number().int().min(1).max(100).optional(),
    gpu: z.number().int().min(0).max(1023).optional(),
    side: z.enum(['prefill', 'decode']).optional(),
    mechanism: z.string().min(1).max(40).optional(),
    ttl: z.number().int().min(1).max(3600).optional(),
  })
  .strict()

export const VllmSuiteFileSchema = z
  .object({
    engine: z.literal('vllm'),
    name: z.string().min(1).max(120),
    scenarios: z.array(Scenario).min(1).max(100),
    coRestart: z.boolean().default(true),
  })
  .strict()

const KIND: YamlFileKind = {
  what: 'vLLM suite',
  schemaCommand: 'pdchaos schema vllm-suite',
  hints: {
    missing: 'pass an existing file, or none for the built-in vLLM suite',
    syntax: 'fix the YAML at that position',
    empty: 'write `engine: vllm`, `name:` and `scenarios: [{fault: drop-dest-info, pins: 2}]`',
  },
}

/**
 * The file's `engine:` alone (absent: SGLang's), so each engine's suite is told apart before its schema judges it; read
 * as a suite file of either engine, so its refusals (missing, a FIFO, a device) name no engine.
 */
export async function suiteFileEngine(file: string): Promise<'sglang' | 'vllm'> {
  const probe = z.looseObject({engine: z.enum(['sglang', 'vllm']).default('sglang')})
  return (await loadYamlFile(file, probe, SUITE_FILE)).engine
}

/** Load and check a vLLM suite file: every fault registered, every option taken by its experiment. */
export async function loadVllmSuite(file: string): Promise<VllmSuite> {
  if ((await suiteFileEngine(file)) !== 'vllm')
    throw badInput(
      `${file} is an SGLang suite file (it has no engine: vllm), and the target is a vLLM deployment`,
      'write a vLLM suite file (engine: vllm, name:, scenarios: [{fault, pins}]), or drop FILE for the built-in one',
    )
  const f = await loadYamlFile(file, VllmSuiteFileSchema, KIND)
  return {name: f.name, entries: f.scenarios.map((s, i) => entryOf(file, i, s)), coRestart: f.coRestart}
}

const KEY_OF: Record<keyof VllmFaultOptions, keyof z.output<typeof Scenario>> = {
  requests: 'pins',
  gpu: 'gpu',
  side: 'side',
  mechanism: 'mechanism',
  ttlS: 'ttl',
}

function entryOf(file: string, i: number, s: z.output<typeof Scenario>): VllmSuiteEntry {
  const e = VLLM_EXPERIMENTS[s.fault]
  if (!e)
    throw badInput(
      `${file}: scenarios[${i}] fault ${s.fault} is not built for vLLM deployments`,
      `use one of: ${VLLM_FAULT_NAMES().join(', ')}`,
    )
  const options: VllmFaultOptions = {}
  for (const [option, key] of Object.entries(KEY_OF) as Array<[keyof VllmFaultOptions, keyof typeof s]>) {
    if (s[key] === undefined) continue
    if (!e.takes.includes(option))
      throw badInput(
        `${file}: scenarios[${i}] (${s.fault}) takes no ${key}`,
        `${s.fault} on vLLM takes ${e.takes.map(k => KEY_OF[k]).join(', ') || 'no options'}`,
      )
    ;(options as Record<string, unknown>)[option] = s[key]
  }
  return {fault: s.fault, options}
}

/** The JSON Schema of a vLLM suite file (`pdchaos schema vllm-suite`). */
export function vllmSuiteJsonSchema(): Record<string, unknown> {
  const {$schema, ...rest} = z.toJSONSchema(VllmSuiteFileSchema, {io: 'input'}) as Record<string, unknown>
  return {$schema, title: 'pdchaos vLLM suite file (engine: vllm)', ...rest}
}
