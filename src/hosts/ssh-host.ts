import {homedir, userInfo} from 'node:os'
import {join} from 'node:path'
import type {Duplex} from 'node:stream'
import type ssh2Module from 'ssh2'
import type {AuthMethod, Client as ClientType, ConnectConfig} from 'ssh2'

import {PdError, badInput, oneLine} from '../errors.js'
import {ExitCode} from '../exit-codes.js'
import {lazyRequire} from '../util/lazy-require.js'
import {readInputFile} from '../util/safe-file.js'
import {within} from '../util/time.js'
import {
  DETACH_SCRIPT,
  UPLOAD_SCRIPT,
  buildArgv,
  checkTimeout,
  envPrefix,
  modeString,
  sudoPrefix,
  type DetachedOptions,
  type Host,
  type RunOptions,
  type RunResult,
  type SudoPolicy,
  type UploadOptions,
} from './host.js'
import type {SshHostConfig} from './host-spec.js'
import {appendKnownHost, checkKnownHosts, fingerprintOf, knownHostsToken, readKnownHosts} from './known-hosts.js'
import {parsePid} from './local-host.js'
import {anyShellCommand, shellCommand} from './quote.js'
import {expandTilde, parseJumpSpec, readSshConfigFile, resolveSshConfig} from './ssh-config.js'
import {type ChannelHost, type Connection, runOnChannel} from './ssh-exec.js'

// ssh2 on first connection (src/util/lazy-require.ts).
const ssh2 = lazyRequire<typeof ssh2Module>('ssh2')

/** Everything needed to open one ssh connection, after the deployment file and ~/.ssh/config are merged. */
export interface SshEndpoint {
  host: string
  port: number
  user: string
  /** Private key files to offer, in order. */
  identityFiles: string[]
  /** ssh-agent socket to offer after the files. */
  agentSocket?: string
  knownHostsPath: string
  /** Pinned "SHA256:..." fingerprint; when set, known_hosts is not consulted. */
  fingerprint?: string
  acceptNewHostKey: boolean
  connectTimeoutMs: number
  jump?: SshEndpoint
}

export interface SshHostOptions {
  sudo?: SudoPolicy
  /** Trust and record the key of a host not yet in known_hosts (never a changed key). */
  acceptNewHostKey?: boolean
  /** Default ~/.ssh/config. */
  sshConfigPath?: string
  /** Used when the host config names no knownHosts; default ~/.ssh/known_hosts. */
  knownHostsPath?: string
  /** Concurrent channels on the one connection; beyond it commands queue (OpenSSH MaxSessions is 10). */
  maxChannels?: number
  keepaliveIntervalMs?: number
  keepaliveCountMax?: number
  home?: string
}

const DEFAULT_IDENTITIES = ['id_ed25519', 'id_ecdsa', 'id_rsa']
/** How long killing a timed-out command may take before run() gives up waiting for it. */
const KILL_WAIT_MS = 2000

export const describeEndpoint = (e: Pick<SshEndpoint, 'user' | 'host' | 'port'>): string =>
  `ssh ${e.user}@${e.host.includes(':') ? `[${e.host}]` : e.host}:${e.port}`

