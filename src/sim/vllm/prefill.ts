import net from 'node:net'

import {nowMs} from '../server/clock.js'
import type {TruthLog} from '../server/truth.js'
import {onLines, vlog, writeLine} from './common.js'
import {hasBug, type VllmTwinConfig} from './config.js'
import {blocksFor, type EngineCounters} from './engine-state.js'
import {LeaseTable} from './lease.js'

/** A request P prefills for a remote decode (`kv_transfer_params.do_remote_decode`). */
export interface PrefillJob {
  id: string
  tokens: number
  answer: (status: number, body: unknown) => void
}

const WORKER = 'base_worker.py'

/**
 * The prefill instance's side of the NIXL pull hand-over: prefill, pin the blocks under a lease
 * (pull_scheduler.py `request_finished`), answer with kv_transfer_params, serve D's READs, take D's notifications
 * (heartbeats "HB:…" and read completions) and reap expired leases each step (base_worker.py `get_finished`).
 */
export class PrefillSide {
  readonly leases = new LeaseTable()
  /** Blocks pinned per request (freed when the lease ends). */
  private readonly pinned = new Map<string, {blocks: number; bytes: number; grantedMs: number; reads: number}>()
  private readonly waiting: PrefillJob[] = []
  private readonly notifs: Array<{msg: string; why?: string}> = []
  readonly engineId = `vllm-twin-prefill-${process.pid}-${nowMs().toString(36)}`

  constructor(
    private readonly c: VllmTwinConfig,
    private readonly k: EngineCounters,
    private readonly truth: TruthLog,
    private readonly wake: () => void,
  ) {}

  get pending(): boolean {
    return this.waiting.length > 0 || this.notifs.length > 0 || this.leases.size > 0
  }

  usedBlocks(): number {
    let n = 0
    for (const p of this.pinned.values()) n += p.blocks
    return n
  }

  submit(job: PrefillJob): void {
    this.truth.record(job.id, null, 'received', {detail: {tokens: job.tokens}})
    this.waiting.push(job)
    this.wake()
  }

  /** The NIXL handshake listener (VLLM_NIXL_SIDE_CHANNEL_PORT): metadata on request, notifications queued. */
  sideChannel(): net.Server {
    return net.createServer(sock => {
      sock.on('error', () => undefined)
      onLines(sock, m => {
        if (m.t === 'GET_META')
          writeLine(sock, {
            t: 'META',
            engine_id: this.engineId,
            data_port: this.c.ports.prefillData,
            tp_size: this.c.tp,
          })
        else if (m.t === 'NOTIF' && typeof m.msg === 'string') {
          this.notifs.push({msg: m.msg, why: typeof m.why === 'string' ? m.why : undefined})
          this.wake()
        }
      })
    })
  }

  /** The READ data path: `READ <id>\n`, answered with the request's KV bytes (whatever the blocks hold now). */
  dataServer(): net.Server {
    return net.createServer(sock => {
      sock.on('error', () => undefined)
      let head = ''
      const onData = (chunk: Buffer): void => {
        head += chunk.toString('latin1')
        const nl = head.indexOf('\n')
        if (nl < 0) return
        sock.off('data', onData)
        const [, id = ''] = head.slice(0, nl).split(' ')
        const p = this.pinned.get(id)
        if (p) p.reads++
        this.truth.record(id, null, 'read-served', {detail: {pinned: p !== undefined}})
        streamBytes(sock, p?.bytes ?? 0)
      }
      sock.on('data', onData)
    })
  }

  /** One engine step: notifications, then a prefill batch, then the reaper (the order of `get_finished`). */
  async step(): Promise<void> {
    this.takeNotifs()
    const batch = this.waiting.splice(0)
    if (batch.length > 0) {
      const tokens = batch.reduce((n, j) => n + j.tokens, 0)
      this.k.stats = {...this.k.stats, running: batch.length, waitingCapacity: 0}
      await new Promise(r => setTimeout(r, (tokens * this.c.prefillMsPerKToken) / 1000))
      for (const job of batch) this.finish(job)
    }
    this.reap()
    this.k.stats = {running: 0, waitingCapacity: this.waiting.length, waitingDeferred: 0, usedBlocks: this.usedBlocks()}
  }

