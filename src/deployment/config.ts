import {z} from 'zod'

import {HostSchema, SudoPolicySchema} from '../hosts/host-spec.js'
import {
  MAX_DEADLINE_SECONDS,
  MAX_POLL_SECONDS,
  MAX_PROBE_TIMEOUT_SECONDS,
  MIN_DEADLINE_SECONDS,
  MIN_POLL_SECONDS,
  MIN_PROBE_TIMEOUT_SECONDS,
} from './limits.js'

/**
 * The deployment file (pdchaos.yaml): where the PD deployment lives, how to reach it, and the
 * watchdog contract pdchaos judges it by. One schema serves validation, `pdchaos schema` and the twin's
 * generated file, so the three can never drift apart. The host entry's own schema lives in hosts/host-spec.ts.
 */

// Re-exported: the deployment file is where callers meet them.
export {
  HostSchema,
  LocalHostSchema,
  SshHostSchema,
  SudoPolicySchema,
  type HostConfig,
  type SshHostConfig,
  type SudoPolicy,
} from '../hosts/host-spec.js'

const argv = z.array(z.string().min(1)).min(1).describe('A command as argv; pdchaos quotes each element itself.')

export const LogSourceSchema = z.union(
  [
    z.object({file: z.string().min(1).describe('Path of the service log on the host.')}).strict(),
    z.object({journald: z.string().min(1).describe('systemd unit whose journal holds the service log.')}).strict(),
  ],
  {error: 'expected {file: PATH} or {journald: UNIT}'},
)

export {
  MAX_DEADLINE_SECONDS,
  MAX_POLL_SECONDS,
  MAX_PROBE_TIMEOUT_SECONDS,
  MIN_DEADLINE_SECONDS,
  MIN_POLL_SECONDS,
  MIN_PROBE_TIMEOUT_SECONDS,
} from './limits.js'

/** A service URL pdchaos can probe: http or https with a host and a port from 1 to 65535 (refused before any probe). */
const serviceUrl = (what: string) =>
  z
    .url({protocol: /^https?$/, error: `${what} must be an http:// or https:// URL`})
    .refine(u => portOf(u) !== '0', {message: `${what} must have a port from 1 to 65535`})

/** The URL's port, or undefined when it does not parse (the url check above reports that; refinements run anyway). */
function portOf(url: string): string | undefined {
  try {
    return new URL(url).port
  } catch {
    return undefined
  }
}

export const ServiceSchema = z
  .object({
    url: serviceUrl('url').describe('Base URL of the service HTTP API, e.g. http://10.0.0.5:30000'),
    healthPath: z.string().startsWith('/').default('/health'),
    restart: argv.optional().describe('The operator restart command for this service, run on the host.'),
    logs: LogSourceSchema.optional(),
  })
  .strict()

export const PrefillServiceSchema = ServiceSchema.extend({
  bootstrapPort: z
    .number()
    .int()
    .min(1)
    .max(65_535)
    .default(8998)
    .describe('--disaggregation-bootstrap-port of the prefill server.'),
}).strict()

export const RouterServiceSchema = ServiceSchema.extend({
  readinessPath: z.string().startsWith('/').default('/readiness'),
  metricsUrl: serviceUrl('metricsUrl').optional().describe('The router Prometheus endpoint (--prometheus-port).'),
}).strict()

// The bounds come from limits.ts, as do watchdog-rules.ts' (the rules' one home, which adds poll <= deadline).
export const WatchdogSchema = z
  .object({
    scope: z
      .enum(['all', 'inflight', 'off'])
      .default('all')
      .describe('all: every prefill PD queue; inflight: only the inflight queue.'),
    deadlineSeconds: z
      .number()
      .min(
        MIN_DEADLINE_SECONDS,
        `at least ${MIN_DEADLINE_SECONDS} s: no watchdog evicts that fast (write seconds, e.g. 30)`,
      )
      .max(
        MAX_DEADLINE_SECONDS,
        `at most ${MAX_DEADLINE_SECONDS} s: the longest watchdog a run can judge under its lease`,
      ),
    pollSeconds: z
      .number()
      .min(
        MIN_POLL_SECONDS,
        `at least ${MIN_POLL_SECONDS} s (10 ms): a shorter poll is a busy loop (write seconds, e.g. 1)`,
      )
      .max(MAX_POLL_SECONDS, `at most ${MAX_POLL_SECONDS} s`)
      .describe('At most deadlineSeconds.'),
    logPattern: z
      .string()
      .min(1)
      .max(1000)
      .superRefine((p, ctx) => {
        const why = watchdogPatternError(p)
        if (why) ctx.addIssue({code: 'custom', message: why})
      })
      .optional()
      .describe(
        "A JavaScript regular expression matching the watchdog's own log line for one eviction, with the named " +
          'groups rid and held (seconds held, as the watchdog measured them), e.g. "evicted request ' +
          "rid='(?<rid>[^']+)'.* held=(?<held>[0-9.]+)s\". When it matches a pin's line in prefill's log, that " +
          "held time is the pin's clock (the server's).",
      ),
  })
  .strict()

