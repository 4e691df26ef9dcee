import {existsSync} from 'node:fs'
import * as net from 'node:net'
import type * as zmq from 'zeromq'
import {KVPoll, nextStatus, pollName} from './kvpoll.js'
import {AUX_BYTES, kvFrames, ReceiptReader} from './data-frames.js'
import {NIXL_GUARD} from './zmq-link.js'
import type {PrefillOp} from './protocol.js'
import type {Logger} from './log.js'
import {registrationKey, serverLayout} from './layout.js'
import {distEndpoint, type SimConfig} from '../sim-config.js'
import type {EnvSettings} from './settings.js'
import {nowMs, sleep} from './clock.js'
import {ProcTcpTables, txQueue} from './tcp-acked.js'
import {httpCall, isOk} from './http-call.js'

/** What decode's KV-args registration says about a decode rank: its TCP data endpoint and, with rails, its NIC. */
interface DecodeAgent {
  dataHost: string
  dataPort: number
  rail?: {addr: string; port: number}
}
interface DstInfo {
  agentName: string
  decodeIp: string
  decodePort: string
  pages: number
}
/** A WRITE on the TCP path completes when the peer's kernel has acknowledged every byte up to `end`. */
interface PendingWrite {
  end: number
  resolve: () => void
  reject: (e: Error) => void
}
/** One KV data connection; `delayMs`/`checkAt`: its own backoff between reads of its tx_queue (checkAcks). */
interface DataConn {
  socket: net.Socket
  key: string
  queued: number
  sent: number
  pending: PendingWrite[]
  delayMs: number
  checkAt: number
  receipts: ReceiptReader
}

/** Posts one RDMA WRITE to this rank's rail NIC (in the server process); resolves on its completion. */
export type RdmaPoster = (w: {
  dest: {addr: string; port: number}
  room: string
  bytes: number
  notify: boolean
}) => Promise<void>

const PROC_TCP = existsSync('/proc/net/tcp')
/**
 * The longest wait between two reads of a stalled connection's tx_queue (checkAcks). Each read walks the namespace's
 * whole TCP table (6-25 ms of CPU on a 2-core VM, measured: the ranks' largest cost under a stall, and three twins on
 * one machine make the table three times longer). A path whose filter is lifted resumes only at TCP's next
 * retransmission anyway (RTO 200 ms, doubling while it was dead: 1.6 s after 3 s dead), and a decode rank that reads
 * settles the WRITEs by its receipts then, without the table; only a stopped one leaves it to this read.
 */
const ACK_POLL_MAX_MS = 1024
/** The first read of a connection's tx_queue after a WRITE: later than its receipt from a reading peer takes. */
const FIRST_KERNEL_CHECK_MS = 16

/**
 * One prefill TP rank's KV sender side: the per-room status table (NIXL's update_status rules), the
 * destination infos decode pushed over ZMQ, and the transfers of each room's KV bytes: on the TCP data path
 * (one connection per decode rank) or, with rail NICs, RDMA WRITEs posted to this GPU's NIC. Either way a room
 * is Success when its own last byte is acknowledged by the remote side's transport, never by the decode process:
 * NIXL's WRITE is one-sided (nixl/conn.py transfer_worker: Success once every xfer handle is DONE, ~1193-1207).
 */
export class PrefillRank {
  private readonly status = new Map<string, number>()
  private readonly createdAt = new Map<string, number>()
  private readonly infos = new Map<string, DstInfo[]>()
  private readonly required = new Map<string, number>()
  private readonly agents = new Map<string, DecodeAgent>()
  private readonly conns = new Map<string, DataConn>()
  /** Why a room failed on this rank: what failure_exception() would raise, for the scheduler's log line and 500. */
  private readonly reasons = new Map<string, string>()
  private ackTimer: NodeJS.Timeout | undefined
  /** When ackTimer fires (ms, performance.now()). */
  private ackTimerAt = Infinity
  private readonly bugAbortRace: boolean
  /** Failure points (the twin's control endpoint): drop every decode frame; hold KV writes until released. */
  private dropFrames = false
  private stallKv = false
  private readonly held: Array<() => void> = []
  /** A room's status changed (rank-main.ts tells the scheduler when it is between steps). */
  onChange: () => void = () => undefined

  constructor(
    private readonly cfg: SimConfig,
    private readonly env: EnvSettings,
    private readonly tpRank: number,
    private readonly log: Logger,
    private readonly rdma?: RdmaPoster,
  ) {
    this.bugAbortRace = cfg.bugs.includes('abort-race')
  }