/** Merge the deployment's host entry with ~/.ssh/config (explicit fields win) into endpoints. */
export async function resolveSshEndpoint(cfg: SshHostConfig, opts: SshHostOptions = {}): Promise<SshEndpoint> {
  const home = opts.home ?? homedir()
  const configText = await readSshConfigFile(opts.sshConfigPath ?? join(home, '.ssh', 'config'))
  const knownHostsPath = expandTilde(cfg.knownHosts ?? opts.knownHostsPath ?? join(home, '.ssh', 'known_hosts'), home)
  let agentSocket: string | undefined
  if (cfg.agent === true) {
    agentSocket = process.env.SSH_AUTH_SOCK
    if (!agentSocket)
      throw badInput(
        'the host config asks for ssh-agent but SSH_AUTH_SOCK is not set',
        'start ssh-agent and ssh-add the key, or name an identityFile',
      )
  } else if (cfg.agent === undefined) agentSocket = process.env.SSH_AUTH_SOCK || undefined
  const connectTimeoutMs = (cfg.connectTimeoutSeconds ?? 10) * 1000

  const endpointFor = (
    name: string,
    explicit: {hostname?: string; port?: number; user?: string; identityFile?: string},
  ): SshEndpoint & {proxyJump?: string} => {
    const fromConfig = resolveSshConfig(configText, name, {home})
    const identityFiles = explicit.identityFile
      ? [expandTilde(explicit.identityFile, home)]
      : fromConfig.identityFiles.length > 0
        ? fromConfig.identityFiles
        : DEFAULT_IDENTITIES.map(f => join(home, '.ssh', f))
    return {
      host: explicit.hostname ?? fromConfig.hostname ?? name,
      port: explicit.port ?? fromConfig.port ?? 22,
      user: explicit.user ?? fromConfig.user ?? userInfo().username,
      identityFiles,
      ...(agentSocket ? {agentSocket} : {}),
      knownHostsPath,
      acceptNewHostKey: opts.acceptNewHostKey ?? false,
      connectTimeoutMs,
      ...(fromConfig.proxyJump ? {proxyJump: fromConfig.proxyJump} : {}),
    }
  }

  const name = cfg.alias ?? cfg.hostname!
  const {proxyJump: configJump, ...target} = endpointFor(name, {
    ...(cfg.alias && cfg.hostname ? {hostname: cfg.hostname} : {}),
    ...(cfg.port === undefined ? {} : {port: cfg.port}),
    ...(cfg.user === undefined ? {} : {user: cfg.user}),
    ...(cfg.identityFile === undefined ? {} : {identityFile: cfg.identityFile}),
  })
  if (cfg.fingerprint) target.fingerprint = cfg.fingerprint
  const jumpSpec = cfg.proxyJump ?? configJump
  if (jumpSpec) {
    const j = parseJumpSpec(jumpSpec)
    // The jump host is itself looked up in the ssh config, and offered the target's keys when it names none.
    const {proxyJump: _ignored, ...jump} = endpointFor(j.host, {
      ...(j.port ? {port: j.port} : {}),
      ...(j.user ? {user: j.user} : {}),
    })
    if (resolveSshConfig(configText, j.host, {home}).identityFiles.length === 0)
      jump.identityFiles = target.identityFiles
    target.jump = jump
  }
  return target
}

class Slots {
  private used = 0
  private readonly waiters: Array<() => void> = []
  constructor(private readonly max: number) {}
  acquire(): Promise<() => void> {
    return new Promise(resolve => {
      const grant = (): void => {
        this.used++
        let released = false
        resolve(() => {
          if (released) return
          released = true
          this.used--
          this.waiters.shift()?.()
        })
      }
      if (this.used < this.max) grant()
      else this.waiters.push(grant)
    })
  }
}

/** A Host over ssh2: one connection multiplexed for every command, re-opened when it drops. */
export class SshHost implements Host {
  private current?: Promise<Connection>
  private currentConn?: Connection
  private readonly slots: Slots
  private readonly sudoPolicy: SudoPolicy
  private readonly isRoot: boolean
  /** What each command's channel needs of this host (src/hosts/ssh-exec.ts). */
  private readonly channelHost: ChannelHost = {
    describe: () => this.describe(),
    connection: () => this.connection(),
    acquireSlot: () => this.slots.acquire(),
    killRemote: (pid, sudo) => this.killRemote(pid, sudo),
  }

  constructor(
    readonly endpoint: SshEndpoint,
    private readonly opts: SshHostOptions = {},
  ) {
    this.slots = new Slots(opts.maxChannels ?? 8)
    this.sudoPolicy = opts.sudo ?? 'never'
    this.isRoot = endpoint.user === 'root'
  }

  describe(): string {
    return describeEndpoint(this.endpoint)
  }

  /** Open the connection now (otherwise the first command does): surfaces host key and auth errors early. */
  async connect(): Promise<void> {
    await this.connection()
  }

  run(argv: string[], opts: RunOptions): Promise<RunResult> {
    return this.exec(argv, opts, true)
  }

  /** useSlot=false is for killing a timed-out command: it must not queue behind the commands it cleans up. */
  private async exec(argv: string[], opts: RunOptions, useSlot: boolean): Promise<RunResult> {
    checkTimeout(opts.timeoutMs)
    const full = buildArgv(argv, opts, this.sudoPolicy, this.isRoot)
    // The shell prints its pid (= its process group: sshd makes each session a new session) before exec'ing
    // the command, so a timeout can kill the whole group on the host, not just close the channel. sshd runs this
    // through the user's login shell, which may be tcsh or fish: anyShellCommand hands it to sh unchanged.
    const line = anyShellCommand(`printf '%s\\n' "$$" && exec ${shellCommand(full)}`)
    return runOnChannel(this.channelHost, argv, line, opts, useSlot)
  }

