import {randomBytes} from 'node:crypto'
import {existsSync, mkdirSync, readFileSync, rmSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {dirname, join} from 'node:path'
import {fileURLToPath} from 'node:url'
import {parse as parseYaml, stringify as toYaml} from 'yaml'

import {type DeploymentInput, DeploymentSchema, type SshHostConfig} from '../../src/deployment/config.js'
import {shellCommand} from '../../src/hosts/quote.js'
import {requireSystemLevel} from './level.js'
import {createNetns, type Netns, runCommand, type RunResult} from './netns.js'
import {startSshd, type Sshd} from './sshd.js'

/**
 * The end-to-end test host: a network namespace standing for the GPU host, a real OpenSSH sshd inside it on
 * <address>:22, and optionally the twin started inside over SSH exactly as a user would (`pdchaos sim up`).
 * Tests reach it only through the returned ssh settings and deployment file, like pdchaos reaches a real host.
 *
 * Every artefact lives under one temp dir $TMPDIR/pdchaos-test-<token> and the namespace is named pdc-<token>…,
 * so `scripts/cleanup-test-hosts.sh --only <token>` removes exactly one host and a bare run removes all.
 */

export interface SimUpOptions {
  gpus?: number
  prefillTp?: number
  decodeTp?: number
  backend?: 'nixl' | 'mooncake'
  watchdog?: 'all' | 'inflight' | 'off'
  deadlineSeconds?: number
  pollSeconds?: number
  bugs?: string[]
  basePort?: number
  /** More `sim up` flags, verbatim. */
  args?: string[]
  /** Deadline for `sim up` over SSH (default 90 s). */
  timeoutMs?: number
}

/**
 * The smallest twin: 2 GPUs, one TP 1 prefill and one TP 1 decode (4 processes besides the router, against 10 for
 * the 8-GPU default). For tests about pdchaos's own behaviour (leases, the fleet, a gate) on one request path, where
 * no rank other than 0 is targeted; the default layout stays covered by over-ssh.system.test.ts and the README's suite.
 */
export const SMALL_TWIN = {gpus: 2, prefillTp: 1, decodeTp: 1} as const satisfies SimUpOptions

export interface TestHostOptions {
  /** Start the twin inside the namespace over SSH (`true` for its defaults). */
  twin?: SimUpOptions | true
  sshd?: true
  /**
   * Which CLI entry runs `sim up`: dist (bin/run.js, needs a build) or dev (bin/dev.js, src via tsx). Default: dist
   * when built.
   */
  cli?: 'dist' | 'dev'
  /**
   * Serve requests right after `sim up` until one goes through (default true), as a deployment that has seen
   * traffic has: a fresh twin (like SGLang) resolves the prefill's /route and opens its ZMQ and KV connections on the
   * first request, which took 1-5 s on a loaded 2-core machine, longer than the short watchdog deadlines tests use.
   * `false` keeps the twin fresh (for the test of exactly that).
   */
  warm?: boolean
}

export interface TestHostSsh {
  host: string
  port: number
  user: string
  identityFile: string
  knownHosts: string
  fingerprint: string
}

export interface TwinInfo {
  stateDir: string
  /** The twin's own deployment file (host kind local, as `sim up` writes it). */
  deploymentFile: string
  endpoints: {router: string; prefill: string; decode: string; bootstrap: string}
  /** The whole `sim up --json` document. */
  up: Record<string, unknown>
}

export interface TestHost {
  /** Shared by the temp dir (pdchaos-test-<token>) and the namespace (pdc-<token>…). */
  token: string
  dir: string
  netns: Netns
  ssh: TestHostSsh
  /** The deployment's host section, ready for openHost(). */
  hostConfig: SshHostConfig
  /** pdchaos.yaml for pdchaos on the root side: host kind ssh into the namespace. */
  deploymentFile: string
  /** The twin's state dir (inside the namespace's view of the shared filesystem). */
  stateDir: string
  /** The deployment's stateDir: where pdchaos keeps its leases, lock and halt file on this host (not the twin's). */
  leaseStateDir: string
  twin?: TwinInfo
  /** The host's sshd (killAll() cuts every SSH connection to it, as a lost host does). */
  sshd: Sshd
  /** Run argv on the host over SSH with the `ssh` client (BatchMode, strict host key). Resolves with any exit code. */
  sshRun(argv: readonly string[], opts?: {timeoutMs?: number; input?: string}): Promise<RunResult>
  /**
   * `sim down` over SSH, stop sshd, destroy the namespace (killing whatever is left), remove the temp dir. Idempotent.
   */
  destroy(): Promise<void>
}

const repoRoot = fileURLToPath(new URL('../../', import.meta.url))

/** bin/run.js when dist/ holds the sim commands, else bin/dev.js (oclif registers tsx itself in development mode). */
export function cliEntry(which?: 'dist' | 'dev'): string {
  const built = existsSync(join(repoRoot, 'dist', 'commands', 'sim', 'up.js'))
  return join(repoRoot, 'bin', (which ?? (built ? 'dist' : 'dev')) === 'dist' ? 'run.js' : 'dev.js')
}

function simUpArgs(o: SimUpOptions): string[] {
  const a: string[] = []
  const flag = (name: string, v: string | number | undefined): void => {
    if (v !== undefined) a.push(`--${name}`, String(v))
  }
  flag('gpus', o.gpus)
  flag('prefill-tp', o.prefillTp)
  flag('decode-tp', o.decodeTp)
  flag('backend', o.backend)
  flag('watchdog', o.watchdog)
  flag('deadline', o.deadlineSeconds)
  flag('poll', o.pollSeconds)
  flag('base-port', o.basePort)
  for (const bug of o.bugs ?? []) flag('bug', bug)
  return [...a, ...(o.args ?? [])]
}

/** Temp dirs whose process-exit removal is still owed. */
const liveDirs = new Set<string>()
let exitHook = false

export async function createTestHost(opts: TestHostOptions = {}): Promise<TestHost> {
  requireSystemLevel('createTestHost')
  const token = randomBytes(3).toString('hex')
  const dir = join(tmpdir(), `pdchaos-test-${token}`)
  mkdirSync(dir, {recursive: true, mode: 0o700})
  liveDirs.add(dir)
  if (!exitHook) {
    exitHook = true
    process.on('exit', () => {
      for (const d of liveDirs) rmSync(d, {recursive: true, force: true})
    })
  }
  const stateDir = join(dir, 'twin')
  const leaseDir = join(dir, 'host-run')
  let netns: Netns | undefined
  let sshd: Sshd | undefined
  let destroyed: Promise<void> | undefined
  let twinStarted = false

  const destroy = (): Promise<void> =>
    (destroyed ??= (async () => {
      if (twinStarted && sshd) {
        // The twin's own shutdown first (it knows its process groups); the namespace sweep catches the rest.
        await sshRun([process.execPath, cliEntry(opts.cli), 'sim', 'down', '--state-dir', stateDir, '--json'], {
          timeoutMs: 20_000,
        }).catch(() => undefined)
      }
      await sshd?.stop().catch(() => undefined)
      await netns?.destroy()
      rmSync(dir, {recursive: true, force: true})
      liveDirs.delete(dir)
    })())

  let ssh: TestHostSsh | undefined
  const sshRun = async (argv: readonly string[], o: {timeoutMs?: number; input?: string} = {}): Promise<RunResult> => {
    if (!ssh) throw new Error('sshRun: sshd is not running')
    return runCommand(
      [
        'ssh',
        '-F',
        '/dev/null',
        '-i',
        ssh.identityFile,
        '-o',
        'IdentitiesOnly=yes',
        '-o',
        'BatchMode=yes',
        '-o',
        'StrictHostKeyChecking=yes',
        '-o',
        `UserKnownHostsFile=${ssh.knownHosts}`,
        '-o',
        'ConnectTimeout=5',
        '-p',
        String(ssh.port),
        `${ssh.user}@${ssh.host}`,
        '--',
        shellCommand([...argv]),
      ],
      {timeoutMs: o.timeoutMs ?? 30_000, input: o.input, reject: false},
    )
  }

  try {
    netns = await createNetns({prefix: `pdc-${token}`})
    const loginPath = [
      join(stateDir, 'bin'),
      dirname(process.execPath),
      '/usr/local/sbin',
      '/usr/local/bin',
      '/usr/sbin',
      '/usr/bin',
      '/sbin',
      '/bin',
    ].join(':')
    sshd = await startSshd({
      dir: join(dir, 'sshd'),
      host: netns.address,
      port: 22,
      prefix: [...netns.prefix],
      // PDCHAOS_SIM_DIR: this node's twin, as a node's own unit file names its server (a multi-node instance's one
      // restart command then restarts each node's part of it).
      env: {PATH: loginPath, PDCHAOS_SIM_DIR: stateDir},
      // Fault tests open many sessions at once; sshd's default MaxStartups drops some of them at random.
      extraConfig: ['MaxSessions 64', 'MaxStartups 64:30:128'],
    })
    const knownHosts = join(dir, 'known_hosts')
    writeFileSync(knownHosts, sshd.knownHostsLine.trimEnd() + '\n')
    ssh = {
      host: netns.address,
      port: 22,
      user: 'root',
      identityFile: sshd.clientKeyPath,
      knownHosts,
      fingerprint: sshd.hostKeyFingerprint,
    }
    const hostConfig: SshHostConfig = {
      kind: 'ssh',
      hostname: ssh.host,
      port: ssh.port,
      user: ssh.user,
      identityFile: ssh.identityFile,
      knownHosts,
      fingerprint: ssh.fingerprint,
      connectTimeoutSeconds: 5,
    }

    let twin: TwinInfo | undefined
    let deployment: DeploymentInput
    if (opts.twin) {
      const o = opts.twin === true ? {} : opts.twin
      twinStarted = true
      const argv = [
        process.execPath,
        cliEntry(opts.cli),
        'sim',
        'up',
        '--host',
        netns.address,
        '--state-dir',
        stateDir,
        '--json',
        ...simUpArgs(o),
      ]
      const r = await sshRun(argv, {timeoutMs: o.timeoutMs ?? 90_000})
      if (r.code !== 0) {
        throw new Error(
          `sim up over ssh exited ${r.code}: ${(r.stderr || r.stdout).trim().split('\n').slice(-5).join(' | ')}`,
        )
      }
      const up = JSON.parse(r.stdout) as Record<string, unknown>
      const twinFile = String(up.deploymentFile)
      twin = {stateDir, deploymentFile: twinFile, endpoints: up.endpoints as TwinInfo['endpoints'], up}
      if (opts.warm !== false) await warmTwin(twin.endpoints)
      // The twin's own file, with the host swapped for SSH into the namespace: same services, restart commands, logs.
      deployment = {
        ...(parseYaml(readFileSync(twinFile, 'utf8')) as DeploymentInput),
        host: hostConfig,
        stateDir: leaseDir,
      }
    } else {
      // No twin: services at the twin's default ports on the namespace address, where nothing listens (for
      // unreachable-service tests).
      const url = (port: number): string => `http://${netns!.address}:${port}`
      deployment = {
        name: `test-host-${token}`,
        labels: {environment: 'test'},
        host: hostConfig,
        stateDir: leaseDir,
        services: {
          prefill: {url: url(30_100), bootstrapPort: 30_500},
          decode: {url: url(30_200)},
          router: {url: url(30_000)},
        },
        watchdog: {scope: 'all', deadlineSeconds: 10, pollSeconds: 1},
      }
    }
    DeploymentSchema.parse(deployment)
    const deploymentFile = join(dir, 'pdchaos.yaml')
    writeFileSync(deploymentFile, toYaml(deployment))

    return {
      token,
      dir,
      netns,
      ssh,
      sshd,
      hostConfig,
      deploymentFile,
      stateDir,
      leaseStateDir: leaseDir,
      twin,
      sshRun,
      destroy,
    }
  } catch (error) {
    await destroy()
    throw error
  }
}

async function post(url: string, body: unknown, timeoutMs: number): Promise<{status: number; text: string}> {
  const res = await fetch(url, {
    method: 'POST',
    headers: {'content-type': 'application/json'},
    body: JSON.stringify(body),
    signal: AbortSignal.timeout(timeoutMs),
  })
  return {status: res.status, text: await res.text()}
}

/**
 * Serve requests until the twin answers one through prefill and decode (as the router sends it: same rid and
 * bootstrap room) and one through the router. A fresh twin resolves the prefill's /route and opens its ZMQ and KV
 * connections on the first request, which took 1-5 s here (2 cores, loaded); a watchdog deadline shorter than that
 * evicts it on prefill, and decode, never told, would hold its half until its waiting timeout (300 s): abort it there.
 * Each evicted try still gets further down that cold path, so a few tries warm it; a bound keeps a broken twin a
 * failure, with what it answered.
 */
export async function warmTwin(endpoints: TwinInfo['endpoints'], maxTries = 8): Promise<void> {
  const bootstrap = new URL(endpoints.bootstrap)
  const pair = async (): Promise<string | undefined> => {
    const rid = `test-warmup-${randomBytes(6).toString('hex')}`
    const body = {
      rid,
      text: 'warm up '.repeat(16),
      max_new_tokens: 1,
      bootstrap_host: bootstrap.hostname,
      bootstrap_port: Number(bootstrap.port),
      bootstrap_room: randomBytes(6).readUIntBE(0, 6),
    }
    const decode = post(`${endpoints.decode}/generate`, body, 30_000)
    const prefill = await post(`${endpoints.prefill}/generate`, body, 30_000)
    if (prefill.status !== 200)
      await post(`${endpoints.decode}/abort_request`, {rid, abort_all: false}, 10_000).catch(() => undefined)
    const d = await decode
    if (prefill.status === 200 && d.status === 200) return undefined
    return `prefill ${prefill.status} ${prefill.text.slice(0, 160)}; decode ${d.status} ${d.text.slice(0, 160)}`
  }
  const answers: string[] = []
  for (let i = 0; i < maxTries; i++) {
    const problem =
      (await pair()) ??
      (await post(`${endpoints.router}/generate`, {text: 'warm up', max_new_tokens: 1}, 30_000).then(r =>
        r.status === 200 ? undefined : `router ${r.status} ${r.text.slice(0, 160)}`,
      ))
    if (problem === undefined) return
    answers.push(problem)
  }
  throw new Error(`the twin served no request in ${maxTries} tries; the last answers: ${answers.slice(-2).join(' / ')}`)
}