  /** PUT /route on the in-process bootstrap server, 5 tries with backoff, as register_to_bootstrap does. */
  async register(zmqPort: number): Promise<void> {
    const body = JSON.stringify({
      role: 'Prefill',
      ...registrationKey(serverLayout(this.cfg, 'prefill'), this.tpRank),
      rank_ip: this.cfg.host,
      rank_port: zmqPort,
      page_size: 1,
      kv_cache_dtype: 'auto',
      prefill_http_port: this.cfg.ports.prefill,
    })
    // Over several nodes the bootstrap server is node 0's, at the dist-init-addr's host (common/conn.py
    // register_to_bootstrap); rank_ip stays this node's own address.
    const bootHost = this.cfg.dist?.role === 'prefill' ? distEndpoint(this.cfg.dist).host : this.cfg.host
    const url = `http://${bootHost.includes(':') ? `[${bootHost}]` : bootHost}:${this.cfg.ports.bootstrap}/route`
    let last: unknown
    for (let attempt = 0; attempt < 5; attempt++) {
      try {
        const res = await httpCall(url, {method: 'PUT', body, timeoutMs: 5000})
        if (isOk(res.status)) return
        last = new Error(`HTTP ${res.status}`)
      } catch (err) {
        last = err
      }
      await sleep(200 * 2 ** attempt)
    }
    throw new Error(`Failed to register to bootstrap server ${url}: ${String(last)}`)
  }

  async receive(pull: zmq.Pull): Promise<void> {
    for await (const frames of pull) {
      try {
        this.onFrames(
          frames.map(f => f.toString('latin1')),
          frames,
        )
      } catch (err) {
        this.log.error(`bootstrap thread: ${String(err)}`)
      }
    }
  }

  private onFrames(text: string[], raw: Buffer[]): void {
    // As a packet filter on the ZMQ port would: nothing decode sends arrives, ABORT included.
    if (this.dropFrames) return
    if (text[0] === 'ABORT') {
      const room = text[1]!
      // NIXL's bootstrap thread on decode's ABORT (nixl/conn.py since #30352): the room fails with this reason.
      this.abort(room, `Request ${room} was aborted by decode.`, 'decode')
      return
    }
    if (text[0] !== NIXL_GUARD) throw new Error(`unexpected frame ${JSON.stringify(text[0])}`)
    const room = text[1]!
    const [, , decodeIp, decodePort, agentName] = text
    if (room === 'None') {
      const meta = JSON.parse(raw[5]!.toString('utf8')) as DecodeAgent
      this.agents.set(agentName!, meta)
      return
    }
    const pages = raw[5]!.length / 4
    const required = Number(text[7] ?? '1')
    const list = this.infos.get(room) ?? []
    list.push({agentName: agentName!, decodeIp: decodeIp!, decodePort: decodePort!, pages})
    this.infos.set(room, list)
    this.required.set(room, required)
    if (list.length >= required) this.update(room, KVPoll.WaitingForInput)
  }

  private update(room: string, s: number): void {
    const before = this.status.get(room)
    const after = nextStatus(before, s)
    this.status.set(room, after)
    if (after !== before) this.onChange()
  }

  apply(op: PrefillOp): void {
    switch (op.op) {
      case 'create':
        this.update(op.room, KVPoll.Bootstrapping)
        this.createdAt.set(op.room, nowMs())
        break
      case 'send':
        this.send(op.room, op.tokens)
        break
      case 'abort':
        this.abort(op.room, 'Aborted by AbortReq.', 'own')
        break
      case 'failpoint':
        if (!op.tpRanks.includes(this.tpRank)) break
        if (op.name === 'drop-dest-info') this.dropFrames = op.enabled
        if (op.name === 'stall-kv') {
          this.stallKv = op.enabled
          // Released like a TCP path whose filter is removed: the held writes go out now.
          if (!op.enabled) for (const write of this.held.splice(0)) write()
        }
        this.log.info(`failpoint ${op.name} ${op.enabled ? 'on' : 'off'} on TP${this.tpRank}`)
        break
      case 'clear':
        this.status.delete(op.room)
        this.createdAt.delete(op.room)
        this.infos.delete(op.room)
        this.required.delete(op.room)
        this.reasons.delete(op.room)
        break
    }
  }

  /** `by`: prefill's own /abort_request (CommonKVSender.abort) or decode's ABORT over ZMQ (the bootstrap thread). */
  private abort(room: string, why: string, by: 'own' | 'decode'): void {
    const cur = this.status.get(room)
    if (cur === undefined) return
    // The defect, on prefill's own path only: once this rank's transfer has started (Transferring, or already done
    // while a sibling rank still transfers), its own abort is lost, so the all-reduced room stays Transferring.
    // Decode's ABORT still fails the room, as it would on a sender whose abort() misses the inflight state.
    if (this.bugAbortRace && by === 'own' && cur >= KVPoll.Transferring) return
    if (cur !== KVPoll.Success) this.log.info(`KVSender room=${room}: ${why}`)
    if (cur !== KVPoll.Failed && !this.reasons.has(room))
      this.reasons.set(room, `KVTransferError(bootstrap_room=${room}): ${why}`)
    this.update(room, KVPoll.Failed)
  }

