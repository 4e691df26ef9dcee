import {type ChildProcess, execFile, execFileSync, spawn, type SpawnOptions} from 'node:child_process'
import {randomBytes} from 'node:crypto'
import {mkdirSync, rmSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {requireSystemLevel} from './level.js'

/**
 * A throw-away network namespace standing for a remote host: a veth pair pdc-h<N> (root side, 10.231.N.1)
 * <-> pdc-n<N> (inside, 10.231.N.2), lo up inside. Needs root. Every namespace is registered so that it is
 * destroyed on process exit and on SIGINT/SIGTERM, and leaves a marker file that scripts/cleanup-test-hosts.sh
 * reads; the script also removes every pdc-* namespace and pdc-h* link regardless of markers.
 */

export interface RunResult {
  code: number | null
  signal: NodeJS.Signals | null
  stdout: string
  stderr: string
}

export interface RunOptions {
  /** Kill the command (SIGKILL) after this long and reject. Default 10 s. */
  timeoutMs?: number
  input?: string | Buffer
  /** Resolve with a non-zero exit instead of rejecting. */
  reject?: boolean
  env?: NodeJS.ProcessEnv
}

export interface Netns {
  /** pdc-<random>, as `ip netns list` shows it. */
  readonly name: string
  /** N in 10.231.N.0/24. */
  readonly index: number
  /** The namespace's own address (on pdc-n<N>, inside). */
  readonly address: string
  /** The root side's address (on pdc-h<N>), reachable from inside. */
  readonly hostAddress: string
  readonly hostLink: string
  readonly nsLink: string
  /** argv prefix that runs a command inside: ['ip', 'netns', 'exec', name]. */
  readonly prefix: readonly string[]
  /** Spawn argv inside the namespace. The caller owns the child; destroy() kills it anyway. */
  exec(argv: readonly string[], opts?: SpawnOptions): ChildProcess
  /** Run argv inside the namespace to completion, with a deadline. Rejects on non-zero exit unless reject: false. */
  run(argv: readonly string[], opts?: RunOptions): Promise<RunResult>
  /** PIDs of every process whose network namespace is this one. */
  pids(): Promise<number[]>
  /** Kill every process inside, delete the veth and the namespace, remove the marker. Idempotent. */
  destroy(): Promise<void>
}

export interface CreateNetnsOptions {
  /** Name prefix; must start with 'pdc-' so the cleanup script finds leftovers. Default 'pdc-'. */
  prefix?: string
  /** Attempts at a free N / name before giving up. Default 40. */
  attempts?: number
}

/** Where markers for live namespaces go; scripts/cleanup-test-hosts.sh reads the same directory. */
export const NETNS_MARKER_DIR = join(tmpdir(), 'pdchaos-test-registry', 'netns')

const IP = 'ip'
const DEFAULT_TIMEOUT_MS = 10_000

/** Run a root-side command with a deadline; never inherits stdio. */
export function runCommand(argv: readonly string[], opts: RunOptions = {}): Promise<RunResult> {
  const timeoutMs = opts.timeoutMs ?? DEFAULT_TIMEOUT_MS
  return new Promise((resolve, reject) => {
    const child = execFile(
      argv[0]!,
      argv.slice(1),
      {
        timeout: timeoutMs,
        killSignal: 'SIGKILL',
        maxBuffer: 64 * 1024 * 1024,
        encoding: 'utf8',
        env: opts.env ?? process.env,
      },
      (error, stdout, stderr) => {
        const err = error as
          | (NodeJS.ErrnoException & {killed?: boolean; code?: number | string; signal?: NodeJS.Signals})
          | null
        if (err && typeof err.code === 'string') {
          reject(new Error(`${argv.join(' ')}: ${err.message}`))
          return
        }
        if (err?.killed) {
          reject(new Error(`${argv.join(' ')}: timed out after ${timeoutMs} ms`))
          return
        }
        const result: RunResult = {
          code: err ? (typeof err.code === 'number' ? err.code : null) : 0,
          signal: err?.signal ?? null,
          stdout,
          stderr,
        }
        if (result.code !== 0 && opts.reject !== false) {
          reject(
            new Error(
              `${argv.join(' ')}: ` +
                `exit ${result.code ?? result.signal}: ${stderr.trim().split('\n').slice(-3).join(' | ')}`,
            ),
          )
          return
        }
        resolve(result)
      },
    )
    if (opts.input !== undefined) child.stdin?.end(opts.input)
    else child.stdin?.end()
  })
}

// ---- process-level registry: destroy on exit / signals (best effort, synchronous) ----

const live = new Map<string, {hostLink: string}>()
let hooksInstalled = false

function destroySync(name: string, hostLink: string): void {
  const quiet = {stdio: 'ignore' as const, timeout: 5000}
  try {
    const out = execFileSync(IP, ['netns', 'pids', name], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
      timeout: 5000,
    })
    for (const pid of out.split(/\s+/).filter(Boolean).map(Number)) {
      try {
        process.kill(pid, 'SIGKILL')
      } catch {
        /* gone already */
      }
    }
  } catch {
    /* namespace gone */
  }
  try {
    execFileSync(IP, ['link', 'del', hostLink], quiet)
  } catch {
    /* gone with the namespace */
  }
  try {
    execFileSync(IP, ['netns', 'del', name], quiet)
  } catch {
    /* gone already */
  }
  rmSync(join(NETNS_MARKER_DIR, `${name}.json`), {force: true})
}