  /** Kill a timed-out command's process group on the host, bounded in time. */
  private async killRemote(pid: number, sudo: boolean | undefined): Promise<void> {
    const argv = [...sudoPrefix(sudo, this.sudoPolicy, this.isRoot), 'kill', '-KILL', '--', `-${pid}`]
    await this.exec(argv, {timeoutMs: KILL_WAIT_MS}, false).catch(() => undefined)
  }

  async upload(path: string, content: string | Buffer, mode = 0o644, opts: UploadOptions = {}): Promise<void> {
    const res = await this.run(['sh', '-c', UPLOAD_SCRIPT, 'sh', path, modeString(mode)], {
      timeoutMs: opts.timeoutMs ?? 60_000,
      stdin: content,
      ...(opts.sudo ? {sudo: true} : {}),
    })
    if (res.code !== 0) {
      throw new PdError(`cannot write ${path} on ${this.describe()}: ${oneLine(res.stderr) || `exit ${res.code}`}`, {
        exit: ExitCode.unreachable,
        suggestion: 'check the directory exists and is writable by the login user (or use sudo)',
      })
    }
  }

  async startDetached(argv: string[], opts: DetachedOptions = {}): Promise<{pid: number}> {
    const res = await this.run(
      ['sh', '-c', DETACH_SCRIPT, 'sh', opts.logFile ?? '/dev/null', ...envPrefix(opts.env), ...argv],
      {
        timeoutMs: opts.timeoutMs ?? 30_000,
        ...(opts.sudo ? {sudo: true} : {}),
      },
    )
    return {pid: parsePid(res, argv, this.describe())}
  }

  async close(): Promise<void> {
    // A connection still being opened is waited for (it is bounded by the connect timeout) and then ended.
    const conn = this.currentConn ?? (await this.current?.catch(() => undefined))
    this.current = undefined
    this.currentConn = undefined
    if (!conn) return
    conn.alive = false
    const closed = new Promise<void>(resolve => {
      conn.client.once('close', () => resolve())
    })
    conn.client.end()
    await within(closed, 1000)
    conn.jump?.end()
  }

  private connection(): Promise<Connection> {
    const cur = this.current
    if (cur && (this.currentConn === undefined || this.currentConn.alive)) return cur
    this.currentConn = undefined
    const p = this.open().then(c => {
      if (this.current === p) this.currentConn = c
      return c
    })
    this.current = p
    p.catch(() => {
      if (this.current === p) this.current = undefined
    })
    return p
  }

  private async open(): Promise<Connection> {
    const e = this.endpoint
    if (!e.jump) {
      const client = await connectClient(e, this.opts)
      return track({client, alive: true, inflight: new Set()}, e)
    }
    const jump = await connectClient(e.jump, this.opts)
    try {
      const stream = await new Promise<Duplex>((resolve, reject) => {
        const t = setTimeout(
          () => reject(new Error(`timed out after ${e.connectTimeoutMs} ms opening a tunnel`)),
          e.connectTimeoutMs,
        )
        jump.forwardOut('127.0.0.1', 0, e.host, e.port, (err, s) => {
          clearTimeout(t)
          if (err) reject(err)
          else resolve(s)
        })
      }).catch((err: unknown) => {
        throw new PdError(
          `cannot reach ${describeEndpoint(e)} through jump host ${describeEndpoint(e.jump!)}: ${oneLine(err)}`,
          {
            exit: ExitCode.unreachable,
            suggestion: 'check that the jump host can reach the target address and port (AllowTcpForwarding)',
          },
        )
      })
      const client = await connectClient(e, this.opts, stream)
      const conn = track({client, jump, alive: true, inflight: new Set()}, e)
      jump.on('close', () => client.end())
      return conn
    } catch (err) {
      jump.end()
      throw err
    }
  }
}

/** Mark the connection dead on close and fail the commands that were running on it. */
function track(conn: Connection, e: SshEndpoint): Connection {
  const dropped = (why: string): void => {
    if (!conn.alive && conn.inflight.size === 0) return
    conn.alive = false
    const err = new PdError(`lost the connection to ${describeEndpoint(e)} (${why})`, {
      exit: ExitCode.unreachable,
      suggestion: 'check that sshd and the host are up; the next command reconnects',
    })
    for (const fail of [...conn.inflight]) fail(err)
    conn.inflight.clear()
  }
  conn.client.on('error', (err: Error) => dropped(oneLine(err)))
  conn.client.on('close', () => dropped('connection closed'))
  return conn
}

