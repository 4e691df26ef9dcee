import {mkdtempSync, readFileSync, readdirSync, rmSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {afterAll, expect, type TestContext} from 'vitest'
import type {ServerResponse} from 'node:http'

import {DeploymentSchema, type Deployment} from '../../src/deployment/config.js'
import type {RankInfo} from '../../src/engines/sglang/discovery/discover.js'
import {RunSession} from '../../src/experiment/session.js'
import type {FaultDiscovery} from '../../src/faults/fault.js'
import {listLeases, revertLease} from '../../src/faults/lease/lease.js'
import {REVERTER_SH} from '../../src/faults/lease/reverter-script.js'
import {twinFailpointArgv} from '../../src/faults/mechanisms/twin-failpoint.js'
import type {DetachedOptions, Host, RunOptions, RunResult, UploadOptions} from '../../src/hosts/host.js'
import {LocalHost} from '../../src/hosts/local-host.js'
import {eventually} from '../hosts/proc.js'

export {eventually}
import {sendJson, startHttp, type TestServer} from '../deployment/servers.js'

/**
 * A scripted PD deployment inside the test process, for the runner's unit tests: prefill, decode and router HTTP
 * servers on 127.0.0.1 that answer what the runner asks (calibration, /generate, /abort_request, /v1/loads, /metrics,
 * health), plus the twin's failure-point endpoint on prefill. While a failure point is on, the router holds every
 * /generate and a scripted "watchdog" answers it 500 after `evictAfterMs` (or never), counting it in
 * sglang:num_watchdog_evicted_reqs_total as the twin does; with every failure point off, requests answer 200 at once.
 */

export const FAILPOINT_PATH = '/_pdchaos/twin/failpoint'

export interface FakeOptions {
  /**
   * Milliseconds after which a held request is evicted (500); null: the watchdog never evicts it. A function decides
   * per held request, by the order the router received them (0 for the first), and whether the router holds it.
   */
  evictAfterMs: number | null | ((heldIndex: number, routed: boolean) => number | null)
  /** The failure-point endpoint accepts POST but its GET never shows a rank on (the fault does not take effect). */
  failpointIgnoresPosts?: boolean
  /** Status of prefill's /generate (calibration): 503 makes it an unhealthy deployment. */
  prefillGenerateStatus?: number
  /** Prefill answers /abort_request 200 but lets a held request go on (a target that ignores an abort mid-transfer). */
  prefillIgnoresAborts?: boolean
  /**
   * The gateway's circuit breaker. It counts the routed requests an abort released (the cleanup's: the failures that
   * end last, after the revert), each one `lagMs` after the abort (a gateway counts an attempt when decode's half
   * ends; the client is answered then too); at `threshold` it opens for `openMs`: /generate answers 503 and /metrics
   * shows smg_worker_cb_state 1. With `opensAtRid` it also opens, once, as a request whose rid matches arrives
   * (traffic pdchaos does not see tipping it).
   */
  breaker?: {threshold: number; lagMs: number; openMs: number; opensAtRid?: RegExp}
}

interface Held {
  rid: string
  res: ServerResponse
  timer?: NodeJS.Timeout
  /** Held by the router (load, canaries), not by prefill (a pin sent directly). */
  routed: boolean
}

type FailpointName = 'drop-dest-info' | 'stall-kv'

export class FakePd {
  readonly failpoints = new Map<FailpointName, Set<number>>([
    ['drop-dest-info', new Set()],
    ['stall-kv', new Set()],
  ])
  /** Every POST to the failure-point endpoint, in order. */
  readonly failpointPosts: Array<{name: string; enabled: boolean; tpRanks: number[]}> = []
  /** Requests held right now (by the router, or by prefill for a pin sent directly), by rid. */
  readonly held = new Map<string, Held>()
  /** Decode's halves of pins sent directly, waiting for a transfer that the fault holds. */
  readonly decodeHeld = new Map<string, ServerResponse>()
  /** rids the router answered 200 at once (no failure point on). */
  readonly routed: string[] = []
  /** Every rid prefill's /generate was asked for, and a hook the test may set on each. */
  readonly prefillGenerates: string[] = []
  onPrefillGenerate: ((rid: string) => void) | undefined
  /** rids the router held, in the order it received them. */
  readonly heldRids: string[] = []
  /** rids the scripted watchdog evicted (answered 500, counted in sglang:num_watchdog_evicted_reqs_total). */
  readonly evicted: string[] = []
  /** rids released by POST /abort_request on prefill or decode (answered 500, counted as aborted). */
  readonly aborted: string[] = []
  /** When the breaker opened and closed (performance.now()), each time. */
  readonly breakerOpenings: Array<{from: number; to: number}> = []
  private breakerFailures = 0
  private breakerTripped = false
  private closed = false

  private constructor(
    readonly opts: FakeOptions,
    readonly prefill: TestServer,
    readonly decode: TestServer,
    readonly router: TestServer,
  ) {}

  static async start(opts: FakeOptions): Promise<FakePd> {
    let fake: FakePd | undefined
    const prefill = await startHttp((req, res) =>
      fake!.serveSglang('prefill', req.method ?? 'GET', req.url ?? '/', req.body, res),
    )
    const decode = await startHttp((req, res) =>
      fake!.serveSglang('decode', req.method ?? 'GET', req.url ?? '/', req.body, res),
    )
    const router = await startHttp((req, res) => fake!.serveRouter(req.method ?? 'GET', req.url ?? '/', req.body, res))
    fake = new FakePd(opts, prefill, decode, router)
    return fake
  }

  get failpointUrl(): string {
    return `${this.prefill.url}${FAILPOINT_PATH}`
  }

  /** Any failure point on any rank: in a TP group every request spans all ranks, so every request is held. */
  get faulted(): boolean {
    return [...this.failpoints.values()].some(s => s.size > 0)
  }

  failpointState(): Record<string, number[]> {
    return Object.fromEntries([...this.failpoints].map(([k, v]) => [k, [...v].sort((a, b) => a - b)]))
  }

  /** The deployment file the runner reads: these three servers, a fast watchdog contract, leases under stateDir. */
  deployment(stateDir: string, watchdog: {deadlineSeconds: number; pollSeconds: number}): Deployment {
    return DeploymentSchema.parse({
      name: 'fake-pd',
      host: {kind: 'local'},
      stateDir,
      backend: 'nixl',
      services: {
        prefill: {url: this.prefill.url, bootstrapPort: 8998},
        decode: {url: this.decode.url},
        router: {url: this.router.url},
      },
      watchdog: {scope: 'all', ...watchdog},
    })
  }

  /** What discovery would have seen on the twin this fake stands for (see seededDiscovery). */
  discovery(): FaultDiscovery {
    return seededDiscovery(this.failpointUrl, [this.prefill.port, this.decode.port, this.router.port, 8998])
  }

  /** Stop every watchdog timer, then the servers (held answers are cut). */
  async close(): Promise<void> {
    this.closed = true
    for (const h of this.held.values()) clearTimeout(h.timer)
    this.held.clear()
    this.decodeHeld.clear()
    await Promise.all([this.prefill.close(), this.decode.close(), this.router.close()])
  }

  private serveRouter(method: string, url: string, body: string, res: ServerResponse): void {
    const path = url.split('?')[0]
    if (method === 'POST' && path === '/generate') {
      const rid = ridOf(body)
      const b = this.opts.breaker
      if (b?.opensAtRid?.test(rid) && !this.breakerTripped) {
        this.breakerTripped = true
        this.openBreaker()
      }
      if (this.breakerOpen)
        return sendJson(res, 503, {
          error: {
            message: 'No available servers: No available prefill workers (all circuits open or unhealthy)',
            code: 503,
          },
        })
      if (!this.faulted) {
        this.routed.push(rid)
        return sendJson(res, 200, answer(rid))
      }
      this.hold(rid, res, true)
      return
    }
    if (['/health', '/liveness', '/readiness'].includes(path)) return sendJson(res, 200, {})
    if (path === '/metrics') {
      const cb = this.opts.breaker
        ? `smg_worker_cb_state{worker="${this.prefill.url}"} ${this.breakerOpen ? 1 : 0}\n`
        : ''
      return text(res, 200, `# TYPE sgl_router_requests counter\nsgl_router_requests_total 0\n${cb}`)
    }
    sendJson(res, 404, {error: 'not found'})
  }

  private get breakerOpen(): boolean {
    const last = this.breakerOpenings.at(-1)
    return last !== undefined && performance.now() < last.to
  }

  private openBreaker(): void {
    if (!this.breakerOpen)
      this.breakerOpenings.push({from: performance.now(), to: performance.now() + this.opts.breaker!.openMs})
  }

  /** A routed request an abort released: counted by the breaker and answered lagMs later, as a gateway does. */
  private abortRouted(h: Held, status: number, body: unknown): void {
    const b = this.opts.breaker
    if (!b) return sendJson(h.res, status, body)
    setTimeout(() => {
      if (this.closed) return
      if (++this.breakerFailures >= b.threshold) this.openBreaker()
      sendJson(h.res, status, body)
    }, b.lagMs)
  }

  private hold(rid: string, res: ServerResponse, routed = false): void {
    const h: Held = {rid, res, routed}
    this.held.set(rid, h)
    const index = this.heldRids.push(rid) - 1
    const evictAfterMs =
      typeof this.opts.evictAfterMs === 'function' ? this.opts.evictAfterMs(index, routed) : this.opts.evictAfterMs
    // The client went away (pdchaos stopped watching): nobody is left to answer, so the fake forgets the request.
    res.on('close', () => {
      if (this.held.get(rid) === h) {
        clearTimeout(h.timer)
        this.held.delete(rid)
      }
    })
    if (evictAfterMs !== null) {
      h.timer = setTimeout(() => {
        if (this.held.get(rid) !== h || this.closed) return
        this.held.delete(rid)
        this.evicted.push(rid)
        // With the time it held the request, as the twin's watchdog says it (the abort check reads entry from it).
        sendJson(res, 500, {
          error: {
            message:
              `watchdog: evicted ${rid} after ${(evictAfterMs / 1000).toFixed(3)}s from the bootstrap queue ` +
              `(KVPoll.Bootstrapping)`,
            code: 500,
          },
        })
      }, evictAfterMs)
    }
  }

  private serveSglang(
    role: 'prefill' | 'decode',
    method: string,
    url: string,
    body: string,
    res: ServerResponse,
  ): void {
    const path = url.split('?')[0]
    if (method === 'POST' && path === '/generate') {
      const rid = ridOf(body)
      if (role === 'prefill') {
        this.prefillGenerates.push(rid)
        this.onPrefillGenerate?.(rid)
      }
      // A pin sent directly: prefill holds it (its watchdog evicts it); decode's half waits until dropped or aborted.
      if (this.faulted && role === 'prefill') return this.hold(rid, res)
      if (this.faulted && role === 'decode') {
        this.decodeHeld.set(rid, res)
        res.on('close', () => {
          if (this.decodeHeld.get(rid) === res) this.decodeHeld.delete(rid)
        })
        return
      }
      const status = role === 'prefill' ? (this.opts.prefillGenerateStatus ?? 200) : 200
      return status === 200
        ? sendJson(res, 200, answer(rid))
        : sendJson(res, status, {error: {message: 'Service Unavailable (scripted)', code: status}})
    }
    if (method === 'POST' && path === '/abort_request') {
      const rid = ridOf(body)
      const d = role === 'decode' ? this.decodeHeld.get(rid) : undefined
      if (d) {
        this.decodeHeld.delete(rid)
        sendJson(d, 500, {error: {message: `aborted ${rid}`, code: 500}})
      }
      const ignored = role === 'prefill' && this.opts.prefillIgnoresAborts
      const h = !ignored && (role === 'prefill' || !d) ? this.held.get(rid) : undefined
      if (h) {
        clearTimeout(h.timer)
        this.held.delete(rid)
        this.aborted.push(rid)
        // SGLang prefill's words for a request aborted in its inflight queue (prefill.py
        // handle_inflight_transfer_failure).
        const words = {
          error: {
            message:
              `Prefill transfer failed for request rank=0 req.rid='${rid}' req.bootstrap_room=0 with ` +
              `exception KVTransferError(bootstrap_room=0): Aborted by AbortReq.`,
            code: 500,
          },
        }
        if (h.routed) this.abortRouted(h, 500, words)
        else sendJson(h.res, 500, words)
      }
      return sendJson(res, 200, {})
    }
    if (role === 'prefill' && path === FAILPOINT_PATH) return this.serveFailpoint(method, body, res)
    if (path === '/v1/loads') {
      const q =
        role === 'prefill'
          ? {sglang_disagg_prefill_bootstrap_queue_reqs: this.held.size, sglang_disagg_prefill_inflight_queue_reqs: 0}
          : {sglang_disagg_decode_prealloc_queue_reqs: 0, sglang_disagg_decode_transfer_queue_reqs: 0}
      const lines = Object.entries({...q, sglang_num_used_tokens: 0, sglang_num_running_reqs: 0}).map(
        ([k, v]) => `${k}{dp_rank="0"} ${v}`,
      )
      return text(res, 200, lines.join('\n') + '\n')
    }
    if (path === '/metrics') {
      const counters = {
        'sglang:num_bootstrap_failed_reqs_total': 0,
        'sglang:num_transfer_failed_reqs_total': 0,
        'sglang:num_aborted_requests_total': role === 'prefill' ? this.aborted.length : 0,
        'sglang:num_watchdog_evicted_reqs_total': role === 'prefill' ? this.evicted.length : 0,
        'sglang:num_prefill_bootstrap_queue_reqs': 0,
        'sglang:num_running_reqs': 0,
        'sglang:token_usage': 0,
      }
      return text(
        res,
        200,
        Object.entries(counters)
          .map(([k, v]) => `${k}{model_name="fake"} ${v}`)
          .join('\n') + '\n',
      )
    }
    if (['/health', '/health_generate'].includes(path)) return sendJson(res, 200, {})
    sendJson(res, 404, {error: 'not found'})
  }

  private serveFailpoint(method: string, body: string, res: ServerResponse): void {
    if (method !== 'POST') return sendJson(res, 200, {failpoints: this.failpointState()})
    let b: {name?: unknown; enabled?: unknown; tpRanks?: unknown}
    try {
      b = JSON.parse(body || '{}') as typeof b
    } catch {
      return sendJson(res, 400, {error: {message: 'body must be JSON'}})
    }
    const set = this.failpoints.get(b.name as FailpointName)
    if (!set || typeof b.enabled !== 'boolean' || !Array.isArray(b.tpRanks))
      return sendJson(res, 400, {error: {message: 'need {name, enabled, tpRanks}'}})
    const tpRanks = b.tpRanks.filter((k): k is number => Number.isInteger(k))
    this.failpointPosts.push({name: b.name as string, enabled: b.enabled, tpRanks})
    if (!this.opts.failpointIgnoresPosts) for (const k of tpRanks) b.enabled ? set.add(k) : set.delete(k)
    sendJson(res, 200, {failpoints: this.failpointState()})
  }
}

/**
 * What discovery would have seen on a 4-GPU twin: prefill TP0..1 on GPUs 0-1 (with ZMQ ports), decode TP0..1 on GPUs
 * 2-3, NIXL without UCX_TLS (not a TCP data path, so nothing is widened), and the twin's failure point at failpointUrl.
 */
export function seededDiscovery(failpointUrl: string, servicePorts: number[]): FaultDiscovery {
  const rank = (service: 'prefill' | 'decode', tp: number): RankInfo => ({
    service,
    tpRank: tp,
    pid: 4_000_000 + (service === 'prefill' ? 0 : 100) + tp,
    startTicks: 1000 + tp,
    state: 'S',
    title: `sglang::scheduler_TP${tp}`,
    gpu: service === 'prefill' ? tp : 2 + tp,
    ...(service === 'prefill' ? {zmqPort: 45_000 + tp, zmqHost: '127.0.0.1'} : {}),
  })
  return {
    ranks: [rank('prefill', 0), rank('prefill', 1), rank('decode', 0), rank('decode', 1)],
    transport: {backend: 'nixl', source: 'fake deployment (test)'},
    servicePorts,
    twinFailpointUrl: failpointUrl,
  }
}

function ridOf(body: string): string {
  try {
    return String((JSON.parse(body) as {rid?: unknown}).rid ?? '')
  } catch {
    return ''
  }
}

const answer = (rid: string) => ({
  text: ' ok',
  meta_info: {id: rid, finish_reason: {type: 'length', length: 1}, prompt_tokens: 16, completion_tokens: 1},
})

function text(res: ServerResponse, status: number, body: string): void {
  res.writeHead(status, {'content-type': 'text/plain; version=0.0.4'})
  res.end(body)
}

/** A RunSession whose discovery is seeded (the fake has no processes, ports or nvidia-smi to discover). */
export class SeededSession extends RunSession {
  constructor(
    deployment: Deployment,
    host: Host,
    private readonly seeded: FaultDiscovery,
  ) {
    super(deployment, host)
  }

  override async discovery(say?: (l: string) => void): Promise<FaultDiscovery> {
    say?.('discovering the deployment (seeded by the test)')
    return this.seeded
  }
}

/** What a scripted command answers instead of running: a result, or undefined to run it for real. */
export type Script = (argv: string[]) => RunResult | undefined

const result = (code: number, stdout = '', stderr = ''): RunResult => ({code, stdout, stderr, durationMs: 0})

/** The constant script of the twin-failpoint commands (`node -e SCRIPT url [body]`). */
const FAILPOINT_SCRIPT = twinFailpointArgv('http://127.0.0.1/')[2]

/**
 * The real LocalHost (leases are real files and a real detached reverter; the lease's revert script really runs
 * `node -e` on this machine and reaches the fake), except the tools that would make a test depend on this machine:
 * no packet filter (so a plan never picks one, root or not), an empty connection listing, no kernel log. With
 * `nodeInProcess`, the twin-failpoint commands pdchaos runs itself (inject, verify, probes) are answered by the same
 * fetch in this process instead of a node process (a node start costs up to a second on a loaded machine); the revert
 * inside the lease script always runs the real command. A test may script more.
 */
export class ScriptedHost implements Host {
  readonly ran: string[][] = []
  script: Script | undefined
  private readonly local = new LocalHost('never')

  constructor(readonly opts: {nodeInProcess: boolean} = {nodeInProcess: true}) {}

  async run(argv: string[], opts: RunOptions): Promise<RunResult> {
    this.ran.push(argv)
    const scripted = this.script?.(argv) ?? defaultScript(argv)
    if (scripted) return scripted
    if (this.opts.nodeInProcess && argv[0] === 'node' && argv[1] === '-e' && argv[2] === FAILPOINT_SCRIPT)
      return failpointInProcess(argv[3]!, argv[4])
    return this.local.run(argv, opts)
  }

  upload(path: string, content: string | Buffer, mode?: number, opts?: UploadOptions): Promise<void> {
    return this.local.upload(path, content, mode, opts)
  }

  startDetached(argv: string[], opts?: DetachedOptions): Promise<{pid: number}> {
    this.ran.push(argv)
    return this.local.startDetached(argv, opts)
  }

  describe(): string {
    return 'local (scripted)'
  }

  async close(): Promise<void> {}
}

/** What FAILPOINT_SCRIPT does: GET, or POST the body; print the answer; exit 0 only on a 2xx. */
async function failpointInProcess(url: string, body: string | undefined): Promise<RunResult> {
  const started = performance.now()
  try {
    const r = await fetch(url, {
      method: body ? 'POST' : 'GET',
      headers: {'content-type': 'application/json'},
      body: body || undefined,
      signal: AbortSignal.timeout(5000),
    })
    return {code: r.ok ? 0 : 1, stdout: await r.text(), stderr: '', durationMs: performance.now() - started}
  } catch (error) {
    return {code: 1, stdout: '', stderr: String(error), durationMs: performance.now() - started}
  }
}

function defaultScript(argv: string[]): RunResult | undefined {
  switch (argv[0]) {
    case 'nft':
    case 'iptables':
    case 'iptables-save':
      return result(127, '', `pdchaos: ${argv[0]}: ENOENT (scripted: no packet filter in unit tests)\n`)
    case 'ss':
      return result(0, '')
    case 'dmesg':
    case 'journalctl':
      return result(1, '', 'scripted: no kernel log in unit tests\n')
    default:
      return undefined
  }
}

/** Is this argv the lease reverter run inline to revert lease `id` now? */
export const isInlineRevert = (argv: string[]): boolean =>
  argv[0] === 'sh' && argv[1] === '-c' && argv[2] === REVERTER_SH && argv[4] === 'revert'

/** Pids whose command line contains needle (the reverters of a state dir name it in their argv). */
export function pidsMatching(needle: string): number[] {
  const out: number[] = []
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name) || Number(name) === process.pid) continue
    try {
      if (readFileSync(`/proc/${name}/cmdline`, 'utf8').replaceAll('\0', ' ').includes(needle)) out.push(Number(name))
    } catch {
      /* exited */
    }
  }
  return out
}