/** Destroy every namespace this process created and has not destroyed yet. Synchronous: usable from 'exit'. */
export function destroyAllNetnsSync(): void {
  for (const [name, {hostLink}] of live) destroySync(name, hostLink)
  live.clear()
}

function installHooks(): void {
  if (hooksInstalled) return
  hooksInstalled = true
  process.on('exit', destroyAllNetnsSync)
  for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
    const onSignal = (): void => {
      destroyAllNetnsSync()
      // If nobody else handles the signal, die of it as we would have without this hook.
      process.off(signal, onSignal)
      if (process.listenerCount(signal) === 0) process.kill(process.pid, signal)
    }
    process.on(signal, onSignal)
  }
}

// ---- creation ----

function randomIndex(): number {
  return 1 + (randomBytes(1)[0]! % 250)
}

function randomSuffix(): string {
  return randomBytes(4).toString('hex')
}

async function addressInUse(index: number): Promise<boolean> {
  const {stdout} = await runCommand([IP, '-o', '-4', 'addr', 'show'])
  return stdout.includes(` 10.231.${index}.`)
}

/**
 * Create a namespace with a veth pair and addresses. The veth is created first: `ip link add` fails atomically
 * when pdc-h<N> exists, which reserves N against other test processes picking the same one at the same time.
 */
export async function createNetns(opts: CreateNetnsOptions = {}): Promise<Netns> {
  requireSystemLevel('createNetns')
  const prefix = opts.prefix ?? 'pdc-'
  if (!prefix.startsWith('pdc-')) throw new Error(`createNetns: prefix must start with 'pdc-' (got '${prefix}')`)
  if (process.getuid?.() !== 0) throw new Error('createNetns: network namespaces need root')
  const attempts = opts.attempts ?? 40
  let lastError = ''
  for (let attempt = 0; attempt < attempts; attempt++) {
    const index = randomIndex()
    const hostLink = `pdc-h${index}`
    const nsLink = `pdc-n${index}`
    const name = `${prefix}${randomSuffix()}`
    if (await addressInUse(index)) continue
    const add = await runCommand([IP, 'link', 'add', hostLink, 'type', 'veth', 'peer', 'name', nsLink], {reject: false})
    if (add.code !== 0) {
      lastError = add.stderr.trim()
      continue // taken by someone else: try another N
    }
    const made = await runCommand([IP, 'netns', 'add', name], {reject: false})
    if (made.code !== 0) {
      lastError = made.stderr.trim()
      await runCommand([IP, 'link', 'del', hostLink], {reject: false})
      continue
    }
    installHooks()
    live.set(name, {hostLink})
    mkdirSync(NETNS_MARKER_DIR, {recursive: true})
    writeFileSync(
      join(NETNS_MARKER_DIR, `${name}.json`),
      JSON.stringify({name, hostLink, nsLink, index, ownerPid: process.pid, createdAt: Date.now()}) + '\n',
    )
    const address = `10.231.${index}.2`
    const hostAddress = `10.231.${index}.1`
    const ns = makeNetns({name, index, address, hostAddress, hostLink, nsLink})
    try {
      await runCommand([IP, 'link', 'set', nsLink, 'netns', name])
      await runCommand([IP, 'addr', 'add', `${hostAddress}/24`, 'dev', hostLink])
      await runCommand([IP, 'link', 'set', hostLink, 'up'])
      await runCommand([IP, '-n', name, 'addr', 'add', `${address}/24`, 'dev', nsLink])
      await runCommand([IP, '-n', name, 'link', 'set', nsLink, 'up'])
      await runCommand([IP, '-n', name, 'link', 'set', 'lo', 'up'])
    } catch (error) {
      await ns.destroy()
      throw error
    }
    return ns
  }
  throw new Error(
    `createNetns: no free 10.231.N.0/24 after ${attempts} attempts${lastError ? ` (last: ${lastError})` : ''}`,
  )
}

