import {z} from 'zod'

import {HostSchema, SudoPolicySchema} from '../../hosts/host-spec.js'
import {loadYamlFile} from '../../deployment/yaml-file.js'

/**
 * A vLLM deployment file (`engine: vllm`), in the shape the vLLM twin writes (src/sim/vllm/up.ts `vllmDeployment`):
 * the SGLang file's host/services/sudo, plus each server's NIXL side-channel port, the proxy's kind, and a `vllm:`
 * block stating what was launched. The block is the file's claim; `status` reads the hosts and says which it used.
 */

const service = z
  .object({
    url: z.url(),
    healthPath: z.string().startsWith('/').default('/health'),
    restart: z.array(z.string()).optional(),
    logs: z.object({file: z.string()}).loose().optional(),
    sideChannelPort: z.number().int().min(1).max(65535).optional(),
    kind: z.string().max(40).optional(),
  })
  .strict()

export const VllmDeploymentSchema = z
  .object({
    version: z.literal(1).optional(),
    name: z.string().max(120).optional(),
    engine: z.literal('vllm'),
    labels: z.record(z.string(), z.string()).optional(),
    host: HostSchema,
    sudo: SudoPolicySchema.default('never'),
    stateDir: z.string().optional(),
    services: z.object({prefill: service, decode: service, router: service}).strict(),
    backend: z.string().optional(),
    probeTimeoutSeconds: z.number().positive().max(120).optional(),
    vllm: z
      .object({
        version: z.string().optional(),
        kvTransferConfig: z.record(z.string(), z.unknown()).optional(),
        lease: z.record(z.string(), z.unknown()).optional(),
      })
      .strict()
      .optional(),
  })
  .strict()

export type VllmDeployment = z.output<typeof VllmDeploymentSchema>

/**
 * The deployment's state dir on its host: the file's `stateDir`, else SGLang's default, where the vLLM faults keep
 * their leases (engines/vllm/faults/read-stall.ts, experiments/heartbeat-stop.ts): the halt, run lock and recover too.
 */
export const vllmStateDir = (d: Pick<VllmDeployment, 'stateDir'>): string => d.stateDir ?? '/run/pdchaos'

export function loadVllmDeployment(file: string): Promise<VllmDeployment> {
  return loadYamlFile(file, VllmDeploymentSchema, {
    what: 'vLLM deployment',
    schemaCommand: 'pdchaos schema vllm-deployment',
    hints: {
      missing: 'run `pdchaos sim up --engine vllm` (it writes one), or pass -c FILE',
      syntax: 'fix the YAML at that position',
      empty: 'write a deployment there',
    },
  })
}

/** The JSON Schema of an `engine: vllm` deployment file, as a user writes it (`pdchaos schema vllm-deployment`). */
export function vllmDeploymentJsonSchema(): Record<string, unknown> {
  const {$schema, ...rest} = z.toJSONSchema(VllmDeploymentSchema, {io: 'input', unrepresentable: 'any'}) as Record<
    string,
    unknown
  >
  return {$schema, title: 'pdchaos vLLM deployment file (engine: vllm)', ...rest}
}