  /** failure_exception() of a Failed room on this rank, when it knows why. */
  reason(room: string): string | undefined {
    return this.status.get(room) === KVPoll.Failed ? this.reasons.get(room) : undefined
  }

  poll(room: string): number {
    const s = this.status.get(room)
    if (s === undefined) return KVPoll.WaitingForInput // NIXL check_status: unknown rooms read as WaitingForInput
    // The Mooncake sender bounds Bootstrapping (its constructor sets init_time); the NIXL sender only from PR #34692
    // (2026-08-13) on, which the twin takes to be in every version after 0.5.15 (`sim up --sglang-version`).
    if (s === KVPoll.Bootstrapping && (this.env.backend === 'mooncake' || nixlHasBootstrapTimeout(this.cfg.version))) {
      const elapsed = (nowMs() - (this.createdAt.get(room) ?? nowMs())) / 1000
      if (elapsed >= this.env.bootstrapTimeoutS) {
        this.log.warn(`Request ${room} timed out after ${elapsed.toFixed(1)}s in ${pollName(KVPoll.Bootstrapping)}`)
        this.reasons.set(
          room,
          `KVTransferError(bootstrap_room=${room}): Request ${room} timed out after ${elapsed.toFixed(1)}s ` +
            `in ${pollName(KVPoll.Bootstrapping)}`,
        )
        this.update(room, KVPoll.Failed)
        return KVPoll.Failed
      }
    }
    return s
  }

  /**
   * send_kv_chunk(last_chunk=True): Transferring, then the KV bytes and the AUX to every destination. The room is
   * Success once every one of those WRITEs completed on this rank; a WRITE that fails is a transport error.
   */
  private send(room: string, tokens: number): void {
    if (this.status.get(room) === KVPoll.Failed) return
    const infos = this.infos.get(room) ?? []
    if (infos.length === 0) {
      this.fail(room, `KVTransferError(bootstrap_room=${room}): no destination info`)
      return
    }
    this.update(room, KVPoll.Transferring)
    const bytes = Math.ceil((this.cfg.timing.kvBytesPerToken * tokens) / this.cfg.prefillTp)
    const writes: Array<() => Promise<void>> = []
    for (const info of infos) {
      if (info.pages === 0) continue // a dummy decode rank gets no KV
      const agent = this.agents.get(info.agentName)
      if (!agent) {
        this.fail(room, `KVTransferError(bootstrap_room=${room}): unknown decode agent ${info.agentName}`)
        return
      }
      if (this.rdma && agent.rail) {
        const dest = agent.rail
        // Two WRITEs on the same QP, as NIXL posts the KV and then the aux data with its notification.
        writes.push(() =>
          Promise.all([
            this.rdma!({dest, room, bytes, notify: false}),
            this.rdma!({dest, room, bytes: AUX_BYTES, notify: true}),
          ]).then(() => undefined),
        )
      } else {
        writes.push(() => this.tcpWrite(agent, room, bytes))
      }
    }
    const start = () => {
      Promise.all(writes.map(w => w())).then(
        () => {
          if (this.status.has(room)) this.update(room, KVPoll.Success)
        },
        (err: unknown) => {
          if (!this.status.has(room) || this.status.get(room) === KVPoll.Failed) return
          const cause = err instanceof Error ? err.message : String(err)
          // nixl/conn.py transfer_worker: an ERR handle raises, the worker logs it, records it and fails the room.
          const exc = `NIXL transfer encountered ERR room=${room}: transport error (${cause})`
          this.log.warn(`NIXL transport error for room ${room}: ${exc}`)
          this.fail(room, exc, false)
        },
      )
    }
    if (this.stallKv) this.held.push(start)
    else start()
  }

  private fail(room: string, why: string, log = true): void {
    if (log) this.log.warn(`KV transfer failed for room=${room}: ${why}`)
    if (this.status.get(room) !== KVPoll.Failed && !this.reasons.has(room)) this.reasons.set(room, why)
    this.update(room, KVPoll.Failed)
  }

  /** The KV frames and the AUX on the rank pair's connection; done when the peer's kernel acknowledged all of them. */
  private tcpWrite(agent: DecodeAgent, room: string, bytes: number): Promise<void> {
    const conn = this.connect(agent)
    for (const frame of kvFrames(BigInt(room), this.tpRank, bytes)) {
      conn.queued += frame.length
      conn.socket.write(frame, err => {
        if (!err) conn.sent += frame.length
      })
    }
    return new Promise<void>((resolve, reject) => {
      // A connection that had nothing pending is asked soon (its receipt usually comes first); one already waiting
      // (stalled) keeps its backoff.
      if (conn.pending.length === 0) {
        conn.delayMs = FIRST_KERNEL_CHECK_MS
        conn.checkAt = performance.now() + FIRST_KERNEL_CHECK_MS
      }
      conn.pending.push({end: conn.queued, resolve, reject})
      this.scheduleAcks()
    })
  }