function makeNetns(p: {
  name: string
  index: number
  address: string
  hostAddress: string
  hostLink: string
  nsLink: string
}): Netns {
  const prefix = [IP, 'netns', 'exec', p.name] as const
  let destroying: Promise<void> | undefined

  const pids = async (): Promise<number[]> => {
    const r = await runCommand([IP, 'netns', 'pids', p.name], {reject: false, timeoutMs: 5000})
    if (r.code !== 0) return []
    return r.stdout
      .split(/\s+/)
      .filter(Boolean)
      .map(Number)
      .filter(n => n !== process.pid)
  }

  const destroy = async (): Promise<void> => {
    const deadline = Date.now() + 10_000
    // Kill until empty: a process may fork while we kill its parent.
    for (;;) {
      const left = await pids()
      if (left.length === 0) break
      if (Date.now() > deadline) break
      for (const pid of left) {
        try {
          process.kill(pid, 'SIGKILL')
        } catch {
          /* gone */
        }
      }
      await new Promise(r => setTimeout(r, 20))
    }
    await runCommand([IP, 'link', 'del', p.hostLink], {reject: false})
    await runCommand([IP, 'netns', 'del', p.name], {reject: false})
    rmSync(join(NETNS_MARKER_DIR, `${p.name}.json`), {force: true})
    live.delete(p.name)
  }

  return {
    ...p,
    prefix,
    exec: (argv, opts = {}) => spawn(prefix[0], [...prefix.slice(1), ...argv], opts),
    run: (argv, opts) => runCommand([...prefix, ...argv], opts),
    pids,
    destroy: () => (destroying ??= destroy()),
  }
}

/**
 * A direct link between two namespaces, as between two nodes on one network: a veth pair pdc-x<A>-<B> (one end in
 * each) and a host route on each side to the other's address, so node A reaches node B at B's own address with no
 * forwarding through the root namespace. The link dies with either namespace.
 */
export async function linkNetns(a: Netns, b: Netns): Promise<void> {
  const [ea, eb] = [`pdc-x${a.index}-${b.index}`, `pdc-y${a.index}-${b.index}`]
  await runCommand([IP, 'link', 'add', ea, 'type', 'veth', 'peer', 'name', eb])
  await runCommand([IP, 'link', 'set', ea, 'netns', a.name])
  await runCommand([IP, 'link', 'set', eb, 'netns', b.name])
  await runCommand([IP, '-n', a.name, 'link', 'set', ea, 'up'])
  await runCommand([IP, '-n', b.name, 'link', 'set', eb, 'up'])
  await runCommand([IP, '-n', a.name, 'route', 'add', `${b.address}/32`, 'dev', ea, 'src', a.address])
  await runCommand([IP, '-n', b.name, 'route', 'add', `${a.address}/32`, 'dev', eb, 'src', b.address])
}
