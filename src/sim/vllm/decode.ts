import net from 'node:net'

import {nowMs} from '../server/clock.js'
import type {TruthLog} from '../server/truth.js'
import {errorBody, onLines, vlog, writeLine} from './common.js'
import {hasBug, rankShare, type VllmTwinConfig} from './config.js'
import {blocksFor, type EngineCounters} from './engine-state.js'

/** A request D decodes after reading its KV from P (`kv_transfer_params.do_remote_prefill`). */
export interface DecodeJob {
  id: string
  remoteId: string
  engineId: string
  host: string
  port: number
  tokens: number
  maxTokens: number
  answer: (status: number, body: unknown) => void
}

type Status = 'waiting' | 'reading' | 'running' | 'done'

/** One rank's share of a READ: D's worker k reads from P's worker k (equal TP, pull_worker.py `_read_blocks`). */
interface Part {
  sock: net.Socket
  got: number
  want: number
  lastProgressMs: number
  done?: boolean
  /** Its notification has gone to P's rank. */
  notified?: boolean
}

interface Req extends DecodeJob {
  status: Status
  blocks: number
  parts: Part[]
  want: number
  lastProgressMs: number
  readError?: string
  /** The client went away while the READ was in flight: the READ goes on, nobody is answered. */
  aborted?: boolean
  /** Tokens generated so far (one per decode step). */
  generated: number
}

interface Peer {
  host: string
  sock: net.Socket
  meta?: {engine_id: string; data_ports: number[]}
  queued: Array<Record<string, unknown>>
  /** `--vllm-notif-path data`: one notification connection per P rank, over that rank's data listener. */
  notif: Array<net.Socket | undefined>
}

/**
 * The decode instance's side: track the request for heartbeats from arrival (base_scheduler.py `on_new_request`),
 * handshake with P over the side channel, READ the blocks, notify P, stop heartbeating on completion
 * (`update_connector_output`) or when the request finishes or aborts (`request_finished` → `_stop_heartbeat`).
 */
export class DecodeSide {
  private readonly reqs = new Map<string, Req>()
  private readonly peers = new Map<string, Peer>()
  private lastHeartbeatMs = 0

  constructor(
    private readonly c: VllmTwinConfig,
    private readonly k: EngineCounters,
    private readonly truth: TruthLog,
    private readonly wake: () => void,
  ) {}

  get pending(): boolean {
    return this.reqs.size > 0
  }

  submit(job: DecodeJob): void {
    const now = nowMs()
    this.reqs.set(job.id, {...job, status: 'waiting', blocks: 0, parts: [], want: 0, lastProgressMs: now, generated: 0})
    this.truth.record(job.id, null, 'received', {detail: {remoteId: job.remoteId, engineId: job.engineId}})
    this.peer(job.host, job.port) // proactive handshake, as the worker does for heartbeats
    this.wake()
  }

  /**
   * The client went away before the answer: the engine aborts the request, and `request_finished` stops its
   * heartbeats. Not yet reading: D's worker notifies P at once so P frees (pull_scheduler.py `request_finished`:
   * "we must add empty block_ids to _reqs_need_recv so that our worker side will notify and free blocks in the
   * prefill instance"). Reading: the notification rides on the READ itself (pull_worker.py `_read_blocks` posts it
   * with the transfer), so P hears of it when the READ completes; a READ that never completes leaves P's blocks to
   * the lease, no longer renewed. D's blocks stay allocated until the READ ends (scheduler.py `finish_requests`:
   * `delay_free_blocks` for WAITING_FOR_REMOTE_KVS), but the request leaves the waiting gauges at once.
   */
  abort(id: string): void {
    const r = this.reqs.get(id)
    if (!r || r.status === 'done' || r.aborted) return
    const during = r.status
    this.k.success.abort = (this.k.success.abort ?? 0) + 1
    // Waiting on the handshake, vLLM has already allocated the blocks and cleared do_remote_prefill
    // (`update_state_after_alloc`; the handshake runs in the worker): the same as during the READ, which still starts.
    const handshaking = during === 'waiting' && !this.peers.get(`${r.host}:${r.port}`)?.meta
    const detail = {during, remoteId: r.remoteId, ...(handshaking ? {handshake: true} : {})}
    this.truth.record(id, null, 'aborted', {detail})
    if (during === 'reading' || handshaking) {
      r.aborted = true
      return
    }
    this.reqs.delete(id)
    r.status = 'done'
    if (during === 'waiting') this.notify(r, 'abort')
    this.wake()
  }