/**
 * A fresh state dir per call, under one temp root for the test file. After the file: the root's reverters are killed
 * (each test already waited for its own to end) and the root is removed.
 */
export function stateDirs(prefix: string): () => string {
  const root = mkdtempSync(join(tmpdir(), prefix))
  let n = 0
  afterAll(() => {
    for (const pid of pidsMatching(`pdchaos-reverter watch ${root}/`)) {
      try {
        process.kill(pid, 'SIGKILL')
      } catch {
        /* gone */
      }
    }
    rmSync(root, {recursive: true, force: true})
  })
  return () => join(root, `t${++n}`)
}

/**
 * A fake deployment and a scripted host for one test, with its state dir. When the test ends: any lease it left armed
 * is reverted (and fails the test), the fake is closed, and the state dir's reverters must be gone.
 */
export async function fakeTarget(
  ctx: TestContext,
  stateDir: string,
  opts: FakeOptions,
  hostOpts?: {nodeInProcess: boolean},
): Promise<{fake: FakePd; host: ScriptedHost}> {
  const host = new ScriptedHost(hostOpts)
  const fake = await FakePd.start(opts)
  ctx.onTestFinished(async () => {
    host.script = undefined
    let left: string[] = []
    try {
      left = (await listLeases(host, stateDir)).active.map(l => l.id)
      for (const id of left) await revertLease(host, stateDir, id, 'recover')
    } finally {
      await fake.close()
    }
    expect(left, 'leases left armed on the host').toEqual([])
    expect(
      await eventually(() => pidsMatching(`pdchaos-reverter watch ${stateDir} `).length === 0, 5000),
      'reverters left running',
    ).toBe(true)
  })
  return {fake, host}
}
