import {SchedulerCore, matchesAbort} from './scheduler-core.js'
import {KVPoll} from './kvpoll.js'
import {nowMs} from './clock.js'
import type {Req} from './request.js'

/**
 * The decode scheduler (disaggregation/decode.py): prealloc queue (receiver resolves /route) -> KV tokens
 * allocated -> send_metadata -> transfer queue -> running (simulated decode) -> 200.
 */
export class DecodeScheduler extends SchedulerCore {
  preallocQ: Req[] = []
  transferQ: Req[] = []
  runningQ: Req[] = []
  /** Rooms a heartbeat failure just failed, so their 500 names the cause. */
  private readonly lostAddrs = new Set<string>()

  queued(): Req[] {
    return [...this.preallocQ, ...this.transferQ, ...this.runningQ]
  }
  isBusy(): boolean {
    return this.preallocQ.length + this.transferQ.length + this.runningQ.length > 0
  }
  queueSizes(): Record<string, number> {
    return {prealloc: this.preallocQ.length, transfer: this.transferQ.length, running: this.runningQ.length}
  }

  add(req: Req): void {
    req.bootstrapAt = nowMs()
    this.preallocQ.push(req)
    this.enter(req, 'prealloc')
    this.pushOp({op: 'create', room: req.room, rid: req.rid, addr: req.addr, tokens: req.tokens})
  }

  abort(rid: string, abortAll: boolean): number {
    let n = 0
    for (const req of [...this.preallocQ, ...this.transferQ]) {
      if (!matchesAbort(req.rid, rid, abortAll)) continue
      n++
      this.truth.record(req.rid, req.room, 'abort', {queue: req.queue})
      this.pushOp({op: 'abort', room: req.room}) // kv_receiver.abort() also sends ABORT to prefill
    }
    for (const req of [...this.runningQ]) {
      if (!matchesAbort(req.rid, rid, abortAll)) continue
      n++
      this.runningQ = this.runningQ.filter(r => r !== req)
      this.exit(req, 'running')
      this.free(req)
      this.truth.record(req.rid, req.room, 'abort', {queue: 'running'})
      this.answer(req, 200, this.finishBody(req, '', 0, {type: 'abort', message: 'Abort in running'}), 'aborted')
    }
    return n
  }

  /** _handle_node_failure, from the heartbeat: the ranks drop the prefill's info and fail its rooms. */
  nodeFailure(addr: string, why: string): void {
    const affected = [...this.preallocQ, ...this.transferQ].filter(r => r.addr === addr).length
    this.log.error(
      `Lost connection with prefill instance (bootstrap_addr: ${addr}): ${why}, ${affected} requests affected`,
    )
    this.lostAddrs.add(addr)
    this.pushOp({op: 'node_failure', addr})
  }

  async step(): Promise<void> {
    const ops = this.takeOps()
    const polled = [...this.preallocQ, ...this.transferQ]
    const {states, reasons} = await this.ranks.allReduce(
      ops,
      polled.map(r => r.room),
    )
    polled.forEach((r, i) => {
      if (r.queue !== 'done') this.observe(r, states[i]!, reasons.get(i))
    })
    this.lostAddrs.clear()
    let moved = this.popPreallocated()
    moved = this.popTransferred() || moved
    moved = this.runBatch() || moved
    if (moved) this.writeGauges()
    else if (!this.isBusy()) this.onIdle()
  }

  private popPreallocated(): boolean {
    let moved = false
    const keep: Req[] = []
    for (const req of this.preallocQ) {
      if (req.queue !== 'prealloc') continue
      if (req.state === KVPoll.Failed) {
        moved = true
        this.exit(req, 'prealloc')
        this.metrics.inc('sglang:num_bootstrap_failed_reqs_total')
        this.pushOp({op: 'clear', room: req.room})
        this.log.warn(`Decode handshake failed for request rank=0 req.rid='${req.rid}' req.bootstrap_room=${req.room}`)
        this.fail(
          req,
          `Decode handshake failed for request rid=${req.rid} bootstrap_room=${req.room}`,
          'bootstrap_failed',
        )
      } else if (
        req.state !== undefined &&
        req.state >= KVPoll.WaitingForInput &&
        this.allocate(req, req.tokens + req.maxNewTokens)
      ) {
        moved = true
        this.exit(req, 'prealloc')
        this.pushOp({op: 'send_metadata', room: req.room})
        this.transferQ.push(req)
        this.enter(req, 'transfer')
        req.transferAt = nowMs()
      } else keep.push(req)
    }
    this.preallocQ = keep
    return moved
  }