  private peer(host: string, port: number): Peer {
    const key = `${host}:${port}`
    let p = this.peers.get(key)
    if (p && !p.sock.destroyed) return p
    const sock = net.connect({host, port})
    const peer: Peer = {host: host === 'localhost' ? '127.0.0.1' : host, sock, queued: [], notif: []}
    let cause = 'connection closed'
    sock.on('error', e => {
      cause = e.message
    })
    sock.on('close', () => {
      if (this.peers.get(key) === peer) this.peers.delete(key)
      if (!peer.meta) this.handshakeFailed(key, cause)
    })
    sock.on('connect', () => writeLine(sock, {t: 'GET_META'}))
    onLines(sock, m => {
      if (m.t !== 'META') return
      const ports = Array.isArray(m.data_ports) ? m.data_ports.map(Number) : [Number(m.data_port)]
      peer.meta = {engine_id: String(m.engine_id), data_ports: ports}
      vlog('EngineCore_DP0', 'DEBUG', 'base_worker.py:_nixl_handshake', `NIXL handshake with ${key} done`)
      for (const q of peer.queued.splice(0)) {
        const {t: _t, rank, ...notif} = q as {t: string; rank?: number; msg: string; why?: string}
        this.send(peer, rank, notif)
      }
      this.wake()
    })
    p = peer
    this.peers.set(key, p)
    return p
  }

  /**
   * The handshake with a P failed (refused, or closed before its metadata came): each request waiting on it fails
   * (base_worker.py `_background_nixl_handshake` → `request_ready` → `_log_failure(failure_type="handshake_failed")`),
   * which ends its heartbeats; P's blocks go at lease expiry.
   */
  private handshakeFailed(key: string, cause: string): void {
    vlog(
      'EngineCore_DP0',
      'ERROR',
      'base_worker.py:_background_nixl_handshake',
      `NIXL handshake with ${key} failed: ${cause}`,
    )
    for (const r of [...this.reqs.values()])
      if (r.status === 'waiting' && `${r.host}:${r.port}` === key) {
        r.readError = `handshake_failed: ${cause}`
        this.readFailed(r, false)
      }
  }

  /**
   * vLLM's notification "<remote request id>:<consumers>" (pull_worker.py `_read_blocks`, `notif_id`) to P's rank
   * `rank` (its READ's part done), or to every rank (an abort: each D worker notifies its own P rank).
   */
  private notify(r: Req, why: 'read' | 'abort', rank?: number): void {
    this.send(this.peer(r.host, r.port), rank, {msg: `${r.remoteId}:1`, why})
    this.truth.record(r.id, null, 'notified', {
      detail: {remoteId: r.remoteId, why, ...(rank === undefined ? {} : {rank})},
    })
  }

  /**
   * A NIXL notification to P's rank `rank` (undefined: every rank). `side`: on the side channel, naming the rank
   * (queued until the handshake is done). `data`: on D's notification connection to that rank's data listener, the
   * READ's transport, as upstream's `send_notif` rides UCX: a path that stalls the READ stalls these too.
   */
  private send(p: Peer, rank: number | undefined, notif: {msg: string; why?: string}): void {
    if (this.c.notifPath === 'side') {
      const msg = {t: 'NOTIF', ...notif, ...(rank === undefined ? {} : {rank})}
      if (p.meta) writeLine(p.sock, msg)
      else p.queued.push(msg)
      return
    }
    if (!p.meta) return void p.queued.push({t: 'NOTIF', ...notif, ...(rank === undefined ? {} : {rank})})
    const ranks = rank === undefined ? p.meta.data_ports.map((_, k) => k) : [rank]
    for (const k of ranks) writeLine(this.notifSock(p, k), notif)
  }