/** OpenSSH private keys are a few kB (an RSA-16384 key under 13 kB). */
const MAX_IDENTITY_BYTES = 1024 * 1024

async function loadIdentities(e: SshEndpoint): Promise<{methods: AuthMethod[]; tried: string[]}> {
  const methods: AuthMethod[] = []
  const tried: string[] = []
  for (const file of e.identityFiles) {
    // A private key is a few kB: a device (/dev/zero) or a FIFO is refused, never read without bound or waited on.
    const data = readInputFile(file, {
      what: 'private key file (identityFile)',
      maxBytes: MAX_IDENTITY_BYTES,
      notAFile: 'name a private key file in identityFile',
    })
    if (data === undefined) continue
    const parsed = ssh2().utils.parseKey(data)
    if (parsed instanceof Error) {
      throw badInput(
        `cannot use identity file ${file}: ${oneLine(parsed)}`,
        'an encrypted key must be loaded into ssh-agent (ssh-add) and used with agent: true',
      )
    }
    methods.push({type: 'publickey', username: e.user, key: data} as AuthMethod)
    tried.push(file)
  }
  if (e.agentSocket) {
    methods.push({type: 'agent', username: e.user, agent: e.agentSocket} as AuthMethod)
    tried.push(`ssh-agent (${e.agentSocket})`)
  }
  if (methods.length === 0) {
    throw badInput(
      `no key to log in to ${describeEndpoint(e)} with (none of ${e.identityFiles.join(', ')} exists and ` +
        `SSH_AUTH_SOCK is unset)`,
      'set identityFile in the deployment file, add IdentityFile to ~/.ssh/config, or start ssh-agent',
    )
  }
  return {methods, tried}
}

/** One ssh2 handshake with host key checking and auth; every failure becomes a one-line PdError exit 5. */
async function connectClient(e: SshEndpoint, opts: SshHostOptions, sock?: Duplex): Promise<ClientType> {
  // known_hosts read before any connection: a path that is not a file is exit 2 here, not a failed handshake.
  if (!e.fingerprint) await readKnownHosts(e.knownHostsPath)
  const {methods, tried} = await loadIdentities(e)
  const where = describeEndpoint(e)
  const hostKey = hostKeyCheck(e, where)
  const client = new (ssh2().Client)()
  const config: ConnectConfig = {
    host: e.host,
    port: e.port,
    username: e.user,
    authHandler: methods,
    hostVerifier: hostKey.verifier,
    readyTimeout: e.connectTimeoutMs,
    keepaliveInterval: opts.keepaliveIntervalMs ?? 5000,
    keepaliveCountMax: opts.keepaliveCountMax ?? 3,
    ...(sock ? {sock} : {}),
  }
  return handshake(client, config, e, tried, () => hostKey.refusal)
}

/** The ssh2 host verifier, keeping the refusal (if any) for the handshake's error to report. */
function hostKeyCheck(
  e: SshEndpoint,
  where: string,
): {verifier: (key: Buffer, verify: (ok: boolean) => void) => void; refusal: PdError | undefined} {
  const check = {
    refusal: undefined as PdError | undefined,
    verifier: (key: Buffer, verify: (ok: boolean) => void): void => {
      judgeHostKey(e, key).then(
        r => {
          check.refusal = r
          verify(r === undefined)
        },
        (err: unknown) => {
          check.refusal =
            err instanceof PdError
              ? err
              : new PdError(`cannot check the host key of ${where}: ${oneLine(err)}`, {exit: ExitCode.unreachable})
          verify(false)
        },
      )
    },
  }
  return check
}