  private popTransferred(): boolean {
    let moved = false
    const keep: Req[] = []
    for (const req of this.transferQ) {
      if (req.queue !== 'transfer') continue
      if (req.state === KVPoll.Failed) {
        moved = true
        this.exit(req, 'transfer')
        this.free(req)
        this.metrics.inc('sglang:num_transfer_failed_reqs_total')
        this.pushOp({op: 'clear', room: req.room})
        const exc = req.failure?.text ?? `KVTransferError(bootstrap_room=${req.room})`
        // pop_transferred (disaggregation/decode.py): logger.error, and the same text is the 500's (prepare_abort).
        const message =
          `Decode transfer failed for request rank=${req.failure?.tpRank ?? 0} ` +
          `decode_req.req.rid='${req.rid}' decode_req.req.bootstrap_room=${req.room} with exception ${exc}`
        this.log.error(message)
        this.fail(req, message, 'transfer_failed')
      } else if (req.state === KVPoll.Success) {
        moved = true
        this.exit(req, 'transfer')
        this.pushOp({op: 'clear', room: req.room})
        if (req.transferAt !== undefined) this.metrics.observeLatency(nowMs() - req.transferAt)
        req.runningAt = nowMs()
        req.streamed = 0
        req.finishAt = req.runningAt + req.maxNewTokens * (this.cfg.timing.decodeMsPerToken ?? 1)
        this.runningQ.push(req)
        this.enter(req, 'running')
        if (req.stream && !req.res.headersSent) {
          req.res.writeHead(200, {'content-type': 'text/event-stream', 'cache-control': 'no-cache'})
          req.headersSent = true
        }
      } else keep.push(req)
    }
    this.transferQ = keep
    return moved
  }

  /** The decode batch: requests whose simulated generation time has passed finish with 200. */
  private runBatch(): boolean {
    const now = nowMs()
    let moved = false
    this.runningQ = this.runningQ.filter(req => {
      if (req.queue !== 'running') return false
      if ((req.finishAt ?? 0) > now) {
        if (req.stream) this.streamProgress(req, now)
        return true
      }
      moved = true
      this.exit(req, 'running')
      this.free(req)
      const text = ' the'.repeat(Math.min(req.maxNewTokens, 4096))
      this.answer(
        req,
        200,
        this.finishBody(req, text, req.maxNewTokens, {type: 'length', length: req.maxNewTokens}),
        'completed',
      )
      return false
    })
    return moved
  }

  /** SSE: a chunk with the cumulative text each time the simulated decode produced new tokens. */
  private streamProgress(req: Req, now: number): void {
    const per = this.cfg.timing.decodeMsPerToken ?? 1
    const produced = Math.min(req.maxNewTokens - 1, Math.floor((now - (req.runningAt ?? now)) / per))
    if (produced <= (req.streamed ?? 0) || req.res.writableEnded || req.res.destroyed) return
    req.streamed = produced
    const chunk = {
      text: ' the'.repeat(Math.min(produced, 4096)),
      meta_info: {id: req.rid, finish_reason: null, prompt_tokens: req.tokens, completion_tokens: produced},
    }
    req.res.write(`data: ${JSON.stringify(chunk)}\n\n`)
  }

  writeGauges(): void {
    this.metrics.setGauge('sglang:num_decode_prealloc_queue_reqs', this.preallocQ.length)
    this.metrics.setGauge('sglang:num_decode_transfer_queue_reqs', this.transferQ.length)
    this.metrics.setGauge('sglang:num_running_reqs', this.runningQ.length)
    this.metrics.setGauge('sglang:num_queue_reqs', 0)
    this.metrics.setGauge('sglang:token_usage', this.tokenUsage())
    this.lastGaugeWrite = nowMs()
    this.loadsSnapshot = {
      num_running_reqs: this.runningQ.length,
      num_waiting_reqs: 0,
      num_used_tokens: this.kvUsed,
      decode_prealloc_queue_reqs: this.preallocQ.length,
      decode_transfer_queue_reqs: this.transferQ.length,
    }
  }

  private onIdle(): void {
    if (nowMs() - this.lastGaugeWrite >= this.cfg.timing.idleGaugeRefreshS * 1000) this.writeGauges()
  }
}