  /** D's notification connection to P's rank k (made once, again after it broke). */
  private notifSock(p: Peer, k: number): net.Socket {
    const have = p.notif[k]
    if (have && !have.destroyed) return have
    const sock = net.connect({host: p.host, port: p.meta!.data_ports[k]!})
    sock.on('error', () => undefined)
    sock.write('NOTIF\n')
    p.notif[k] = sock
    return sock
  }

  /**
   * One engine step: heartbeats (`start_load_kv`), scheduling and READs, finished reads, then a decode forward of
   * one token for every running request, which takes `decodeMsPerToken`: a busy D sends its heartbeats only between
   * forwards (the design doc: "a long model forward pass will delay heartbeats"). Then the gauges.
   */
  async step(): Promise<void> {
    const now = nowMs()
    this.heartbeats(now)
    for (const r of this.reqs.values()) {
      if (r.status === 'waiting') this.schedule(r)
      else if (r.status === 'reading') this.checkRead(r, now)
    }
    const batch = [...this.reqs.values()].filter(r => r.status === 'running')
    if (batch.length > 0) {
      await new Promise(resolve => setTimeout(resolve, this.c.decodeMsPerToken))
      for (const r of batch) if (++r.generated >= r.maxTokens) this.finish(r)
    }
    let running = 0
    let capacity = 0
    let deferred = 0
    let used = 0
    for (const r of this.reqs.values()) {
      used += r.blocks
      if (r.status === 'running') running++
      // An aborted request leaves the scheduler's queues at once (scheduler.py `finish_requests`) while its blocks
      // stay allocated until the READ ends (`delay_free_blocks` for WAITING_FOR_REMOTE_KVS): used, not waiting.
      else if (r.status === 'reading' && !r.aborted) deferred++
      else if (r.status === 'waiting' && !r.aborted) capacity++
    }
    this.k.stats = {running, waitingCapacity: capacity, waitingDeferred: deferred, usedBlocks: used}
  }

  /** `build_connector_meta` throttles to one batch per heartbeat interval; the worker sends one "HB:" per engine. */
  private heartbeats(now: number): void {
    if (this.c.lease.mode === 'legacy') return
    const byPeer = new Map<string, Req[]>()
    for (const r of this.reqs.values())
      if (!r.aborted && (r.status === 'waiting' || r.status === 'reading')) {
        const key = `${r.host}:${r.port}`
        byPeer.set(key, [...(byPeer.get(key) ?? []), r])
      }
    if (byPeer.size === 0 || now - this.lastHeartbeatMs < this.c.lease.intervalS * 1000) return
    this.lastHeartbeatMs = now
    for (const rs of byPeer.values()) {
      const p = this.peer(rs[0]!.host, rs[0]!.port)
      if (!p.meta) continue // deferred until the handshake completes
      // Each D worker sends it to the P agents it knows (base_worker.py `_send_heartbeats`): every rank.
      this.send(p, undefined, {msg: `HB:${rs.map(r => r.remoteId).join(',')}`})
      for (const r of rs) this.truth.record(r.id, null, 'heartbeat-sent', {detail: {remoteId: r.remoteId}})
    }
  }

  private schedule(r: Req): void {
    const p = this.peer(r.host, r.port)
    if (!p.meta) return
    const need = blocksFor(this.c, r.tokens)
    if (this.k.stats.usedBlocks + need > this.c.numBlocks) return // waits for capacity
    r.blocks = need
    r.status = 'reading'
    r.want = r.tokens * this.c.kvBytesPerToken
    r.lastProgressMs = nowMs()
    this.truth.record(r.id, null, 'read-start', {detail: {remoteId: r.remoteId, bytes: r.want}})
    r.parts = p.meta.data_ports.map((port, k) => this.readPart(r, p.host, port, rankShare(r.want, this.c.tp, k)))
  }

