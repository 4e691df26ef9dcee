import {SchedulerCore, matchesAbort} from './scheduler-core.js'
import {KVPoll, pollName} from './kvpoll.js'
import {nowMs, sleep} from './clock.js'
import {evictionThresholdS, shouldEvict, heldMs, type WatchdogPolicy} from './watchdog.js'
import type {Req} from './request.js'

/**
 * The watchdog's line for one eviction, as docs/twin.md recommends a watchdog log it: the rid, the room, where it was
 * held and for how long by the watchdog's own clock (to the ms), and the contract it applied.
 */
export function watchdogLogLine(e: {
  rid: string
  room: string
  queue: string
  state: string
  heldS: number
  deadlineS: number
  scope: string
}): string {
  return (
    `Disaggregation watchdog evicted request rid='${e.rid}' bootstrap_room=${e.room} queue=${e.queue} ` +
    `state=${e.state} held=${e.heldS.toFixed(3)}s (deadline ${e.deadlineS}s, scope ${e.scope})`
  )
}

/**
 * The prefill scheduler (disaggregation/prefill.py): bootstrap queue -> waiting queue -> forward ->
 * inflight queue, one all-reduced poll per iteration, and the watchdog under test ticking inside the loop.
 */
export class PrefillScheduler extends SchedulerCore {
  bootstrapQ: Req[] = []
  waitingQ: Req[] = []
  inflightQ: Req[] = []
  private nextTick = 0
  private policy!: WatchdogPolicy

  init(): void {
    const lateMs = this.cfg.watchdog.lateMs
    this.policy = {...this.env.watchdog, bugs: this.cfg.bugs, ...(lateMs ? {lateMs} : {})}
    this.nextTick = nowMs() + this.policy.pollS * 1000
  }

  queued(): Req[] {
    return [...this.bootstrapQ, ...this.waitingQ, ...this.inflightQ]
  }
  isBusy(): boolean {
    return this.bootstrapQ.length + this.waitingQ.length + this.inflightQ.length > 0
  }
  queueSizes(): Record<string, number> {
    return {bootstrap: this.bootstrapQ.length, waiting: this.waitingQ.length, inflight: this.inflightQ.length}
  }

  /** PrefillBootstrapQueue.add: a KVSender on every rank, max_new_tokens forced to 1. */
  add(req: Req): void {
    req.maxNewTokens = 1
    req.bootstrapAt = nowMs()
    this.bootstrapQ.push(req)
    this.enter(req, 'bootstrap')
    this.pushOp({op: 'create', room: req.room, rid: req.rid})
  }

  abort(rid: string, abortAll: boolean): number {
    let n = 0
    for (const req of [...this.waitingQ]) {
      if (!matchesAbort(req.rid, rid, abortAll)) continue
      n++
      this.waitingQ = this.waitingQ.filter(r => r !== req)
      this.exit(req, 'waiting')
      this.pushOp({op: 'clear', room: req.room})
      this.truth.record(req.rid, req.room, 'abort', {queue: 'waiting'})
      this.answer(req, 200, this.finishBody(req, '', 0, {type: 'abort', message: 'Abort before prefill'}), 'aborted')
    }
    for (const req of [...this.bootstrapQ, ...this.inflightQ]) {
      if (!matchesAbort(req.rid, rid, abortAll)) continue
      n++
      // sender.abort(): Failed on the ranks; the next poll handles it as a failure.
      this.truth.record(req.rid, req.room, 'abort', {queue: req.queue})
      this.pushOp({op: 'abort', room: req.room})
    }
    return n
  }

  async step(): Promise<void> {
    const ops = this.takeOps()
    const polled = [...this.bootstrapQ, ...this.waitingQ, ...this.inflightQ]
    const {states, reasons} = await this.ranks.allReduce(
      ops,
      polled.map(r => r.room),
    )
    polled.forEach((r, i) => {
      if (r.queue !== 'done') this.observe(r, states[i]!, reasons.get(i))
    })

    this.popBootstrapped()
    this.resolveWaiting()
    this.processInflight()
    this.watchdogTick()
    const forwarded = await this.forward()
    if (!forwarded) this.onIdle()
  }

