import {type ChildProcess, execFileSync, spawn} from 'node:child_process'
import {
  closeSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readFileSync,
  readdirSync,
  rmSync,
  writeFileSync,
} from 'node:fs'
import {createServer} from 'node:net'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {fingerprintOf, knownHostsLine as lineFor} from '../../src/hosts/known-hosts.js'
import {requireSystemLevel} from './level.js'

/**
 * A real OpenSSH sshd (Debian's openssh-server) for tests: its own temp config, host key, client key and
 * pid file; nothing in /etc is touched (only /run/sshd is created, which sshd insists on). Optionally run
 * inside a network namespace through an argv prefix (`ip netns exec NAME`).
 */

export interface SshdOptions {
  /** Working directory for config, keys and log; a temp dir (removed by stop()) when absent. */
  dir?: string
  /** Listen address; default 127.0.0.1. */
  host?: string
  /** Listen port; default a free port on loopback. */
  port?: number
  /** Shorthand for prefix ['ip', 'netns', 'exec', netns]. */
  netns?: string
  /** argv prefix for launching sshd, e.g. ['ip', 'netns', 'exec', name]. */
  prefix?: string[]
  /** SetEnv for every login session. */
  env?: Record<string, string>
  /** PATH for login sessions (same as env.PATH). */
  path?: string
  /**
   * HOME for login sessions. Default: an empty dir under the harness dir, so the machine's own dotfiles
   * (bash sources ~/.bashrc for every ssh command) neither slow nor change what tests run. null keeps root's home.
   */
  home?: string | null
  /**
   * The login shell sshd runs every command through (root's), e.g. /usr/bin/tcsh or /usr/bin/fish: sshd then runs
   * in a private mount namespace where a copy of /etc/passwd with that shell is bind-mounted over the real one, so
   * nothing on the machine changes and the namespace goes with sshd.
   */
  loginShell?: string
  /** Extra sshd_config lines, placed first so they override the harness's (e.g. 'LogLevel DEBUG1', 'MaxSessions 4'). */
  extraConfig?: string[]
  /** Reuse an existing host key file (private; .pub next to it) instead of generating one. */
  hostKeyPath?: string
  /** Authorize (and report) an existing client key instead of generating one. */
  clientKeyPath?: string
  startTimeoutMs?: number
}

export interface Sshd {
  host: string
  port: number
  user: 'root'
  dir: string
  clientKeyPath: string
  hostKeyPath: string
  /** Raw SSH public key blob of the host key. */
  hostKeyBlob: Buffer
  hostKeyFingerprint: string
  /** A known_hosts line for this host ([host]:port form when port is not 22). */
  knownHostsLine: string
  logPath: string
  pid: number
  /** Kill the listener and every session process under it (sshd "dies"); keeps the files. Idempotent. */
  killAll(): Promise<void>
  /** killAll() and remove the temp dir if the harness made it. Idempotent. */
  stop(): Promise<void>
}

export const SSHD = '/usr/sbin/sshd'

/** Install openssh-server when sshd is missing (test global setup may call this; takes ~10 s once). */
export function ensureSshd(): void {
  if (!existsSync(SSHD)) {
    execFileSync('apt-get', ['install', '-y', '--no-install-recommends', 'openssh-server', 'openssh-client'], {
      stdio: 'ignore',
      timeout: 300_000,
      env: {...process.env, DEBIAN_FRONTEND: 'noninteractive'},
    })
  }
  mkdirSync('/run/sshd', {recursive: true, mode: 0o755})
}

export function freePort(host = '127.0.0.1'): Promise<number> {
  return new Promise((resolve, reject) => {
    const srv = createServer()
    srv.unref()
    srv.once('error', reject)
    srv.listen(0, host, () => {
      const {port} = srv.address() as {port: number}
      srv.close(() => resolve(port))
    })
  })
}

function keygen(path: string): void {
  execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-C', 'pdchaos-test', '-f', path], {
    stdio: 'ignore',
    timeout: 10_000,
  })
}

/** Every live process whose ancestry leads to pid (read from /proc). */
export function descendants(pid: number): number[] {
  const parent = new Map<number, number>()
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue
    try {
      const stat = readFileSync(`/proc/${name}/stat`, 'latin1')
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1])
      parent.set(Number(name), ppid)
    } catch {
      /* exited while we looked */
    }
  }
  const out: number[] = []
  const frontier = [pid]
  while (frontier.length > 0) {
    const p = frontier.pop()!
    for (const [child, pp] of parent)
      if (pp === p) {
        out.push(child)
        frontier.push(child)
      }
  }
  return out
}

function waitListening(child: ChildProcess, logPath: string, deadlineMs: number): Promise<void> {
  const until = Date.now() + deadlineMs
  return new Promise((resolve, reject) => {
    const tick = (): void => {
      const log = existsSync(logPath) ? readFileSync(logPath, 'utf8') : ''
      if (/Server listening on/.test(log)) {
        resolve()
        return
      }
      if (child.exitCode !== null || child.signalCode !== null) {
        reject(
          new Error(
            `sshd exited (${child.exitCode ?? child.signalCode}) before ` +
              `listening: ${log.trim().split('\n').slice(-3).join(' | ')}`,
          ),
        )
        return
      }
      if (Date.now() > until) {
        reject(new Error(`sshd not listening after ${deadlineMs} ms: ${log.trim()}`))
        return
      }
      setTimeout(tick, 15)
    }
    tick()
  })
}

