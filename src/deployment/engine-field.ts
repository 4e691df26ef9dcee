import {z} from 'zod'

import {badInput, type PdError} from '../errors.js'
import {loadYamlFile} from './yaml-file.js'

/**
 * The deployment file's `engine:` (issue 31): sglang (default) or vllm. Read on its own first, so a vLLM file is
 * recognised before the SGLang schema judges it (a vLLM file has no watchdog: its deadline is the KV lease).
 */

export const EngineFieldSchema = z.enum(['sglang', 'vllm'])
export type EngineField = z.output<typeof EngineFieldSchema>

const Probe = z.looseObject({engine: EngineFieldSchema.default('sglang')})

export async function readEngineField(file: string): Promise<EngineField> {
  const f = await loadYamlFile(file, Probe, {
    what: 'deployment',
    schemaCommand: 'pdchaos schema',
    hints: {
      missing: 'run `pdchaos sim up` (it writes one for the twin), or pass -c FILE',
      directory: 'pass the YAML file itself with -c FILE',
      syntax: 'fix the YAML at that position (indentation, a missing quote or bracket)',
      empty: 'write a deployment there; `pdchaos schema` prints what it may hold',
    },
  })
  return f.engine
}

/**
 * The SGLang loader given a vLLM file. Every command that takes a vLLM deployment dispatches on `engine:` before it
 * loads (status, inject, suite, restart, halt, resume, recover, --fleet members), so this is a guard for a path that
 * reads SGLang's model only: exit 2, one line.
 */
export function vllmFileRefused(file: string): PdError {
  return badInput(
    `${file} is a vLLM deployment (engine: vllm), and this reads SGLang deployments only`,
    `pass it to a command that takes a vLLM file (status, inject, suite, restart, halt, resume, recover)`,
  )
}