  /** pop_bootstrapped: Failed -> bootstrap failure; WaitingForInput -> finalize_bootstrap -> waiting queue. */
  private popBootstrapped(): void {
    const keep: Req[] = []
    for (const req of this.bootstrapQ) {
      if (req.queue !== 'bootstrap') continue
      if (req.state === KVPoll.Failed) {
        this.exit(req, 'bootstrap')
        this.metrics.inc('sglang:num_bootstrap_failed_reqs_total')
        const exc = req.failure?.text ?? `KVTransferError(bootstrap_room=${req.room})`
        this.log.warn(
          `Prefill bootstrap failed for request rank=${req.failure?.tpRank ?? 0} req.rid='${req.rid}' ` +
            `req.bootstrap_room=${req.room} with exception ${exc}`,
        )
        this.pushOp({op: 'clear', room: req.room})
        this.fail(
          req,
          `Prefill bootstrap failed for request rid=${req.rid} bootstrap_room=${req.room} with exception ${exc}`,
          'bootstrap_failed',
        )
      } else if (req.state === KVPoll.WaitingForInput) {
        this.exit(req, 'bootstrap')
        this.waitingQ.push(req)
        this.enter(req, 'waiting')
      } else keep.push(req)
    }
    this.bootstrapQ = keep
  }

  /** resolve_waiting_queue_bootstrap: drop requests that went Failed while waiting for a forward. */
  private resolveWaiting(): void {
    this.waitingQ = this.waitingQ.filter(req => {
      if (req.queue !== 'waiting') return false
      if (req.state !== KVPoll.Failed) return true
      this.exit(req, 'waiting')
      this.transferFailed(req)
      return false
    })
  }

  /** process_disagg_prefill_inflight_queue: Success -> release KV, 200; Failed -> 500; else kept. */
  private processInflight(): void {
    const keep: Req[] = []
    for (const req of this.inflightQ) {
      if (req.queue !== 'inflight') continue
      if (req.state === KVPoll.Success) {
        this.exit(req, 'inflight')
        this.free(req)
        this.pushOp({op: 'clear', room: req.room})
        if (req.transferAt !== undefined) this.metrics.observeLatency(nowMs() - req.transferAt)
        this.answer(req, 200, this.finishBody(req, '', 1, {type: 'length', length: 0}), 'completed')
      } else if (req.state === KVPoll.Failed) {
        this.exit(req, 'inflight')
        this.transferFailed(req)
      } else keep.push(req)
    }
    this.inflightQ = keep
  }

  /**
   * handle_inflight_transfer_failure (prefill.py ~873): the warning names the rank and its failure_exception(), and
   * the same text is the 500's message (prepare_abort). A transport error says so ("transport error (...)").
   */
  private transferFailed(req: Req): void {
    this.free(req)
    this.metrics.inc('sglang:num_transfer_failed_reqs_total')
    const exc = req.failure?.text ?? `KVTransferError(bootstrap_room=${req.room}): Failed to send kv chunk or aborted`
    const message =
      `Prefill transfer failed for request rank=${req.failure?.tpRank ?? 0} req.rid='${req.rid}' ` +
      `req.bootstrap_room=${req.room} with exception ${exc}`
    this.log.warn(message)
    this.pushOp({op: 'clear', room: req.room})
    this.fail(req, message, 'transfer_failed', req.failure ? {exception: exc, tpRank: req.failure.tpRank} : undefined)
  }