/** Connect and wait for ready, bounded; a failure destroys the client and becomes one PdError. */
function handshake(
  client: ClientType,
  config: ConnectConfig,
  e: SshEndpoint,
  tried: string[],
  refusal: () => PdError | undefined,
): Promise<ClientType> {
  const where = describeEndpoint(e)
  return new Promise<ClientType>((resolve, reject) => {
    let done = false
    const settle = (err?: PdError): void => {
      if (done) return
      done = true
      clearTimeout(guard)
      client.removeListener('ready', onReady)
      if (err) {
        client.removeAllListeners('error')
        client.on('error', () => undefined) // late errors from a dead client must not crash the process
        client.destroy()
        reject(err)
      } else resolve(client)
    }
    // Nagle's algorithm holds back the small packets of each channel open/exec (~40 ms twice per command).
    const onReady = (): void => {
      client.setNoDelay(true)
      settle()
    }
    // ssh2's readyTimeout covers the handshake; this guard also covers a stuck TCP connect or DNS lookup.
    const guard = setTimeout(
      () => settle(cannotReach(where, `timed out after ${e.connectTimeoutMs} ms`)),
      e.connectTimeoutMs + 1000,
    )
    client.once('ready', onReady)
    client.on('error', (err: Error & {level?: string; code?: string}) => {
      if (!done) settle(refusal() ?? handshakeError(e, tried, err))
    })
    client.on('close', () => settle(refusal() ?? cannotReach(where, 'the connection closed during the handshake')))
    try {
      client.connect(config)
    } catch (err) {
      settle(cannotReach(where, oneLine(err)))
    }
  })
}

/** The one-line reason a handshake failed: the key refused, a timeout, or the network. */
function handshakeError(e: SshEndpoint, tried: string[], err: Error & {level?: string; code?: string}): PdError {
  const where = describeEndpoint(e)
  if (err.level === 'client-authentication') {
    return new PdError(`${where} refused the key (tried ${tried.join(', ')})`, {
      exit: ExitCode.unreachable,
      suggestion: `add the public key to ~${e.user}/.ssh/authorized_keys on the host, or name the right identityFile`,
    })
  }
  if (err.level === 'client-timeout')
    return cannotReach(where, `timed out after ${e.connectTimeoutMs} ms waiting for the ssh handshake`)
  return cannotReach(where, err.code ?? oneLine(err))
}

function cannotReach(where: string, why: string): PdError {
  return new PdError(`cannot reach ${where}: ${why}`, {
    exit: ExitCode.unreachable,
    suggestion: 'check the address and port, that sshd runs there, and the network path (firewall, ProxyJump)',
  })
}

/** undefined when the key is trusted; otherwise the refusal to report (with the fingerprint shown). */
async function judgeHostKey(e: SshEndpoint, key: Buffer): Promise<PdError | undefined> {
  const where = describeEndpoint(e)
  const seen = fingerprintOf(key)
  if (e.fingerprint) {
    if (seen.replace(/=+$/, '') === e.fingerprint.replace(/=+$/, '')) return undefined
    return new PdError(`host key of ${where} is ${seen}, not the pinned ${e.fingerprint}: refusing to connect`, {
      exit: ExitCode.unreachable,
      suggestion: `if the host was legitimately re-keyed, pin the new fingerprint: fingerprint: ${seen}`,
      code: 'E_HOSTKEY',
    })
  }
  const verdict = checkKnownHosts(await readKnownHosts(e.knownHostsPath), e.host, e.port, key)
  switch (verdict.status) {
    case 'known':
      return undefined
    case 'unknown':
      if (e.acceptNewHostKey) {
        await appendKnownHost(e.knownHostsPath, e.host, e.port, key)
        return undefined
      }
      return new PdError(`host key of ${where} is unknown (${seen}; not in ${e.knownHostsPath}): refusing to connect`, {
        exit: ExitCode.unreachable,
        code: 'E_HOSTKEY',
        suggestion:
          `verify ${seen} out of band, then rerun with --accept-new-host-key or pin it with ` + `fingerprint: ${seen}`,
      })
    case 'changed':
      return new PdError(
        `host key of ${where} CHANGED: it presents ${seen} but ${e.knownHostsPath} ` +
          `knows ${verdict.knownFingerprints.join(', ')} for ${knownHostsToken(e.host, e.port)}: refusing to connect`,
        {
          exit: ExitCode.unreachable,
          code: 'E_HOSTKEY',
          suggestion:
            `if the host was legitimately re-keyed, remove the old entry (ssh-keygen -R ` +
            `'${knownHostsToken(e.host, e.port)}' -f ${e.knownHostsPath}) or pin fingerprint: ${seen}`,
        },
      )
    case 'revoked':
      return new PdError(
        `host key of ${where} (${seen}) is marked @revoked in ${e.knownHostsPath}: refusing to connect`,
        {exit: ExitCode.unreachable, code: 'E_HOSTKEY'},
      )
  }
}

/** A SshHost from the deployment file's host entry. */
export async function openSshHost(cfg: SshHostConfig, opts: SshHostOptions = {}): Promise<SshHost> {
  return new SshHost(await resolveSshEndpoint(cfg, opts), opts)
}