  /** One rank's READ: a TCP connection to P's rank listener, `READ <id>`, its share of the bytes, then the end. */
  private readPart(r: Req, host: string, port: number, want: number): Part {
    const sock = net.connect({host, port})
    const part: Part = {sock, got: 0, want, lastProgressMs: nowMs()}
    sock.on('connect', () => sock.write(`READ ${r.remoteId}\n`))
    sock.on('data', (b: Buffer) => {
      part.got += b.length
      part.lastProgressMs = nowMs()
    })
    sock.on('end', () => {
      part.done = true
      this.wake()
    })
    sock.on('error', e => {
      r.readError = e.message
      this.wake()
    })
    return part
  }

  /**
   * A READ completes when every rank's part has (the scheduler waits for finished_recving from every worker); each
   * part's notification goes to its P rank as it completes. NIXL's stall timeout is per transfer (per part).
   */
  private checkRead(r: Req, now: number): void {
    const stallS = hasBug(this.c, 'read-stall-forever') ? 0 : this.c.xferStallTimeoutS
    const stalled = r.parts.find(x => !x.done && stallS > 0 && now - x.lastProgressMs > stallS * 1000)
    if (!r.readError && stalled) {
      r.readError = `NIXL_ERR_XFER_STALLED: no progress for ${stallS}s`
      for (const x of r.parts) x.sock.destroy()
    }
    const short = r.parts.find(x => x.done && x.got < x.want)
    if (r.readError || short) return this.readFailed(r)
    const fresh = r.parts.flatMap((x, k) => (x.done && !x.notified ? [k] : []))
    const all = r.parts.every(x => x.done)
    const got = r.parts.reduce((n, x) => n + x.got, 0)
    if (all) this.truth.record(r.id, null, 'read-done', {detail: {remoteId: r.remoteId, bytes: got}})
    for (const k of fresh) {
      r.parts[k]!.notified = true
      this.notify(r, 'read', this.c.tp > 1 ? k : undefined)
    }
    if (!all) return
    if (r.aborted) {
      r.status = 'done'
      this.reqs.delete(r.id)
      return
    }
    r.status = 'running'
  }

  /** kv_load_failure_policy=fail (the default): the request fails; P's blocks go at lease expiry. */
  private readFailed(r: Req, transfer = true): void {
    if (transfer) this.k.failedTransfers++
    const got = r.parts.reduce((n, x) => n + x.got, 0)
    const why = r.readError ?? `short read (${got} of ${r.want} bytes)`
    vlog('EngineCore_DP0', 'ERROR', 'base_worker.py:_pop_done_transfers', `NIXL transfer failed for ${r.id}: ${why}`)
    this.truth.record(r.id, null, 'read-failed', {detail: {remoteId: r.remoteId, why}})
    this.reqs.delete(r.id)
    r.status = 'done'
    if (r.aborted) return
    this.k.success.error = (this.k.success.error ?? 0) + 1
    r.answer(500, errorBody(`KV load failed for request ${r.id}: ${why}`, 'InternalServerError', 500))
  }

  private finish(r: Req): void {
    if (r.status !== 'running') return
    r.status = 'done'
    this.reqs.delete(r.id)
    this.k.generationTokens += r.maxTokens
    this.k.success.length = (this.k.success.length ?? 0) + 1
    this.truth.record(r.id, null, 'answered', {detail: {status: 200, remoteId: r.remoteId}})
    r.answer(200, {
      id: r.id,
      object: 'text_completion',
      created: Math.floor(nowMs() / 1000),
      model: this.c.model,
      choices: [{index: 0, text: ' twin'.repeat(r.maxTokens), logprobs: null, finish_reason: 'length'}],
      usage: {prompt_tokens: r.tokens, completion_tokens: r.maxTokens, total_tokens: r.tokens + r.maxTokens},
    })
    this.wake()
  }
}
