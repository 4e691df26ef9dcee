import {z} from 'zod'

/**
 * How a host is reached and how privileged commands run on it: the `host:` and `sudo:` entries of the deployment file.
 * They belong to hosts/ (which opens the connection); deployment/config.ts composes them into the file's schema.
 */

export const SshHostSchema = z
  .object({
    kind: z.literal('ssh'),
    alias: z
      .string()
      .min(1)
      .optional()
      .describe('A Host alias from ~/.ssh/config (HostName, User, Port, IdentityFile, ProxyJump are honoured).'),
    hostname: z.string().min(1).optional(),
    port: z.number().int().min(1).max(65_535).optional(),
    user: z.string().min(1).optional(),
    identityFile: z.string().min(1).optional(),
    agent: z.boolean().optional().describe('Use $SSH_AUTH_SOCK for authentication.'),
    proxyJump: z.string().min(1).optional().describe('user@host:port of a jump host, as ssh -J takes it.'),
    knownHosts: z
      .string()
      .min(1)
      .optional()
      .describe('known_hosts file to check the host key against (default ~/.ssh/known_hosts).'),
    fingerprint: z
      .string()
      .regex(/^SHA256:[A-Za-z0-9+/]{43}=?$/)
      .optional()
      .describe('Pinned host key fingerprint, as ssh-keygen -l prints it.'),
    connectTimeoutSeconds: z.number().positive().max(300).default(10),
  })
  .strict()
  .refine(h => h.alias !== undefined || h.hostname !== undefined, {message: 'an ssh host needs alias or hostname'})

export const LocalHostSchema = z.object({kind: z.literal('local')}).strict()

// Discriminated on kind, so an error names the field that is wrong instead of a bare "Invalid input".
export const HostSchema = z.discriminatedUnion('kind', [SshHostSchema, LocalHostSchema], {
  error: 'expected "ssh" or "local"',
})

/** never: privileged commands run as the login user; passwordless: through `sudo -n --` unless the user is root. */
export const SudoPolicySchema = z.enum(['never', 'passwordless'])

export type HostConfig = z.infer<typeof HostSchema>
export type SshHostConfig = z.infer<typeof SshHostSchema>
export type SudoPolicy = z.infer<typeof SudoPolicySchema>