  /** The watchdog under test: at each poll tick, evict what has been held past the threshold. */
  private watchdogTick(): void {
    if (this.policy.scope === 'off') return
    const now = nowMs()
    if (now < this.nextTick) return
    while (this.nextTick <= now) this.nextTick += this.policy.pollS * 1000
    const threshold = evictionThresholdS(this.policy)
    for (const req of this.queued()) {
      const queue = req.queue
      if (queue !== 'bootstrap' && queue !== 'waiting' && queue !== 'inflight') continue
      if (!shouldEvict(this.policy, {queue, bootstrapAt: req.bootstrapAt, inflightAt: req.inflightAt}, now)) continue
      const heldS =
        (heldMs(this.policy, {queue, bootstrapAt: req.bootstrapAt, inflightAt: req.inflightAt}, now) ?? 0) / 1000
      if (queue === 'bootstrap') this.bootstrapQ = this.bootstrapQ.filter(r => r !== req)
      if (queue === 'waiting') this.waitingQ = this.waitingQ.filter(r => r !== req)
      if (queue === 'inflight') this.inflightQ = this.inflightQ.filter(r => r !== req)
      this.exit(req, queue)
      if (!this.cfg.bugs.includes('leak-on-evict')) this.free(req)
      else req.kvTokens = 0 // the defect: the tokens stay counted as used, for good
      this.pushOp({op: 'abort', room: req.room})
      this.pushOp({op: 'clear', room: req.room})
      this.metrics.inc('sglang:num_watchdog_evicted_reqs_total')
      const state = pollName(req.state ?? KVPoll.Bootstrapping)
      this.log.warn(
        watchdogLogLine({
          rid: req.rid,
          room: req.room,
          queue,
          state,
          heldS,
          deadlineS: this.policy.deadlineS,
          scope: this.policy.scope,
        }),
      )
      this.truth.record(req.rid, req.room, 'evicted', {
        queue,
        state,
        detail: {heldS, thresholdS: threshold, scope: this.policy.scope},
      })
      this.fail(
        req,
        `Request ${req.rid} evicted by the disaggregation watchdog after ${heldS.toFixed(3)}s in the ${queue} ` +
          `queue (${state})`,
        'watchdog_evicted',
        {heldS},
      )
    }
  }

  /** One prefill batch: everything waiting that fits in the KV pool, simulated forward time, then send KV. */
  private async forward(): Promise<boolean> {
    if (this.waitingQ.length === 0) return false
    const batch: Req[] = []
    const rest: Req[] = []
    for (const req of this.waitingQ) {
      if (req.queue === 'waiting' && this.allocate(req, req.tokens)) batch.push(req)
      else if (req.queue === 'waiting') rest.push(req)
    }
    if (batch.length === 0) return false
    this.waitingQ = rest
    const tokens = batch.reduce((a, r) => a + r.tokens, 0)
    for (const req of batch) this.exit(req, 'waiting')
    await sleep((this.cfg.timing.forwardMsPerKToken * tokens) / 1000)
    for (const req of batch) {
      if (req.queue === 'done') continue
      req.inflightAt = nowMs()
      req.transferAt = req.inflightAt
      this.inflightQ.push(req)
      this.enter(req, 'inflight')
      this.pushOp({op: 'send', room: req.room, tokens: req.tokens})
    }
    this.log.info(
      `Prefill batch. #new-seq: ${batch.length}, #new-token: ${tokens}, #cached-token: 0, token ` +
        `usage: ${this.tokenUsage().toFixed(2)}, #unbootstrapped-req: ${this.bootstrapQ.length}, ` +
        `#queue-req: ${this.waitingQ.length}, #transferring-req: ${this.inflightQ.length}`,
    )
    this.writeGauges()
    return true
  }

  writeGauges(): void {
    this.metrics.setGauge('sglang:num_prefill_bootstrap_queue_reqs', this.bootstrapQ.length)
    this.metrics.setGauge('sglang:num_prefill_inflight_queue_reqs', this.inflightQ.length)
    this.metrics.setGauge('sglang:num_queue_reqs', this.waitingQ.length)
    this.metrics.setGauge('sglang:num_running_reqs', 0)
    this.metrics.setGauge('sglang:token_usage', this.tokenUsage())
    this.lastGaugeWrite = nowMs()
    this.publishLoads()
  }

  publishLoads(): void {
    this.loadsSnapshot = {
      num_running_reqs: 0,
      num_waiting_reqs: this.waitingQ.length,
      num_used_tokens: this.kvUsed,
      prefill_bootstrap_queue_reqs: this.bootstrapQ.length,
      prefill_inflight_queue_reqs: this.inflightQ.length,
    }
  }

  /** on_idle: returns early while the inflight queue is non-empty, so a pinned request freezes the gauges. */
  private onIdle(): void {
    // SGLang publishes the /v1/loads snapshot on every idle iteration ("Prefill and idle always publish immediately",
    // --load-snapshot-publish-interval in server_args.py), held requests or not: the live queue count pdchaos reads.
    this.publishLoads()
    if (this.inflightQ.length > 0) return
    if (nowMs() - this.lastGaugeWrite >= this.cfg.timing.idleGaugeRefreshS * 1000) this.writeGauges()
  }
}
