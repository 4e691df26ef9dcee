import type {ServerResponse} from 'node:http'
import {simPaths, type Role, type SimConfig} from '../sim-config.js'
import {KVPoll, pollName} from './kvpoll.js'
import {Metrics} from './metrics.js'
import {TruthLog} from './truth.js'
import {nowMs} from './clock.js'
import {stringifyRoomJson} from './json-room.js'
import {drawLag} from './lag.js'
import {TokenizerQueue} from './tokenizer.js'
import type {Logger} from './log.js'
import type {EnvSettings} from './settings.js'
import type {RankGroup} from './rank-group.js'
import type {RankOp} from './protocol.js'
import type {QueueName, Req} from './request.js'

const BUSY_YIELD_MS = 1
const BUSY_MAX_YIELD_MS = 20
/** Empty queues: nothing to poll, nothing to change; a request, an abort or a probe wakes the loop at once (kick). */
const IDLE_SLEEP_MS = 500

/**
 * What both roles' schedulers share: the loop (one all-reduce per iteration; never idle while work is
 * queued), the ops batched into the next all-reduce, KV-token accounting, answers to clients, metrics,
 * ground truth and the "did an iteration complete" signal behind /health.
 */
export abstract class SchedulerCore {
  readonly metrics: Metrics
  readonly truth: TruthLog
  protected ops: RankOp[] = []
  kvUsed = 0
  iterations = 0
  running = false
  private wake: (() => void) | undefined
  /** A rank's change told while an iteration ran (after that rank had answered it): the next pause is skipped. */
  private changedMeanwhile = false
  private iterationWaiters: Array<() => void> = []
  lastGaugeWrite = 0
  loadsSnapshot: Record<string, number> = {}
  stopped = false
  /** Set by anything that moved this iteration (a new op, a state change, a queue move). */
  protected activity = false
  /** `--entry-lag-ms`: requests and aborts the HTTP server handed over, in order, until the next receive. */
  private inbox: Array<{req: Req} | {abort: string; abortAll: boolean}> = []
  private receiveTimer: NodeJS.Timeout | undefined
  /** `--tokenize-ms`: requests tokenized one at a time before they reach the scheduler (tokenizer.ts). */
  readonly tokenizer: TokenizerQueue

  constructor(
    readonly role: Role,
    readonly cfg: SimConfig,
    readonly env: EnvSettings,
    readonly ranks: RankGroup,
    readonly log: Logger,
    stateDir: string,
  ) {
    this.metrics = new Metrics(
      role,
      cfg.model,
      new Set(cfg.bugs.includes('no-watchdog-counter') ? ['sglang:num_watchdog_evicted_reqs_total'] : []),
    )
    this.truth = new TruthLog(simPaths(stateDir).truth(role), role)
    this.tokenizer = new TokenizerQueue(cfg.lags?.tokenize)
    // A rank's change between steps (a decode's info arriving, a transfer done) brings the next iteration now.
    ranks.onChanged = () => {
      if (this.wake) this.wake()
      else this.changedMeanwhile = true
    }
  }

  abstract step(): Promise<void>
  abstract add(req: Req): void
  abstract abort(rid: string, abortAll: boolean): number
  abstract queued(): Req[]
  abstract isBusy(): boolean
  abstract queueSizes(): Record<string, number>

  /**
   * A request from the HTTP server. SGLang's scheduler takes new requests (recv_requests) once per loop iteration, so
   * a long forward pass delays their entry into the queues: with `--entry-lag-ms` they wait for the next receive.
   */
  receive(req: Req): void {
    if (!this.cfg.lags?.entry) return this.add(req)
    this.inbox.push({req})
  }

  /** An /abort_request (or a client gone): through the same channel as requests, so it keeps their order. */
  receiveAbort(rid: string, abortAll: boolean): void {
    if (!this.cfg.lags?.entry) return this.abortNow(rid, abortAll)
    this.inbox.push({abort: rid, abortAll})
  }

  private abortNow(rid: string, abortAll: boolean): void {
    const n = this.abort(rid, abortAll)
    if (n > 0) this.metrics.inc('sglang:num_aborted_requests_total', n)
  }

  /** `--entry-lag-ms`: the receives, every N ms (± jitter), whatever the loop does meanwhile. */
  private scheduleReceive(): void {
    const lag = this.cfg.lags?.entry
    if (!lag || this.stopped) return
    this.receiveTimer = setTimeout(() => {
      const items = this.inbox
      this.inbox = []
      for (const it of items) {
        if ('req' in it) this.add(it.req)
        else this.abortNow(it.abort, it.abortAll)
      }
      if (items.length > 0) this.kick()
      this.scheduleReceive()
    }, drawLag(lag))
  }

  /** The scheduler loop. A wedged all-reduce blocks it (and with it evictions, gauges and /health). */
  async run(): Promise<void> {
    this.running = true
    this.scheduleReceive()
    let busyWait = BUSY_YIELD_MS
    while (!this.stopped) {
      this.activity = false
      await this.step()
      this.iterations++
      const waiters = this.iterationWaiters
      this.iterationWaiters = []
      for (const w of waiters) w()
      // Never idle while work is queued; but back off to a few ms while nothing moves, so 2 cores are not burned.
      busyWait = this.activity ? BUSY_YIELD_MS : Math.min(busyWait * 2, BUSY_MAX_YIELD_MS)
      await this.pause(this.isBusy() ? busyWait : IDLE_SLEEP_MS)
    }
  }