  /** The next read of the table: when the earliest connection with pending WRITEs is due. */
  private scheduleAcks(): void {
    let at = Infinity
    for (const c of this.conns.values()) if (c.pending.length > 0) at = Math.min(at, c.checkAt)
    if (at === Infinity || at >= this.ackTimerAt) return
    if (this.ackTimer) clearTimeout(this.ackTimer)
    this.ackTimerAt = at
    this.ackTimer = setTimeout(this.checkAcks, Math.max(0, at - performance.now()))
  }

  /**
   * Which pending WRITEs the peer has acknowledged: bytes whose write callback fired, minus the socket's tx_queue
   * (handed to the kernel, not yet ACKed; /proc/net/tcp). Conservative: a byte counts only once both agree. Read
   * again FIRST_KERNEL_CHECK_MS after progress, backing off to ACK_POLL_MAX_MS while there is none (a stalled path:
   * reading the table every 16 ms for a stall's seconds was a third of the ranks' CPU).
   */
  private readonly checkAcks = (): void => {
    this.ackTimer = undefined
    this.ackTimerAt = Infinity
    const now = performance.now()
    const tables = new ProcTcpTables()
    for (const conn of this.conns.values()) {
      if (conn.pending.length === 0 || conn.checkAt > now) continue
      let acked: number
      if (!PROC_TCP)
        acked = conn.sent // no procfs: the write callbacks are all there is
      else {
        const txq = txQueue(conn.socket, tables)
        acked = txq === undefined ? -1 : conn.sent - txq
      }
      const progress = this.settle(conn, acked)
      // Each connection backs off on its own: a stalled one is read every ACK_POLL_MAX_MS, a moving one again after
      // FIRST_KERNEL_CHECK_MS (a reading peer's receipts settle the rest sooner; only a stopped one needs the table).
      conn.delayMs = progress ? FIRST_KERNEL_CHECK_MS : Math.min(conn.delayMs * 2, ACK_POLL_MAX_MS)
      conn.checkAt = now + conn.delayMs
    }
    this.scheduleAcks()
  }

  /** Complete the WRITEs whose last byte is at or below `upTo` (bytes of the connection); true if any was. */
  private settle(conn: DataConn, upTo: number): boolean {
    let progress = false
    while (conn.pending.length > 0 && conn.pending[0]!.end <= upTo) {
      conn.pending.shift()!.resolve()
      progress = true
    }
    return progress
  }

  private connect(agent: DecodeAgent): DataConn {
    const key = `${agent.dataHost}:${agent.dataPort}`
    const existing = this.conns.get(key)
    if (existing) return existing
    const socket = net.createConnection({host: agent.dataHost, port: agent.dataPort})
    socket.setNoDelay(true)
    const conn: DataConn = {
      socket,
      key,
      queued: 0,
      sent: 0,
      pending: [],
      delayMs: 1,
      checkAt: 0,
      receipts: new ReceiptReader(),
    }
    // Decode's receipts: what its process read is past its kernel, the WRITEs up to there are complete.
    socket.on('data', (d: Buffer) => {
      conn.receipts.push(d)
      if (this.settle(conn, conn.receipts.latest)) conn.delayMs = FIRST_KERNEL_CHECK_MS
    })
    const drop = (why: string) => {
      if (this.conns.get(key) === conn) this.conns.delete(key)
      const err = new Error(`data connection to ${key} ${why}`)
      for (const w of conn.pending.splice(0)) w.reject(err)
    }
    socket.on('error', err => drop(`failed: ${err.message}`))
    socket.on('close', () => drop('closed'))
    this.conns.set(key, conn)
    return conn
  }

  close(): void {
    if (this.ackTimer) clearTimeout(this.ackTimer)
    for (const c of this.conns.values()) c.socket.destroy()
    this.conns.clear()
  }
}

/**
 * NixlKVSender sets init_time and calls _check_bootstrap_timeout while Bootstrapping only since PR #34692 (merged
 * 2026-08-13, after the July snapshot between v0.5.15 and v0.5.16): a version after 0.5.15 has it here.
 */
export function nixlHasBootstrapTimeout(version: string): boolean {
  const m = /^v?(\d+)\.(\d+)(?:\.(\d+))?/.exec(version.trim())
  if (!m) return false
  const [a, b, c] = [Number(m[1]), Number(m[2]), Number(m[3] ?? 0)]
  return a > 0 || b > 5 || (b === 5 && c > 15)
}
