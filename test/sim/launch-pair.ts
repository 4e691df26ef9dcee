import {serviceEnv} from '../../src/sim/lifecycle/services.js'
import {spawn, type ChildProcess} from 'node:child_process'
import {existsSync, mkdirSync, mkdtempSync, openSync, closeSync, readFileSync, rmSync, writeFileSync} from 'node:fs'
import {createServer} from 'node:net'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {entryArgv} from '../../src/sim/entry.js'
import {simPaths, type BugName, type Role, type SimConfig} from '../../src/sim/sim-config.js'

/**
 * Test-only launcher: a prefill + decode pair of the twin from a temp state dir, started as T2's
 * `sim up` does (sim.json, SGLANG_* env, server-main via entryArgv, logs into DIR/logs). Never a mock.
 */
export interface PairOptions {
  prefillTp?: number
  decodeTp?: number
  backend?: 'nixl' | 'mooncake'
  watchdog?: Partial<SimConfig['watchdog']>
  bugs?: BugName[]
  timeouts?: Partial<SimConfig['timeouts']>
  timing?: Partial<SimConfig['timing']>
  kvPoolTokens?: number
  host?: string
  /** Run the servers through this wrapper argv prefix (e.g. ['ip', 'netns', 'exec', NAME]). */
  wrap?: string[]
  stateDir?: string
  /** The twin's lag options (sim up --entry-lag-ms / --answer-lag-ms). */
  lags?: SimConfig['lags']
}

export interface ServiceFile {
  role: Role
  pid: number
  startedAt: number
  httpUrl: string
  bootstrapUrl?: string
  rankPids: number[]
  rankPorts: Array<{tpRank: number; zmqPort: number; dataPort?: number}>
}

export interface Pair {
  cfg: SimConfig
  stateDir: string
  prefillUrl: string
  decodeUrl: string
  bootstrapUrl: string
  service: (role: Role) => ServiceFile
  procs: Record<Role, ChildProcess>
  /** Start (again) one role; resolves when its service file and /health are up. */
  start: (role: Role) => Promise<void>
  /** SIGTERM one role and wait for it to exit. */
  stopRole: (role: Role) => Promise<number | null>
  truth: (role: Role) => Array<Record<string, unknown>>
  log: (role: Role) => string
  stop: () => Promise<void>
}

export async function freePort(host = '127.0.0.1'): Promise<number> {
  return new Promise((resolve, reject) => {
    const s = createServer()
    s.once('error', reject)
    s.listen(0, host, () => {
      const port = (s.address() as {port: number}).port
      s.close(() => resolve(port))
    })
  })
}

/** The same environment `pdchaos sim up` gives the services (SGLang's variables, the twin's TCP data path). */
export function simEnv(cfg: SimConfig): NodeJS.ProcessEnv {
  return serviceEnv(cfg)
}