/** Why a watchdog log pattern cannot be used (undefined: it can): it must compile and name the groups rid and held. */
export function watchdogPatternError(pattern: string): string | undefined {
  let re: RegExp
  try {
    re = new RegExp(pattern)
  } catch (error) {
    return `watchdog.logPattern is not a valid regular expression: ${(error as Error).message}`
  }
  const missing = ['rid', 'held'].filter(g => !new RegExp(`\\(\\?<${g}>`).test(re.source))
  return missing.length > 0
    ? `watchdog.logPattern must have the named ` +
        `group${missing.length > 1 ? 's' : ''} ${missing.map(g => `(?<${g}>…)`).join(' and ')}`
    : undefined
}

/**
 * The settings every deployment file has, whatever its layout (one host or several, one instance per role or more):
 * shared by the single-host schema below and the file's own schema (file-schema.ts), so the two cannot drift.
 */
export const DeploymentFields = {
  version: z.literal(1).default(1),
  name: z.string().min(1).default('deployment'),
  engine: z
    .literal('sglang')
    .optional()
    .describe(
      'The inference engine: sglang (default). An engine: vllm file has its own schema: ' +
        '`pdchaos schema vllm-deployment`.',
    ),
  labels: z
    .record(z.string(), z.string())
    .default({})
    .describe('Free-form labels; environment: production is refused unless --allow-production.'),
  sudo: SudoPolicySchema.default('never').describe(
    'How privileged host commands run: as the login user, or via sudo -n.',
  ),
  stateDir: z
    .string()
    .startsWith('/')
    .default('/run/pdchaos')
    .describe('Directory for leases and locks on the host (on every host of the deployment).'),
  backend: z.enum(['nixl', 'mooncake', 'auto']).default('auto'),
  tools: z
    .object({
      nvidiaSmi: z
        .string()
        .min(1)
        .default('nvidia-smi')
        .describe('nvidia-smi on the host: a name on its PATH or an absolute path.'),
    })
    .strict()
    .default({nvidiaSmi: 'nvidia-smi'}),
  watchdog: WatchdogSchema,
  sglangVersion: z
    .string()
    .min(1)
    .optional()
    .describe('The SGLang version expected; status warns when the server reports another.'),
  probeTimeoutSeconds: z
    .number()
    .min(
      MIN_PROBE_TIMEOUT_SECONDS,
      `at least ${MIN_PROBE_TIMEOUT_SECONDS} s: every probe would time out (write seconds, e.g. 5)`,
    )
    .max(MAX_PROBE_TIMEOUT_SECONDS, `at most ${MAX_PROBE_TIMEOUT_SECONDS} s`)
    .optional()
    .describe(
      "How long each service has to answer pdchaos's probes (default 5): the check before inject and suite, and " +
        'status (its --timeout overrides it).',
    ),
}

const F = DeploymentFields

/**
 * The single-host view: one host, one prefill, one decode, one router. It is what every command acts on today
 * (the loader derives it from the file's model, single-host.ts) and what the twin's generated file is. The file
 * itself may say more (file-schema.ts); keys stay in this order, the order a generated file lists them.
 */
export const DeploymentSchema = z
  .object({
    version: F.version,
    name: F.name,
    engine: F.engine,
    labels: F.labels,
    host: HostSchema,
    sudo: F.sudo,
    stateDir: F.stateDir,
    services: z
      .object({
        prefill: PrefillServiceSchema,
        decode: ServiceSchema,
        router: RouterServiceSchema,
      })
      .strict(),
    backend: F.backend,
    tools: F.tools,
    watchdog: F.watchdog,
    sglangVersion: F.sglangVersion,
    probeTimeoutSeconds: F.probeTimeoutSeconds,
  })
  .strict()

export type Deployment = z.infer<typeof DeploymentSchema>
export type DeploymentInput = z.input<typeof DeploymentSchema>
export type Watchdog = z.infer<typeof WatchdogSchema>
export type Service = z.infer<typeof ServiceSchema>
export type PrefillService = z.infer<typeof PrefillServiceSchema>
export type RouterService = z.infer<typeof RouterServiceSchema>