  private finish(job: PrefillJob): void {
    const now = nowMs()
    const legacy = this.c.lease.mode === 'legacy'
    let ttlS = legacy ? this.c.lease.abortTimeoutS : this.c.lease.durationS
    if (hasBug(this.c, 'expire-early')) ttlS /= 2
    const expiryMs = this.leases.grant(job.id, now, ttlS)
    const blocks = blocksFor(this.c, job.tokens)
    this.pinned.set(job.id, {blocks, bytes: job.tokens * this.c.kvBytesPerToken, grantedMs: now, reads: 0})
    this.k.promptTokens += job.tokens
    this.k.generationTokens += 1
    this.k.success.length = (this.k.success.length ?? 0) + 1
    this.truth.record(job.id, null, 'granted', {detail: {expiryMs, ttlS, mode: this.c.lease.mode, blocks}})
    vlog(
      'EngineCore_DP0',
      'DEBUG',
      'pull_scheduler.py:256',
      `NIXLConnector request_finished(${job.id}) waiting for ${ttlS} seconds before releasing blocks`,
    )
    job.answer(200, {
      id: job.id,
      object: 'text_completion',
      created: Math.floor(now / 1000),
      model: this.c.model,
      choices: [{index: 0, text: ' ', logprobs: null, finish_reason: 'length', stop_reason: null}],
      usage: {prompt_tokens: job.tokens, completion_tokens: 1, total_tokens: job.tokens + 1},
      kv_transfer_params: {
        do_remote_prefill: true,
        do_remote_decode: false,
        remote_block_ids: [Array.from({length: blocks}, (_, i) => i)],
        remote_engine_id: this.engineId,
        remote_request_id: job.id,
        remote_host: this.c.host,
        remote_port: this.c.sideChannel.prefill,
        tp_size: this.c.tp,
        dcp_size: 1,
        pp_size: 1,
        remote_num_tokens: job.tokens,
        remote_blocks_expiry_time: null,
        transfer_mode: 'pull',
      },
    })
  }

  /** `_get_new_notifs`: "HB:" heartbeats renew (`_handle_heartbeat`), anything else is a read completion. */
  private takeNotifs(): void {
    for (const {msg, why} of this.notifs.splice(0)) {
      if (msg.startsWith('HB:')) {
        const ids = msg.slice(3).split(',').filter(Boolean)
        if (this.c.lease.mode === 'legacy') continue
        if (hasBug(this.c, 'no-renew')) {
          for (const id of ids) if (this.leases.has(id)) this.truth.record(id, null, 'heartbeat-dropped')
          continue
        }
        const ext = this.c.lease.extensionS
        for (const r of this.leases.heartbeat(ids, nowMs(), ext)) {
          this.truth.record(r.id, null, 'heartbeat', {detail: {fromMs: r.fromMs, toMs: r.toMs}})
          // base_worker.py `_handle_heartbeat`'s logger.debug, per renewed request (its expiries: P's own clock).
          vlog(
            'EngineCore_DP0',
            'DEBUG',
            `${WORKER}:_handle_heartbeat`,
            `Heartbeat extended lease for request ${r.id} by ${ext}s ` +
              `(old_expiry=${(r.fromMs / 1000).toFixed(1)}, new_expiry=${(r.toMs / 1000).toFixed(1)})`,
          )
        }
        continue
      }
      // "<request id>:<consumers>": every consumer here is one D worker, so one notification frees.
      const id = msg.includes(':') ? msg.slice(0, msg.lastIndexOf(':')) : msg
      if (this.leases.release(id)) this.free(id, why === 'abort' ? 'abort-notified' : 'read-notified')
      else
        vlog(
          'EngineCore_DP0',
          'WARNING',
          `${WORKER}:_get_new_notifs`,
          `Potentially invalid KV blocks for unrecognized request ${id} were retrieved by a remote worker. ` +
            'This may happen when the request expired or was aborted.',
        )
    }
  }

  private reap(): void {
    const expired = this.leases.reap(nowMs(), {
      headBlock: hasBug(this.c, 'reaper-head-block', 'reaper-stops-at-first'),
      never: hasBug(this.c, 'lease-never-expires'),
    })
    for (const e of expired) {
      const reads = this.pinned.get(e.id)?.reads ?? 0
      this.k.expired++
      vlog(
        'EngineCore_DP0',
        'WARNING',
        `${WORKER}:_reap_expired_send_leases`,
        this.c.lease.mode === 'legacy'
          ? `Releasing expired KV blocks for request ${e.id} which were retrieved by ${reads} decode worker(s) ` +
              `within ${this.c.lease.abortTimeoutS} seconds.`
          : `Releasing expired KV blocks for request ${e.id} which were retrieved by ${reads} remote worker(s) ` +
              'before lease expired.',
      )
      this.free(e.id, this.c.lease.mode === 'legacy' ? 'legacy-timeout' : 'lease-expired', e.expiryMs)
    }
  }

  private free(id: string, cause: string, expiryMs?: number): void {
    const p = this.pinned.get(id)
    this.pinned.delete(id)
    this.truth.record(id, null, 'freed', {
      detail: {cause, heldMs: p ? nowMs() - p.grantedMs : null, ...(expiryMs ? {expiryMs} : {})},
    })
  }
}

/** Write `bytes` zero bytes, minding backpressure, then end. */
function streamBytes(sock: net.Socket, bytes: number): void {
  const chunk = Buffer.alloc(64 * 1024)
  let left = bytes
  const pump = (): void => {
    while (left > 0) {
      const n = Math.min(left, chunk.length)
      left -= n
      if (!sock.write(n === chunk.length ? chunk : chunk.subarray(0, n))) {
        sock.once('drain', pump)
        return
      }
    }
    sock.end()
  }
  pump()
}