export async function launchPair(opts: PairOptions = {}): Promise<Pair> {
  const host = opts.host ?? '127.0.0.1'
  const stateDir = opts.stateDir ?? mkdtempSync(join(tmpdir(), 'pdchaos-pair-'))
  const ports =
    opts.host === undefined
      ? {prefill: await freePort(), decode: await freePort(), bootstrap: await freePort()}
      : {prefill: 30000 + Math.floor(Math.random() * 20000), decode: 0, bootstrap: 0}
  if (opts.host !== undefined) {
    ports.decode = ports.prefill + 1
    ports.bootstrap = ports.prefill + 2
  }
  const cfg: SimConfig = {
    stateDir,
    host,
    model: 'meta-llama/Llama-3.1-8B-Instruct',
    version: '0.5.15',
    gpus: 8,
    prefillTp: opts.prefillTp ?? 2,
    decodeTp: opts.decodeTp ?? 2,
    backend: opts.backend ?? 'nixl',
    watchdog: {scope: 'all', deadlineS: 300, pollS: 1, ...opts.watchdog},
    bugs: opts.bugs ?? [],
    ports: {router: 0, routerMetrics: 0, ...ports},
    timeouts: {bootstrapS: 3600, waitingS: 3600, heartbeatIntervalS: 5, heartbeatMaxFailure: 2, ...opts.timeouts},
    timing: {
      forwardMsPerKToken: 5,
      kvBytesPerToken: 4096,
      healthTimeoutS: 2,
      idleGaugeRefreshS: 30,
      decodeMsPerToken: 1,
      requestStateWaitS: 4,
      ...opts.timing,
    },
    kvPoolTokens: opts.kvPoolTokens ?? 1_000_000,
    ...(opts.lags ? {lags: opts.lags} : {}),
  }
  const paths = simPaths(stateDir)
  mkdirSync(paths.logs, {recursive: true})
  writeFileSync(paths.config, JSON.stringify(cfg, null, 2))
  const env = simEnv(cfg)
  const procs = {} as Record<Role, ChildProcess>

  const readService = (role: Role) => JSON.parse(readFileSync(paths.service(role), 'utf8')) as ServiceFile
  const start = async (role: Role) => {
    const {command, args} = entryArgv(
      new URL('../../src/sim/server/server-main.ts', import.meta.url).href,
      '--role',
      role,
      '--state-dir',
      stateDir,
    )
    const i = args.indexOf('--import')
    if (i >= 0 && args[i + 1] === 'tsx') args[i + 1] = import.meta.resolve('tsx')
    const fd = openSync(paths.log(role), 'a')
    const argv = [...(opts.wrap ?? []), command, ...args]
    const child = spawn(argv[0]!, argv.slice(1), {stdio: ['ignore', fd, fd], env})
    closeSync(fd)
    procs[role] = child
    const deadline = Date.now() + 20_000
    const url = `http://${host}:${cfg.ports[role]}/health`
    while (Date.now() < deadline) {
      if (child.exitCode !== null)
        throw new Error(`${role} exited with ${child.exitCode}:\n${readFileSync(paths.log(role), 'utf8')}`)
      if (existsSync(paths.service(role))) {
        try {
          const svc = readService(role)
          if (svc.pid === child.pid || opts.wrap) {
            const res = await fetch(url, {signal: AbortSignal.timeout(3000)})
            if (res.status === 200) return
          }
        } catch {
          /* not yet */
        }
      }
      await new Promise(r => setTimeout(r, 50))
    }
    throw new Error(`${role} not healthy within 20 s:\n${readFileSync(paths.log(role), 'utf8')}`)
  }
  const stopRole = async (role: Role): Promise<number | null> => {
    const child = procs[role]
    if (!child || child.exitCode !== null || child.signalCode !== null) return child?.exitCode ?? null
    const exited = new Promise<number | null>(resolve => child.once('exit', code => resolve(code)))
    child.kill('SIGTERM')
    const timer = setTimeout(() => child.kill('SIGKILL'), 5000)
    const code = await exited
    clearTimeout(timer)
    return code
  }
  const stop = async () => {
    // Wake any rank a test left stopped, so SIGTERM can be handled; the servers SIGKILL stragglers anyway.
    for (const role of ['prefill', 'decode'] as Role[]) {
      try {
        for (const pid of readService(role).rankPids) process.kill(pid, 'SIGCONT')
      } catch {
        /* gone */
      }
    }
    await Promise.all([stopRole('decode'), stopRole('prefill')])
    if (!opts.stateDir) rmSync(stateDir, {recursive: true, force: true})
  }
  try {
    await start('prefill')
    await start('decode')
  } catch (err) {
    await stop()
    throw err
  }
  const readJsonl = (file: string) =>
    existsSync(file)
      ? readFileSync(file, 'utf8')
          .split('\n')
          .filter(Boolean)
          .map(l => JSON.parse(l) as Record<string, unknown>)
      : []
  return {
    cfg,
    stateDir,
    procs,
    start,
    stopRole,
    stop,
    prefillUrl: `http://${host}:${cfg.ports.prefill}`,
    decodeUrl: `http://${host}:${cfg.ports.decode}`,
    bootstrapUrl: `http://${host}:${cfg.ports.bootstrap}`,
    service: readService,
    truth: role => readJsonl(paths.truth(role)),
    log: role => (existsSync(paths.log(role)) ? readFileSync(paths.log(role), 'utf8') : ''),
  }
}

/** A PD request body as the router builds it (same rid and room for both servers). */
export function pdBody(
  pair: Pair,
  rid: string,
  room: string,
  opts: {tokens?: number; maxNewTokens?: number; stream?: boolean} = {},
): string {
  const text = 'x'.repeat(4 * (opts.tokens ?? 128))
  return (
    `{"rid":${JSON.stringify(rid)},"text":${JSON.stringify(text)},"sampling_params":{"max_new_tokens":${opts.maxNewTokens ?? 4}},` +
    `"stream":${opts.stream === true},"bootstrap_host":${JSON.stringify(pair.cfg.host)},"bootstrap_port":${pair.cfg.ports.bootstrap},"bootstrap_room":${room}}`
  )
}