/** argv prefix: a private mount namespace whose /etc/passwd gives root the login shell `shell`. */
function loginShellPrefix(dir: string, shell: string): string[] {
  const passwd = join(dir, 'passwd')
  writeFileSync(passwd, readFileSync('/etc/passwd', 'utf8').replace(/^(root:[^\n]*:)[^:\n]*$/m, `$1${shell}`))
  return [
    'unshare',
    '--mount',
    '--propagation',
    'private',
    'sh',
    '-c',
    'mount --bind "$1" /etc/passwd && shift && exec "$@"',
    'sh',
    passwd,
  ]
}

export async function startSshd(opts: SshdOptions = {}): Promise<Sshd> {
  requireSystemLevel('startSshd')
  ensureSshd()
  const ownDir = opts.dir === undefined
  const dir = opts.dir ?? mkdtempSync(join(tmpdir(), 'pdchaos-sshd-'))
  mkdirSync(dir, {recursive: true})
  const host = opts.host ?? '127.0.0.1'
  const prefix = [
    ...(opts.prefix ?? (opts.netns ? ['ip', 'netns', 'exec', opts.netns] : [])),
    ...(opts.loginShell ? loginShellPrefix(dir, opts.loginShell) : []),
  ]
  const hostKeyPath = opts.hostKeyPath ?? join(dir, 'host_ed25519')
  if (!opts.hostKeyPath) keygen(hostKeyPath)
  const clientKeyPath = opts.clientKeyPath ?? join(dir, 'client_ed25519')
  if (!existsSync(clientKeyPath)) keygen(clientKeyPath)
  writeFileSync(join(dir, 'authorized_keys'), readFileSync(clientKeyPath + '.pub'))
  const hostKeyBlob = Buffer.from(
    readFileSync(hostKeyPath + '.pub', 'utf8')
      .trim()
      .split(/\s+/)[1]!,
    'base64',
  )
  const home = opts.home === undefined ? join(dir, 'home') : opts.home
  if (home !== null) mkdirSync(home, {recursive: true})
  const env = {...(home === null ? {} : {HOME: home}), ...opts.env, ...(opts.path ? {PATH: opts.path} : {})}

  // A port picked on loopback can be taken by another test between pick and bind: retry a few times.
  for (let attempt = 0; ; attempt++) {
    const port = opts.port ?? (await freePort())
    const logPath = join(dir, 'sshd.log')
    const config =
      [
        // sshd_config keeps the first value of an option, so the caller's lines go first to override ours.
        ...(opts.extraConfig ?? []),
        `Port ${port}`,
        `ListenAddress ${host}`,
        `HostKey ${hostKeyPath}`,
        `PidFile ${join(dir, 'sshd.pid')}`,
        `AuthorizedKeysFile ${join(dir, 'authorized_keys')}`,
        'StrictModes no',
        'UsePAM no',
        'PasswordAuthentication no',
        'KbdInteractiveAuthentication no',
        'PermitRootLogin prohibit-password',
        'AllowTcpForwarding yes',
        'Subsystem sftp internal-sftp',
        'LogLevel VERBOSE',
        ...(Object.keys(env).length > 0
          ? [
              `SetEnv ${Object.entries(env)
                .map(([k, v]) => `"${k}=${v}"`)
                .join(' ')}`,
            ]
          : []),
      ].join('\n') + '\n'
    const configPath = join(dir, 'sshd_config')
    writeFileSync(configPath, config)
    execFileSync(SSHD, ['-t', '-f', configPath], {stdio: 'pipe', timeout: 10_000})
    writeFileSync(logPath, '')
    const logFd = openSync(logPath, 'a')
    const argv = [...prefix, SSHD, '-D', '-e', '-f', configPath]
    const child = spawn(argv[0]!, argv.slice(1), {stdio: ['ignore', 'ignore', logFd]})
    closeSync(logFd)
    child.on('error', () => undefined)
    try {
      await waitListening(child, logPath, opts.startTimeoutMs ?? 10_000)
    } catch (err) {
      child.kill('SIGKILL')
      const bindFailed = /Bind to port|Address already in use|Cannot bind any address/.test(
        readFileSync(logPath, 'utf8'),
      )
      if (bindFailed && opts.port === undefined && attempt < 4) continue
      if (ownDir) rmSync(dir, {recursive: true, force: true})
      throw err
    }
    const pid = child.pid!
    let killed = false
    const killAll = async (): Promise<void> => {
      if (killed) return
      killed = true
      for (const p of [pid, ...descendants(pid)]) {
        try {
          process.kill(p, 'SIGKILL')
        } catch {
          /* gone */
        }
      }
      if (child.exitCode === null && child.signalCode === null) {
        await new Promise<void>(resolve => {
          const t = setTimeout(resolve, 3000)
          child.once('exit', () => {
            clearTimeout(t)
            resolve()
          })
        })
      }
    }
    let stopped = false
    return {
      host,
      port,
      user: 'root',
      dir,
      clientKeyPath,
      hostKeyPath,
      hostKeyBlob,
      hostKeyFingerprint: fingerprintOf(hostKeyBlob),
      knownHostsLine: lineFor(host, port, hostKeyBlob) + '\n',
      logPath,
      pid,
      killAll,
      async stop() {
        if (stopped) return
        stopped = true
        await killAll()
        if (ownDir) rmSync(dir, {recursive: true, force: true})
      },
    }
  }
}
