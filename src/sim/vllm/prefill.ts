import net from 'node:net'

import {nowMs} from '../server/clock.js'
import type {TruthLog} from '../server/truth.js'
import {onLines, vlog, writeLine} from './common.js'
import {hasBug, rankShare, type VllmTwinConfig} from './config.js'
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
  /** P's `_reqs_to_send`, one per TP worker: keyed by request and rank (`rankKey`), each rank reaping its own. */
  readonly leases = new LeaseTable()
  /** Blocks pinned per request (freed when every rank's lease has ended). */
  private readonly pinned = new Map<string, Pinned>()
  private readonly waiting: PrefillJob[] = []
  private readonly notifs: Notif[] = []
  readonly engineId = `vllm-twin-prefill-${process.pid}-${nowMs().toString(36)}`
  /** Each rank's data port (its listener lives in the rank's process), as the handshake states them. */
  dataPorts: number[] = []

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

  private queue(n: Notif): void {
    this.notifs.push(n)
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
            data_port: this.dataPorts[0],
            data_ports: this.dataPorts,
            tp_size: this.c.tp,
          })
        else if (m.t === 'NOTIF' && typeof m.msg === 'string')
          this.queue({
            msg: m.msg,
            ...(typeof m.why === 'string' ? {why: m.why} : {}),
            ...(typeof m.rank === 'number' ? {rank: m.rank} : {}),
            path: 'side',
          })
      })
    })
  }

  /**
   * The ranks' data path, as each rank's listener relays it here (worker-main.ts): `RANK k`, then either
   * `READ <id>`, answered with rank k's share of the request's KV bytes (whatever the blocks hold now), or `NOTIF`
   * and then notifications of rank k, one JSON line each (`--vllm-notif-path data`: NIXL's notifications ride the
   * READ's transport).
   */
  dataServer(): net.Server {
    return net.createServer(sock => {
      sock.on('error', () => undefined)
      let head = ''
      let rank: number | undefined
      const onData = (chunk: Buffer): void => {
        head += chunk.toString('latin1')
        for (let nl = head.indexOf('\n'); nl >= 0; nl = head.indexOf('\n')) {
          const [verb = '', arg = ''] = head.slice(0, nl).split(' ')
          head = head.slice(nl + 1)
          if (verb === 'RANK') rank = Number(arg)
          else if (verb === 'READ') {
            sock.off('data', onData)
            return this.serveRead(sock, arg, rank ?? 0)
          } else if (verb === 'NOTIF') {
            sock.off('data', onData)
            if (head) sock.unshift(Buffer.from(head, 'latin1'))
            return this.notifStream(sock, rank ?? 0)
          }
        }
      }
      sock.on('data', onData)
    })
  }

  private serveRead(sock: net.Socket, id: string, rank: number): void {
    const p = this.pinned.get(id)
    if (p) p.reads[rank] = (p.reads[rank] ?? 0) + 1
    this.truth.record(id, null, 'read-served', {detail: {pinned: p !== undefined, rank}})
    streamBytes(sock, p ? rankShare(p.bytes, this.c.tp, rank) : 0)
  }

  private notifStream(sock: net.Socket, rank: number): void {
    onLines(sock, m => {
      if (typeof m.msg === 'string')
        this.queue({msg: m.msg, ...(typeof m.why === 'string' ? {why: m.why} : {}), rank, path: 'data'})
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

  private ranks(rank: number | undefined): number[] {
    return rank === undefined ? Array.from({length: this.c.tp}, (_, k) => k) : [rank]
  }

  private finish(job: PrefillJob): void {
    const now = nowMs()
    const legacy = this.c.lease.mode === 'legacy'
    let ttlS = legacy ? this.c.lease.abortTimeoutS : this.c.lease.durationS
    if (hasBug(this.c, 'expire-early')) ttlS /= 2
    let expiryMs = now
    for (const k of this.ranks(undefined)) expiryMs = this.leases.grant(rankKey(job.id, k), now, ttlS)
    const blocks = blocksFor(this.c, job.tokens)
    this.pinned.set(job.id, {
      blocks,
      bytes: job.tokens * this.c.kvBytesPerToken,
      grantedMs: now,
      reads: [],
      left: new Set(this.ranks(undefined)),
      causes: {},
    })
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
    job.answer(200, grantBody(this.c, job, this.engineId, blocks, now))
  }

  /** `_get_new_notifs`: "HB:" heartbeats renew (`_handle_heartbeat`), anything else is a read completion. */
  private takeNotifs(): void {
    for (const n of this.notifs.splice(0)) {
      if (n.msg.startsWith('HB:')) this.heartbeat(n)
      else this.readNotif(n)
    }
  }

  /** `_handle_heartbeat` of each rank the heartbeat reached (on the side channel: all of them). */
  private heartbeat(n: Notif): void {
    const ids = n.msg.slice(3).split(',').filter(Boolean)
    if (this.c.lease.mode === 'legacy') return
    const keys = ids.flatMap(id => this.ranks(n.rank).map(k => rankKey(id, k)))
    if (hasBug(this.c, 'no-renew')) {
      for (const id of ids) if (this.pinned.has(id)) this.truth.record(id, null, 'heartbeat-dropped')
      return
    }
    const ext = this.c.lease.extensionS
    for (const r of this.leases.heartbeat(keys, nowMs(), ext)) {
      const [id, rank] = fromRankKey(r.id)
      this.truth.record(id, null, 'heartbeat', {detail: {fromMs: r.fromMs, toMs: r.toMs, rank, path: n.path}})
      // base_worker.py `_handle_heartbeat`'s logger.debug, per renewed request (its expiries: P's own clock).
      vlog(
        'EngineCore_DP0',
        'DEBUG',
        `${WORKER}:_handle_heartbeat`,
        `Heartbeat extended lease for request ${id} by ${ext}s ` +
          `(old_expiry=${(r.fromMs / 1000).toFixed(1)}, new_expiry=${(r.toMs / 1000).toFixed(1)})`,
      )
    }
  }

  /** "<request id>:<consumers>": each D worker reads from its own P rank (equal TP), so one notification frees it. */
  private readNotif(n: Notif): void {
    const id = n.msg.includes(':') ? n.msg.slice(0, n.msg.lastIndexOf(':')) : n.msg
    const cause = n.why === 'abort' ? 'abort-notified' : 'read-notified'
    const released = this.ranks(n.rank).filter(k => this.leases.release(rankKey(id, k)))
    for (const k of released) this.rankDone(id, k, cause)
    if (released.length === 0)
      vlog(
        'EngineCore_DP0',
        'WARNING',
        `${WORKER}:_get_new_notifs`,
        `Potentially invalid KV blocks for unrecognized request ${id} were retrieved by a remote worker. ` +
          'This may happen when the request expired or was aborted.',
      )
  }

  private reap(): void {
    const expired = this.leases.reap(nowMs(), {
      headBlock: hasBug(this.c, 'reaper-head-block', 'reaper-stops-at-first'),
      never: hasBug(this.c, 'lease-never-expires'),
    })
    for (const e of expired) {
      const [id, rank] = fromRankKey(e.id)
      const p = this.pinned.get(id)
      const reads = p?.reads[rank] ?? 0
      // Counted once per request (the twin's choice: how vLLM sums its workers' counts was not read).
      if (p && !Object.values(p.causes).some(c => c === 'lease-expired' || c === 'legacy-timeout')) this.k.expired++
      vlog(
        'EngineCore_DP0',
        'WARNING',
        `${WORKER}:_reap_expired_send_leases`,
        this.c.lease.mode === 'legacy'
          ? `Releasing expired KV blocks for request ${id} which were retrieved by ${reads} decode worker(s) ` +
              `within ${this.c.lease.abortTimeoutS} seconds.`
          : `Releasing expired KV blocks for request ${id} which were retrieved by ${reads} remote worker(s) ` +
              'before lease expired.',
      )
      this.rankDone(id, rank, this.c.lease.mode === 'legacy' ? 'legacy-timeout' : 'lease-expired', e.expiryMs)
    }
  }

  /** One rank let go of the request's blocks; the request is freed when the last rank has (the scheduler's count). */
  private rankDone(id: string, rank: number, cause: string, expiryMs?: number): void {
    const p = this.pinned.get(id)
    if (!p) return
    p.left.delete(rank)
    p.causes[rank] = cause
    if (p.left.size > 0) return
    this.pinned.delete(id)
    this.truth.record(id, null, 'freed', {
      detail: {
        cause,
        heldMs: nowMs() - p.grantedMs,
        ...(expiryMs ? {expiryMs} : {}),
        ...(this.c.tp > 1 ? {ranks: p.causes} : {}),
      },
    })
  }
}

interface Pinned {
  blocks: number
  bytes: number
  grantedMs: number
  /** READs served per rank. */
  reads: number[]
  /** Ranks still holding the request's blocks. */
  left: Set<number>
  /** How each rank let go. */
  causes: Record<number, string>
}

/** A notification as P's worker takes it: the rank it reached (undefined: the side channel's, every rank). */
interface Notif {
  msg: string
  why?: string
  rank?: number
  path: 'side' | 'data'
}

const rankKey = (id: string, rank: number): string => `${id}#${rank}`
function fromRankKey(key: string): [string, number] {
  const i = key.lastIndexOf('#')
  return [key.slice(0, i), Number(key.slice(i + 1))]
}

/** P's answer with `kv_transfer_params` (pull_scheduler.py `request_finished`). */
function grantBody(c: VllmTwinConfig, job: PrefillJob, engineId: string, blocks: number, now: number) {
  return {
    id: job.id,
    object: 'text_completion',
    created: Math.floor(now / 1000),
    model: c.model,
    choices: [{index: 0, text: ' ', logprobs: null, finish_reason: 'length', stop_reason: null}],
    usage: {prompt_tokens: job.tokens, completion_tokens: 1, total_tokens: job.tokens + 1},
    kv_transfer_params: {
      do_remote_prefill: true,
      do_remote_decode: false,
      remote_block_ids: [Array.from({length: blocks}, (_, i) => i)],
      remote_engine_id: engineId,
      remote_request_id: job.id,
      remote_host: c.host,
      remote_port: c.sideChannel.prefill,
      tp_size: c.tp,
      dcp_size: 1,
      pp_size: 1,
      remote_num_tokens: job.tokens,
      remote_blocks_expiry_time: null,
      transfer_mode: 'pull',
    },
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
