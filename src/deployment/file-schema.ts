import {z} from 'zod'

import {HostSchema} from '../hosts/host-spec.js'
import {DeploymentFields, PrefillServiceSchema, RouterServiceSchema, ServiceSchema} from './config.js'
import {type PlacementIssue, placementIssues, type ServiceEntry} from './placement-checks.js'
import {restartOrderIssues} from './restart-order.js'

/**
 * The deployment file as a user writes it: `host:` (every service on one host, the form every existing file has) or
 * `hosts:` (named hosts, each service naming the one it runs on), and per role one service or a list of instances,
 * an instance spanning several nodes when SGLang runs it with --nnodes. `pdchaos schema deployment` prints this
 * schema; the loader turns what it accepts into the model (model.ts).
 */

/** Host names end up in messages, journals and (later) per-host lease files: plain characters only. */
export const HostNameSchema = z
  .string()
  .min(1)
  .max(63)
  .regex(/^[A-Za-z0-9][A-Za-z0-9_.-]*$/, 'a host name is letters, digits and _ . - (starting with a letter or digit)')

/** More nodes than any SGLang deployment spans; a bound keeps a mistaken list short in messages. */
export const MAX_NODES = 256

const host = HostNameSchema.optional().describe(
  'The host it runs on: a name from hosts:. Leave it out with top-level host: (every service runs there).',
)
const nodes = z
  .array(HostNameSchema)
  .min(1, 'list the host of each node rank, rank 0 first (at least one)')
  .max(MAX_NODES)
  .optional()
  .describe(
    'A multi-node instance (SGLang --nnodes N --node-rank K --dist-init-addr ADDR): the host of each node rank, ' +
      "names from hosts:, in --node-rank order (N is the list's length). Rank 0 serves url; the other ranks run " +
      'schedulers (SGLang gives them only a stand-in health endpoint). Instead of host:.',
  )

const PrefillEntrySchema = PrefillServiceSchema.extend({host, nodes}).strict()
const DecodeEntrySchema = ServiceSchema.extend({host, nodes}).strict()
const RouterEntrySchema = RouterServiceSchema.extend({host}).strict()

/** One service (today's form) or a list of instances of the role. */
function oneOrMany<S extends z.ZodType>(entry: S, role: string) {
  return z
    .union([entry, z.array(entry).min(1, `list at least one ${role} instance`)], {
      error: `expected one ${role} service (a map) or a list of ${role} instances`,
    })
    .describe(`One ${role} service, or a list of ${role} instances behind the gateway.`)
}

const F = DeploymentFields

const DeploymentFileShape = z
  .object({
    version: F.version,
    name: F.name,
    engine: z
      .literal('sglang')
      .optional()
      .describe('The inference engine: sglang (default). engine: vllm files: status only.'),
    labels: F.labels,
    host: HostSchema.optional().describe('The one host every service runs on. Give this or hosts:, not both.'),
    hosts: z
      .record(HostNameSchema, HostSchema)
      .optional()
      .describe(
        'Named hosts (NAME: an ssh or local host entry, as host: takes it); each service names the one it runs on ' +
          'with host: NAME, or nodes: [NAME, ...]. Give this or host:, not both.',
      ),
    sudo: F.sudo,
    stateDir: F.stateDir,
    services: z
      .object({
        prefill: oneOrMany(PrefillEntrySchema, 'prefill'),
        decode: oneOrMany(DecodeEntrySchema, 'decode'),
        router: RouterEntrySchema,
      })
      .strict(),
    restartOrder: z
      .array(z.string().min(1).max(40))
      .min(1)
      .max(2 * MAX_NODES + 1)
      .optional()
      .describe(
        "The co-restart's order, every service named once: a role (each of its instances, in the file's order) " +
          'or one instance as ROLE[i], e.g. ["prefill[1]", "prefill[0]", decode, router] (in a [flow] list YAML ' +
          'needs the quotes around brackets; a block list does not). Prefill and decode in any order, the router ' +
          'last. Default: the prefill instances, then the decode instances, then the router. `restart --service` ' +
          'picks roles and their order; the instances of each keep this order.',
      ),
    backend: F.backend,
    tools: F.tools,
    watchdog: F.watchdog,
    sglangVersion: F.sglangVersion,
    probeTimeoutSeconds: F.probeTimeoutSeconds,
  })
  .strict()

export type DeploymentFile = z.output<typeof DeploymentFileShape>
export type DeploymentFileInput = z.input<typeof DeploymentFileShape>
export type PrefillEntry = z.output<typeof PrefillEntrySchema>
export type DecodeEntry = z.output<typeof DecodeEntrySchema>
export type RouterEntry = z.output<typeof RouterEntrySchema>

/** Every service of the file with its path, prefill instances first, then decode, then the router. */
export function serviceEntries(
  f: DeploymentFile,
): (ServiceEntry & {entry: PrefillEntry | DecodeEntry | RouterEntry})[] {
  const list = <E>(v: E | E[]): [E, number | undefined][] =>
    Array.isArray(v) ? v.map((e, i) => [e, i]) : [[v, undefined]]
  const at = (role: string, i: number | undefined) => (i === undefined ? ['services', role] : ['services', role, i])
  return [
    ...list(f.services.prefill).map(([e, i]) => ({
      role: 'prefill' as const,
      path: at('prefill', i),
      url: e.url,
      host: e.host,
      nodes: e.nodes,
      bootstrapPort: e.bootstrapPort,
      entry: e,
    })),
    ...list(f.services.decode).map(([e, i]) => ({
      role: 'decode' as const,
      path: at('decode', i),
      url: e.url,
      host: e.host,
      nodes: e.nodes,
      entry: e,
    })),
    {
      role: 'router' as const,
      path: at('router', undefined),
      url: f.services.router.url,
      host: f.services.router.host,
      entry: f.services.router,
    },
  ]
}

export const DeploymentFileSchema = DeploymentFileShape.superRefine((f, ctx) => {
  const issues: PlacementIssue[] = placementIssues({
    hasHost: f.host !== undefined,
    ...(f.hosts === undefined ? {} : {hostNames: Object.keys(f.hosts)}),
    legacy: f.hosts === undefined && !Array.isArray(f.services.prefill) && !Array.isArray(f.services.decode),
    entries: serviceEntries(f),
  })
  // The order names services: judged once where they are (a typo in a host name is reported first, and alone).
  if (issues.length === 0 && f.restartOrder !== undefined)
    issues.push(...restartOrderIssues(f.restartOrder, serviceEntries(f)))
  for (const issue of issues) ctx.addIssue({code: 'custom', path: issue.path, message: issue.message})
}).describe(
  'A PD deployment: where its services run (host: or hosts:, not both), how to reach them, and the watchdog ' +
    'contract pdchaos judges it by.',
)