  private pause(ms: number): Promise<void> {
    if (this.changedMeanwhile) {
      this.changedMeanwhile = false
      // Still a macrotask: the HTTP server and the ranks' messages get their turn between iterations.
      return new Promise<void>(resolve => setImmediate(resolve))
    }
    return new Promise<void>(resolve => {
      const t = setTimeout(() => {
        this.wake = undefined
        resolve()
      }, ms)
      this.wake = () => {
        clearTimeout(t)
        this.wake = undefined
        resolve()
      }
    })
  }

  kick(): void {
    this.wake?.()
  }

  /** True when an iteration completes within timeoutMs (what /health and /health_generate report). */
  waitIteration(timeoutMs: number): Promise<boolean> {
    if (!this.running) return Promise.resolve(false)
    return new Promise<boolean>(resolve => {
      const t = setTimeout(() => {
        this.iterationWaiters = this.iterationWaiters.filter(w => w !== done)
        resolve(false)
      }, timeoutMs)
      const done = () => {
        clearTimeout(t)
        resolve(true)
      }
      this.iterationWaiters.push(done)
      this.kick()
    })
  }

  protected takeOps(): RankOp[] {
    const ops = this.ops
    this.ops = []
    return ops
  }

  pushOp(op: RankOp): void {
    this.ops.push(op)
    this.activity = true
    this.kick()
  }

  enter(req: Req, queue: QueueName): void {
    req.queue = queue
    this.activity = true
    this.truth.record(req.rid, req.room, 'enter', {queue})
  }

  exit(req: Req, queue: QueueName): void {
    this.truth.record(req.rid, req.room, 'exit', {queue})
  }

  /** Record an all-reduced KVPoll change (and, for a failure, the first reason a rank gave). */
  observe(req: Req, state: number, failure?: {tpRank: number; text: string}): void {
    if (failure && !req.failure) req.failure = failure
    if (req.state === state) return
    req.state = state
    this.activity = true
    this.truth.record(req.rid, req.room, 'state', {queue: req.queue, state: pollName(state)})
  }

  allocate(req: Req, tokens: number): boolean {
    if (this.kvUsed + tokens > this.cfg.kvPoolTokens) return false
    this.kvUsed += tokens
    req.kvTokens = tokens
    return true
  }

  free(req: Req): void {
    this.kvUsed -= req.kvTokens
    req.kvTokens = 0
  }

  tokenUsage(): number {
    return this.kvUsed / this.cfg.kvPoolTokens
  }

  /** Finish a request towards its client. Failure: 500 with SGLang's error shape. */
  answer(
    req: Req,
    status: number,
    body: Record<string, unknown>,
    event: string,
    detail?: Record<string, unknown> | string,
  ): void {
    if (req.queue === 'done') return
    req.queue = 'done'
    clearTimeout(req.disconnectTimer)
    this.truth.record(req.rid, req.room, event, {
      detail,
      state: req.state === undefined ? undefined : pollName(req.state),
    })
    // `--answer-lag-ms`: released now (the truth above), answered later, as through a slow detokenizer and HTTP path.
    const lag = this.cfg.lags?.answer
    if (!lag) return writeAnswer(req.res, req.stream, status, body, req.headersSent === true)
    setTimeout(() => writeAnswer(req.res, req.stream, status, body, req.headersSent === true), drawLag(lag))
  }

  fail(req: Req, message: string, event: string, detail?: Record<string, unknown> | string): void {
    this.answer(req, 500, {error: {message, code: 500}}, event, detail)
  }

  /** The finish body SGLang's /generate returns. */
  finishBody(
    req: Req,
    text: string,
    completion: number,
    finishReason: Record<string, unknown>,
  ): Record<string, unknown> {
    return {
      text,
      meta_info: {
        id: req.rid,
        finish_reason: finishReason,
        prompt_tokens: req.tokens,
        completion_tokens: completion,
        cached_tokens: 0,
        e2e_latency: (nowMs() - req.arrivedAt) / 1000,
        bootstrap_room: req.room,
      },
    }
  }

  close(): void {
    this.stopped = true
    clearTimeout(this.receiveTimer)
    this.kick()
    const unreceived = this.inbox.flatMap(it => ('req' in it ? [it.req] : []))
    this.inbox = []
    for (const r of [...this.queued(), ...unreceived]) {
      if (r.queue !== 'done')
        writeAnswer(r.res, r.stream, 503, {error: {message: 'server shutting down', code: 503}}, r.headersSent === true)
    }
    this.truth.close()
  }
}

export function matchesAbort(rid: string, target: string, abortAll: boolean): boolean {
  return abortAll || (target !== '' && rid.startsWith(target))
}

function writeAnswer(
  res: ServerResponse,
  stream: boolean,
  status: number,
  body: Record<string, unknown>,
  headersSent: boolean,
): void {
  if (res.writableEnded || res.destroyed) return
  if (stream) {
    if (!headersSent) {
      if (status !== 200) {
        res.writeHead(status, {'content-type': 'application/json'}).end(JSON.stringify(body))
        return
      }
      res.writeHead(200, {'content-type': 'text/event-stream', 'cache-control': 'no-cache'})
    }
    res.write(`data: ${stringifyRoomJson(body)}\n\n`)
    res.end('data: [DONE]\n\n')
    return
  }
  res.writeHead(status, {'content-type': 'application/json'}).end(stringifyRoomJson(body))
}

export {KVPoll}
