import * as dgram from 'node:dgram'
import {randomInt} from 'node:crypto'
import type {Logger} from './log.js'
import {RAIL_PAYLOAD_BYTES, ROCE_V2_PORT, rcGiveUpS, type RailNic, type UcxRcSettings} from './rail-plan.js'

/**
 * One rail NIC of the twin: the RoCE reliable-connection (RC) engine of one GPU's NIC, carrying RDMA WRITEs as UDP
 * datagrams to port 4791 over that GPU's rail interface. It lives in the server process, not in the rank, because a
 * NIC keeps acknowledging and retransmitting while the process that posted the work is stopped (SIGSTOP): the
 * requester completes a WRITE when the responder NIC has acknowledged its last packet, whatever the remote process
 * does (NIXL's one-sided WRITE, sgl-project/sglang python/sglang/srt/disaggregation/nixl/conn.py transfer_worker,
 * ~1193-1207 at 8905cbd4), and the responder hands the WRITE's notification to its process asynchronously.
 *
 * RC as UCX configures it on the QP (openucx/ucx src/uct/ib/rc/base/rc_iface.c:600-608): unacknowledged packets are
 * sent again after the local ACK timeout (4.096 us x 2^exponent, from UCX_RC_*TIMEOUT), at most retry_cnt times
 * (UCX_RC_*RETRY_COUNT) without progress; after that the work completes in error, IBV_WC_RETRY_EXC_ERR, which UCX
 * reports as "Transport retry count exceeded" and UCS_ERR_ENDPOINT_TIMEOUT (src/uct/ib/mlx5/ib_mlx5_log.c:131-133,
 * src/uct/ib/base/ib_iface.h:806-808). So a stall shorter than about timeout x retries is waited out, and one longer
 * than timeout x (retries + 1) fails the endpoint.
 *
 * Wire format (24-byte header, big-endian, then zero payload): type u8 | flags u8 | prefill rank u16 | QPN u32 |
 * PSN u32 | room u64 | payload length u32. Types: DATA, ACK (cumulative: every PSN up to this one arrived), NAK (PSN
 * sequence error: this is the PSN expected, resend from it). Flags on DATA: LAST (the WRITE's last packet) and NOTIFY
 * (the WRITE carries a notification, delivered when its last packet arrives in order).
 */

export const RailPkt = {data: 1, ack: 2, nak: 3} as const
const FLAG_LAST = 1
const FLAG_NOTIFY = 2
export const RAIL_HEADER_BYTES = 24
/** Packets in flight per QP: small enough that a few QPs into one NIC fit the socket's receive buffer (~25 x 4 KB). */
const WINDOW = 8
const ZERO = Buffer.alloc(RAIL_PAYLOAD_BYTES)

export interface RailHeader {
  type: number
  flags: number
  prefillRank: number
  qpn: number
  psn: number
  room: bigint
  length: number
}

export function railHeader(h: RailHeader): Buffer {
  const b = Buffer.allocUnsafe(RAIL_HEADER_BYTES)
  b.writeUInt8(h.type, 0)
  b.writeUInt8(h.flags, 1)
  b.writeUInt16BE(h.prefillRank, 2)
  b.writeUInt32BE(h.qpn, 4)
  b.writeUInt32BE(h.psn, 8)
  b.writeBigUInt64BE(h.room, 12)
  b.writeUInt32BE(h.length, 20)
  return b
}

export function parseRailHeader(b: Buffer): RailHeader | undefined {
  if (b.length < RAIL_HEADER_BYTES) return undefined
  return {
    type: b.readUInt8(0),
    flags: b.readUInt8(1),
    prefillRank: b.readUInt16BE(2),
    qpn: b.readUInt32BE(4),
    psn: b.readUInt32BE(8),
    room: b.readBigUInt64BE(12),
    length: b.readUInt32BE(20),
  }
}

export interface RdmaWrite {
  /** The responder NIC: its rail address and port. */
  dest: {addr: string; port: number}
  room: string
  prefillRank: number
  bytes: number
  /** Deliver a notification (NIXL's "{room}_aux") with the last packet. */
  notify: boolean
}

/** A work request that completed in error: the transport's own words. */
export class TransportError extends Error {
  constructor(
    message: string,
    readonly status = 'Endpoint timeout',
  ) {
    super(message)
    this.name = 'TransportError'
  }
}

interface Wr {
  lastPsn: number
  resolve: () => void
  reject: (e: Error) => void
}
interface Pkt {
  psn: number
  flags: number
  length: number
  room: bigint
  prefillRank: number
  wr?: Wr
}

class Qp {
  readonly pkts: Pkt[] = [] // pkts[0].psn === acked: every packet not yet acknowledged, in PSN order
  acked = 0
  nextSend = 0
  nextPsn = 0
  retries = 0
  sends = 0
  timer: NodeJS.Timeout | undefined
  constructor(
    readonly qpn: number,
    readonly dest: {addr: string; port: number},
  ) {}
}

interface Responder {
  expected: number
  nakSent: boolean
}

export interface NicCounters {
  txPackets: number
  rxPackets: number
  retransmits: number
  timeouts: number
  naks: number
  errors: number
}

