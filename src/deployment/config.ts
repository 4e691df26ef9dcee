import {z} from 'zod'

/**
 * The deployment file (pdchaos.yaml): where the PD deployment lives, how to reach it, and the
 * watchdog contract pdchaos judges it by. One schema serves validation, `pdchaos schema` and the twin's
 * generated file, so the three can never drift apart.
 */

const argv = z.array(z.string().min(1)).min(1).describe('A command as argv; pdchaos quotes each element itself.')

export const LogSourceSchema = z.union([
  z.object({file: z.string().min(1).describe('Path of the service log on the host.')}).strict(),
  z.object({journald: z.string().min(1).describe('systemd unit whose journal holds the service log.')}).strict(),
], {error: 'expected {file: PATH} or {journald: UNIT}'})

export const SshHostSchema = z.object({
  kind: z.literal('ssh'),
  alias: z.string().min(1).optional().describe('A Host alias from ~/.ssh/config (HostName, User, Port, IdentityFile, ProxyJump are honoured).'),
  hostname: z.string().min(1).optional(),
  port: z.number().int().min(1).max(65_535).optional(),
  user: z.string().min(1).optional(),
  identityFile: z.string().min(1).optional(),
  agent: z.boolean().optional().describe('Use $SSH_AUTH_SOCK for authentication.'),
  proxyJump: z.string().min(1).optional().describe('user@host:port of a jump host, as ssh -J takes it.'),
  knownHosts: z.string().min(1).optional().describe('known_hosts file to check the host key against (default ~/.ssh/known_hosts).'),
  fingerprint: z.string().regex(/^SHA256:[A-Za-z0-9+/]{43}=?$/).optional().describe('Pinned host key fingerprint, as ssh-keygen -l prints it.'),
  connectTimeoutSeconds: z.number().positive().max(300).default(10),
}).strict().refine((h) => h.alias !== undefined || h.hostname !== undefined, {message: 'an ssh host needs alias or hostname'})

export const LocalHostSchema = z.object({kind: z.literal('local')}).strict()

// Discriminated on kind, so an error names the field that is wrong instead of a bare "Invalid input".
export const HostSchema = z.discriminatedUnion('kind', [SshHostSchema, LocalHostSchema], {error: 'expected "ssh" or "local"'})

export const ServiceSchema = z.object({
  url: z.url().describe('Base URL of the service HTTP API, e.g. http://10.0.0.5:30000'),
  healthPath: z.string().startsWith('/').default('/health'),
  restart: argv.optional().describe('The operator restart command for this service, run on the host.'),
  logs: LogSourceSchema.optional(),
}).strict()

export const PrefillServiceSchema = ServiceSchema.extend({
  bootstrapPort: z.number().int().min(1).max(65_535).default(8998).describe('--disaggregation-bootstrap-port of the prefill server.'),
}).strict()

export const RouterServiceSchema = ServiceSchema.extend({
  readinessPath: z.string().startsWith('/').default('/readiness'),
  metricsUrl: z.url().optional().describe('The router Prometheus endpoint (--prometheus-port).'),
}).strict()

export const WatchdogSchema = z.object({
  scope: z.enum(['all', 'inflight', 'off']).default('all').describe('all: every prefill PD queue; inflight: only the inflight queue.'),
  deadlineSeconds: z.number().positive().max(86_400),
  pollSeconds: z.number().positive().max(3_600),
}).strict()

export const DeploymentSchema = z.object({
  version: z.literal(1).default(1),
  name: z.string().min(1).default('deployment'),
  labels: z.record(z.string(), z.string()).default({}).describe('Free-form labels; environment: production is refused unless --allow-production.'),
  host: HostSchema,
  sudo: z.enum(['never', 'passwordless']).default('never').describe('How privileged host commands run: as the login user, or via sudo -n.'),
  stateDir: z.string().startsWith('/').default('/run/pdchaos').describe('Directory on the host for leases and locks.'),
  services: z.object({
    prefill: PrefillServiceSchema,
    decode: ServiceSchema,
    router: RouterServiceSchema,
  }).strict(),
  backend: z.enum(['nixl', 'mooncake', 'auto']).default('auto'),
  tools: z.object({
    nvidiaSmi: z.string().min(1).default('nvidia-smi').describe('nvidia-smi on the host: a name on its PATH or an absolute path.'),
  }).strict().default({nvidiaSmi: 'nvidia-smi'}),
  watchdog: WatchdogSchema,
  sglangVersion: z.string().min(1).optional().describe('The SGLang version expected; status warns when the server reports another.'),
}).strict()

export type Deployment = z.infer<typeof DeploymentSchema>
export type DeploymentInput = z.input<typeof DeploymentSchema>
export type HostConfig = z.infer<typeof HostSchema>
export type SshHostConfig = z.infer<typeof SshHostSchema>
export type Watchdog = z.infer<typeof WatchdogSchema>