export interface Answer {
  status: number
  body: string
  at: number
}

/** POST /generate to one server; resolves with status, body and the time the answer arrived (epoch ms). */
export function post(url: string, body: string, signal?: AbortSignal): Promise<Answer> {
  return fetch(`${url}/generate`, {method: 'POST', body, headers: {'content-type': 'application/json'}, signal}).then(
    async res => ({status: res.status, body: await res.text(), at: Date.now()}),
  )
}

export async function abortRid(url: string, rid: string): Promise<number> {
  const res = await fetch(`${url}/abort_request`, {
    method: 'POST',
    body: JSON.stringify({rid}),
    headers: {'content-type': 'application/json'},
  })
  await res.arrayBuffer()
  return res.status
}

/** Poll until `check` returns a truthy value, or throw after timeoutMs. */
export async function waitFor<T>(
  what: string,
  check: () => T | undefined | false | Promise<T | undefined | false>,
  timeoutMs = 10_000,
  everyMs = 25,
): Promise<T> {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    const v = await check()
    if (v) return v
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`)
    await new Promise(r => setTimeout(r, everyMs))
  }
}

/** The value of one sample on /metrics (labels ignored: the twin exports one series per name). */
export async function metric(url: string, name: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text()
  const line = text.split('\n').find(l => l.startsWith(`${name}{`))
  if (!line) throw new Error(`no metric ${name}`)
  return Number(line.slice(line.lastIndexOf(' ') + 1))
}

export async function internalState(url: string): Promise<Record<string, number | string>> {
  const info = (await (await fetch(`${url}/server_info`)).json()) as {
    internal_states: Array<Record<string, number | string>>
  }
  return info.internal_states[0]!
}

/** Ground-truth events of one request. */
export function eventsOf(pair: Pair, role: Role, rid: string): Array<Record<string, unknown>> {
  return pair.truth(role).filter(e => e.rid === rid)
}

export function firstEvent(
  pair: Pair,
  role: Role,
  rid: string,
  event: string,
  queue?: string,
): Record<string, unknown> | undefined {
  return eventsOf(pair, role, rid).find(e => e.event === event && (queue === undefined || e.queue === queue))
}

/** Send SIGSTOP/SIGCONT to one rank process. */
export function signalRank(pair: Pair, role: Role, tpRank: number, signal: 'SIGSTOP' | 'SIGCONT'): number {
  const pid = pair.service(role).rankPids[tpRank]!
  process.kill(pid, signal)
  return pid
}

let roomSeq = BigInt(Date.now()) * 1000n
/** A fresh 63-bit room above 2^53, so that precision loss anywhere would show. */
export function nextRoom(): string {
  roomSeq += 1n
  return ((1n << 62n) + roomSeq).toString()
}

export interface Pin {
  rid: string
  room: string
  prefill: Promise<Answer>
  decode: Promise<Answer>
  stoppedPid: number
}

/**
 * Make a request pinned in Transferring, as a stalled KV WRITE does: send it to both servers with a slow
 * forward, and SIGSTOP decode rank 0 (the receiver of prefill rank 0) once decode's destination info
 * arrived and the forward started. Needs timing.forwardMsPerKToken large enough (500 ms/ktoken, 2000 tokens).
 * The WRITE is one-sided (done when the peer's kernel has ACKed it), so the pin holds only because 2000 tokens
 * are 4 MB per rank, far more than a stopped rank's kernel takes into its receive window (~128 KiB, measured).
 */
export async function pinTransferring(pair: Pair, rid: string, tokens = 2000): Promise<Pin> {
  const room = nextRoom()
  const body = pdBody(pair, rid, room, {tokens})
  const swallow = (p: Promise<Answer>) => {
    p.catch(() => undefined)
    return p
  }
  const prefill = swallow(post(pair.prefillUrl, body))
  const decode = swallow(post(pair.decodeUrl, body))
  await waitFor('prefill forward', () => firstEvent(pair, 'prefill', rid, 'exit', 'waiting'))
  const stoppedPid = signalRank(pair, 'decode', 0, 'SIGSTOP')
  await waitFor('prefill Transferring', () =>
    eventsOf(pair, 'prefill', rid).find(e => e.event === 'state' && e.state === 'KVPoll.Transferring'),
  )
  return {rid, room, prefill, decode, stoppedPid}
}