export class RailNicEngine {
  private readonly sock: dgram.Socket
  private readonly byDest = new Map<string, Qp>()
  private readonly byQpn = new Map<number, Qp>()
  private readonly responders = new Map<string, Responder>()
  readonly counters: NicCounters = {txPackets: 0, rxPackets: 0, retransmits: 0, timeouts: 0, naks: 0, errors: 0}
  private closed = false

  /** Where the notification of a WRITE that landed here goes (the rank of this NIC's GPU). */
  onNotifyRank: (room: string, prefillRank: number) => void = () => undefined

  /** `port`: 4791 (RoCEv2) on a rail; tests bind 0 and read `port` back. */
  constructor(
    readonly nic: Pick<RailNic, 'name' | 'addr'>,
    readonly rc: UcxRcSettings,
    private readonly log: Logger,
    private readonly bindPort = ROCE_V2_PORT,
  ) {
    this.sock = dgram.createSocket({type: 'udp4', reuseAddr: true})
    this.sock.on('message', (msg, rinfo) => this.receive(msg, rinfo))
    this.sock.on('error', err => this.log.error(`UCX  ERROR ${this.nic.name}: ${err.message}`))
  }

  get port(): number {
    return this.sock.address().port
  }

  async bind(): Promise<void> {
    await new Promise<void>((resolve, reject) => {
      this.sock.once('error', reject)
      this.sock.bind({address: this.nic.addr, port: this.bindPort}, () => {
        this.sock.off('error', reject)
        resolve()
      })
    })
    // As much receive buffer as the host allows (net.core.rmem_max caps it); NAKs recover what overflows.
    try {
      this.sock.setRecvBufferSize(8 * 1024 * 1024)
    } catch {
      /* capped or refused: keep the default */
    }
  }

  /** Post one RDMA WRITE: resolves when the responder acknowledged its last packet, rejects with a TransportError. */
  post(w: RdmaWrite): Promise<void> {
    if (this.closed) return Promise.reject(new TransportError(`${this.nic.name} is closed`, 'Canceled'))
    const key = `${w.dest.addr}:${w.dest.port}`
    let qp = this.byDest.get(key)
    if (!qp) {
      qp = new Qp(this.newQpn(), w.dest)
      this.byDest.set(key, qp)
      this.byQpn.set(qp.qpn, qp)
    }
    const room = BigInt(w.room)
    const n = Math.max(1, Math.ceil(w.bytes / RAIL_PAYLOAD_BYTES))
    return new Promise<void>((resolve, reject) => {
      const wr: Wr = {lastPsn: qp.nextPsn + n - 1, resolve, reject}
      for (let i = 0; i < n; i++) {
        const last = i === n - 1
        const length = Math.max(0, Math.min(RAIL_PAYLOAD_BYTES, w.bytes - i * RAIL_PAYLOAD_BYTES))
        qp.pkts.push({
          psn: qp.nextPsn++,
          flags: (last ? FLAG_LAST : 0) | (last && w.notify ? FLAG_NOTIFY : 0),
          length,
          room,
          prefillRank: w.prefillRank,
          ...(last ? {wr} : {}),
        })
      }
      this.pump(qp)
    })
  }

  private newQpn(): number {
    let q: number
    do q = randomInt(0x100, 0xffffff)
    while (this.byQpn.has(q))
    return q
  }

  private pump(qp: Qp): void {
    while (qp.nextSend < qp.nextPsn && qp.nextSend - qp.acked < WINDOW) {
      const pkt = qp.pkts[qp.nextSend - qp.acked]!
      this.transmit(qp, pkt)
      qp.nextSend++
    }
    if (qp.acked < qp.nextSend && !qp.timer) this.arm(qp)
  }

  private transmit(qp: Qp, pkt: Pkt): void {
    const h = railHeader({
      type: RailPkt.data,
      flags: pkt.flags,
      prefillRank: pkt.prefillRank,
      qpn: qp.qpn,
      psn: pkt.psn,
      room: pkt.room,
      length: pkt.length,
    })
    this.counters.txPackets++
    qp.sends++
    this.sock.send(pkt.length > 0 ? [h, ZERO.subarray(0, pkt.length)] : [h], qp.dest.port, qp.dest.addr)
  }

  private arm(qp: Qp): void {
    if (qp.timer) clearTimeout(qp.timer)
    qp.timer = undefined
    if (!Number.isFinite(this.rc.qpTimeoutS)) return // exponent 0: the QP never times out
    qp.timer = setTimeout(() => this.timeout(qp), this.rc.qpTimeoutS * 1000)
  }

  /** The local ACK timer fired with packets outstanding: resend them all (go-back-N), or give up. */
  private timeout(qp: Qp): void {
    qp.timer = undefined
    if (qp.acked >= qp.nextSend) return
    this.counters.timeouts++
    if (qp.retries >= this.rc.retryCount) {
      this.fail(qp)
      return
    }
    qp.retries++
    this.counters.retransmits += qp.nextSend - qp.acked
    qp.nextSend = qp.acked
    this.pump(qp)
    if (!qp.timer) this.arm(qp)
  }

  private fail(qp: Qp): void {
    this.counters.errors++
    this.byDest.delete(`${qp.dest.addr}:${qp.dest.port}`)
    this.byQpn.delete(qp.qpn)
    const head = qp.pkts[0]
    const ucx = `Transport retry count exceeded on ${this.nic.name}:1/RoCE (synd 0x15 vend 0x81 hw_synd 0/0)`
    const detail =
      `${ucx}: RC QP 0x${qp.qpn.toString(16)} to ${qp.dest.addr}:${qp.dest.port}, psn ${head?.psn ?? qp.acked} ` +
      `unacknowledged after ` +
      `${qp.retries + 1} transmissions, ${fmtS(this.rc.qpTimeoutS)} apart (${this.rc.transport} ` +
      `timeout ${this.rc.timeoutText}` +
      `${this.rc.timeoutFrom === 'default' ? ' by default' : ` from ${this.rc.timeoutFrom}`} ` +
      `-> ${fmtS(this.rc.qpTimeoutS)}, retry count ${this.rc.retryCount}` +
      `${this.rc.retryCountFrom === 'default' ? ' by default' : ` from ${this.rc.retryCountFrom}`}: gives up ` +
      `after ${fmtS(rcGiveUpS(this.rc))})`
    this.log.error(`UCX  ERROR ${ucx}`)
    const err = new TransportError(`UCX Endpoint timeout: ${detail}`)
    const wrs = new Set<Wr>()
    for (const p of qp.pkts) if (p.wr) wrs.add(p.wr)
    qp.pkts.length = 0
    for (const wr of wrs) wr.reject(err)
  }

  private receive(msg: Buffer, rinfo: dgram.RemoteInfo): void {
    const h = parseRailHeader(msg)
    if (!h) return
    this.counters.rxPackets++
    if (h.type === RailPkt.data) this.respond(h, rinfo)
    else if (h.type === RailPkt.ack) this.onAck(h.qpn, h.psn)
    else if (h.type === RailPkt.nak) this.onNak(h.qpn, h.psn)
  }

  /** Responder: in-order packets are acknowledged (and a WRITE's notification delivered), a gap NAKed once. */
  private respond(h: RailHeader, rinfo: dgram.RemoteInfo): void {
    const key = `${rinfo.address}:${rinfo.port}:${h.qpn}`
    let r = this.responders.get(key)
    if (!r) {
      r = {expected: 0, nakSent: false}
      this.responders.set(key, r)
    }
    const reply = (type: number, psn: number) => {
      this.sock.send(
        railHeader({type, flags: 0, prefillRank: h.prefillRank, qpn: h.qpn, psn, room: h.room, length: 0}),
        rinfo.port,
        rinfo.address,
      )
    }
    if (h.psn === r.expected) {
      r.expected++
      r.nakSent = false
      if (h.flags & FLAG_LAST && h.flags & FLAG_NOTIFY) this.onNotifyRank(h.room.toString(), h.prefillRank)
      reply(RailPkt.ack, h.psn)
    } else if (h.psn < r.expected) {
      reply(RailPkt.ack, r.expected - 1) // a duplicate: say again how far we are
    } else if (!r.nakSent) {
      r.nakSent = true
      this.counters.naks++
      reply(RailPkt.nak, r.expected)
    }
  }

  private onAck(qpn: number, psn: number): void {
    const qp = this.byQpn.get(qpn)
    if (!qp || psn + 1 <= qp.acked || psn >= qp.nextPsn) return
    this.advance(qp, psn + 1)
  }

  private onNak(qpn: number, psn: number): void {
    const qp = this.byQpn.get(qpn)
    if (!qp) return
    if (psn > qp.acked && psn <= qp.nextPsn) this.advance(qp, psn)
    qp.nextSend = qp.acked // go back: resend from the PSN the responder expects
    this.counters.retransmits++
    this.pump(qp)
  }

  /** Everything before `upTo` is acknowledged: complete its WRITEs, and the retry count starts over. */
  private advance(qp: Qp, upTo: number): void {
    const done = qp.pkts.splice(0, upTo - qp.acked)
    qp.acked = upTo
    if (qp.nextSend < qp.acked) qp.nextSend = qp.acked
    qp.retries = 0
    for (const p of done) p.wr?.resolve()
    if (qp.acked < qp.nextSend) this.arm(qp)
    else if (qp.timer) {
      clearTimeout(qp.timer)
      qp.timer = undefined
    }
    this.pump(qp)
  }

  close(): void {
    this.closed = true
    for (const qp of this.byQpn.values()) {
      if (qp.timer) clearTimeout(qp.timer)
      for (const p of qp.pkts) p.wr?.reject(new TransportError(`${this.nic.name} closed`, 'Canceled'))
    }
    this.byQpn.clear()
    this.byDest.clear()
    try {
      this.sock.close()
    } catch {
      /* already closed */
    }
  }
}

const fmtS = (s: number): string => (Number.isFinite(s) ? `${(s * 1000).toFixed(s < 1 ? 2 : 0)} ms` : 'never')
