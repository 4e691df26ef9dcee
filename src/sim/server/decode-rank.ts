import * as net from 'node:net'
import {KVPoll, nextStatus, pollName} from './kvpoll.js'
import {FrameReader, FrameType, receipt} from './data-frames.js'
import {gpuIndex} from './protocol.js'
import {rankCount, routeKeyOf, serverLayout} from './layout.js'
import {railOfGpu, ROCE_V2_PORT} from './rail-plan.js'
import {NIXL_GUARD, PushLink} from './zmq-link.js'
import type {DecodeOp} from './protocol.js'
import type {Logger} from './log.js'
import type {SimConfig} from '../sim-config.js'
import type {EnvSettings} from './settings.js'
import {nowMs, sleep} from './clock.js'
import {httpCall, isOk} from './http-call.js'

interface PrefillInfo {
  attnTpSize: number
  instanceId: string
  ranks: Map<number, {ip: string; port: number}>
}

interface Receiver {
  rid: string
  addr: string
  tokens: number
  status: number
  metadataSentAt?: number
  /** Prefill ranks that send KV to this decode rank; empty = dummy rank. */
  sources?: number[]
  done: Set<number>
}

const ROUTE_TRIES = 15

/**
 * One decode TP rank's KV receiver side: resolves the prefill's /route lazily per bootstrap address and
 * caches it, registers its KV args once per (addr, prefill rank), pushes TransferInfo and ABORT over ZMQ,
 * receives KV bytes on its data port (or, with rail NICs, the notifications of WRITEs that landed on its GPU)
 * and enforces the waiting timeout. It never answers the sender: the WRITE is one-sided, and decode learns of
 * it from notifications it drains in poll(), after the waiting-timeout check, as NixlKVReceiver.poll does
 * (nixl/conn.py ~2638-2648 at 8905cbd4: the timeout check comes before update_transfer_status()).
 */
export class DecodeRank {
  private readonly receivers = new Map<string, Receiver>()
  private readonly infoTable = new Map<string, Promise<PrefillInfo>>()
  private readonly pushes = new Map<string, PushLink>()
  private readonly registered = new Set<string>()
  private readonly agentName: string
  private server: net.Server | undefined
  private readonly sockets = new Set<net.Socket>()
  /** Notifications that arrived (an AUX frame, or a rail WRITE's), not yet drained by poll(). */
  private readonly notifs: Array<{room: string; prefillRank: number}> = []
  private readonly reasons = new Map<string, string>()
  private warnedWaitingTimeout = false
  dataPort = 0
  zmqPort = 0
  /**
   * Something the next poll() reports differently may have happened outside a step (rank-main.ts tells the scheduler).
   */
  onChange: () => void = () => undefined

  constructor(
    private readonly cfg: SimConfig,
    private readonly env: EnvSettings,
    private readonly tpRank: number,
    private readonly log: Logger,
  ) {
    this.agentName = `decode_${process.pid}_tp${tpRank}`
  }

  async listen(): Promise<number> {
    this.server = net.createServer(socket => {
      socket.setNoDelay(true)
      this.sockets.add(socket)
      socket.on('close', () => this.sockets.delete(socket))
      socket.on('error', () => socket.destroy())
      const reader = new FrameReader(h => {
        if (h.type === FrameType.aux) this.notify(h.room.toString(), h.prefillRank)
      })
      // A receipt of what this process has read, once per burst of reads: prefill's proof that the bytes arrived.
      let read = 0
      let receiptDue = false
      socket.on('data', d => {
        reader.push(d)
        read += d.length
        if (receiptDue) return
        receiptDue = true
        setImmediate(() => {
          receiptDue = false
          if (!socket.destroyed) socket.write(receipt(read))
        })
      })
    })
    await new Promise<void>((resolve, reject) => {
      this.server!.once('error', reject)
      this.server!.listen(0, this.cfg.host, () => resolve())
    })
    this.dataPort = (this.server.address() as net.AddressInfo).port
    return this.dataPort
  }

  /** A WRITE's notification arrived ("{room}_aux" from prefill rank j); poll() drains it. */
  notify(room: string, prefillRank: number): void {
    this.notifs.push({room, prefillRank})
    this.onChange()
  }

  /** update_transfer_status(): every pending notification into its room's transfer status. */
  private drainNotifs(): void {
    for (const n of this.notifs.splice(0)) {
      const r = this.receivers.get(n.room)
      if (!r || r.status === KVPoll.Failed) continue
      r.done.add(n.prefillRank)
      if (r.sources?.every(j => r.done.has(j))) r.status = nextStatus(r.status, KVPoll.Success)
    }
  }

  reason(room: string): string | undefined {
    return this.receivers.get(room)?.status === KVPoll.Failed ? this.reasons.get(room) : undefined
  }

  apply(op: DecodeOp): void {
    switch (op.op) {
      case 'create': {
        const r: Receiver = {
          rid: op.rid,
          addr: op.addr,
          tokens: op.tokens,
          status: KVPoll.Bootstrapping,
          done: new Set(),
        }
        this.receivers.set(op.room, r)
        this.resolve(op.addr).then(
          info => {
            if (r.status === KVPoll.Failed) return
            r.sources = [...info.ranks.keys()]
            r.status = nextStatus(r.status, KVPoll.WaitingForInput)
            this.onChange()
          },
          (err: unknown) => {
            this.log.warn(
              `Decode handshake failed for request rank=${this.tpRank} rid=${op.rid} ` +
                `bootstrap_addr=${op.addr}: ${String(err)}`,
            )
            r.status = KVPoll.Failed
            this.onChange()
          },
        )
        break
      }
      case 'send_metadata':
        this.sendMetadata(op.room)
        break
      case 'abort': {
        const r = this.receivers.get(op.room)
        if (!r || r.status === KVPoll.Success) break
        r.status = KVPoll.Failed
        this.sendAbort(op.room, r)
        break
      }
      case 'clear':
        this.receivers.delete(op.room)
        this.reasons.delete(op.room)
        break
      case 'node_failure':
        this.nodeFailure(op.addr)
        break
    }
  }

  poll(room: string): number {
    const r = this.receivers.get(room)
    if (!r) return KVPoll.Failed
    if (r.metadataSentAt !== undefined && r.status !== KVPoll.Success && r.status !== KVPoll.Failed) {
      const elapsed = (nowMs() - r.metadataSentAt) / 1000
      if (elapsed >= this.env.waitingTimeoutS) {
        // CommonKVReceiver._check_waiting_timeout (common/conn.py) warns once per process; the request's own line is
        // the scheduler's "Decode transfer failed …" with this reason.
        if (!this.warnedWaitingTimeout) {
          this.warnedWaitingTimeout = true
          this.log.warn(
            'Some requests fail to receive KV Cache transfer done signal after bootstrapping. If a greater mean ' +
              "TTFT is acceptable, you can 'export SGLANG_DISAGGREGATION_WAITING_TIMEOUT=600' (10 minutes) to " +
              'relax the timeout condition. ',
          )
        }
        this.reasons.set(
          room,
          `KVTransferError(bootstrap_room=${room}): Request ${room} timed out after ${elapsed.toFixed(1)}s ` +
            `in ${pollName(KVPoll.WaitingForInput)}`,
        )
        r.status = KVPoll.Failed
        this.sendAbort(room, r)
      }
    }
    this.drainNotifs()
    return r.status
  }

  /**
   * GET /route: PrefillServerInfo, then the rank endpoints of the prefill ranks this decode rank serves. Cached per
   * address.
   */
  private resolve(addr: string): Promise<PrefillInfo> {
    let p = this.infoTable.get(addr)
    if (!p) {
      p = this.fetchInfo(addr)
      this.infoTable.set(addr, p)
      p.catch(() => {
        if (this.infoTable.get(addr) === p) this.infoTable.delete(addr)
      })
    }
    return p
  }

  private async fetchInfo(addr: string): Promise<PrefillInfo> {
    const get = async (q: string) => {
      const res = await httpCall(`http://${addr}/route?${q}`, {timeoutMs: 2000})
      if (!isOk(res.status)) throw new Error(`GET /route ${res.status}`)
      return JSON.parse(res.text) as Record<string, unknown>
    }
    let last: unknown
    for (let attempt = 0; attempt < ROUTE_TRIES; attempt++) {
      try {
        const info = await get('prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1')
        const tp = Number(info.attn_tp_size)
        const ranks = new Map<number, {ip: string; port: number}>()
        // The twin's prefill ranks j = 0..N-1 under their bootstrap keys (plain TP: dp 0, tp j, pp 0).
        const prefillLayout = serverLayout(this.cfg, 'prefill')
        for (let j = 0; j < rankCount(prefillLayout); j++) {
          if (j % this.cfg.decodeTp !== this.tpRank) continue
          const key = routeKeyOf(prefillLayout, j)
          const r = await get(
            `prefill_dp_rank=${key.dp}&prefill_cp_rank=${key.cp}&target_tp_rank=${key.tp}&target_pp_rank=${key.pp}`,
          )
          ranks.set(j, {ip: String(r.rank_ip), port: Number(r.rank_port)})
        }
        return {attnTpSize: tp, instanceId: String(info.bootstrap_instance_id ?? ''), ranks}
      } catch (err) {
        last = err
      }
      await sleep(1000)
    }
    throw new Error(`could not resolve /route after ${ROUTE_TRIES} tries: ${String(last)}`)
  }

  private link(ip: string, port: number): PushLink {
    const key = `tcp://${ip}:${port}`
    let l = this.pushes.get(key)
    if (!l) {
      l = new PushLink(key)
      this.pushes.set(key, l)
    }
    return l
  }

  private sendMetadata(room: string): void {
    const r = this.receivers.get(room)
    if (!r || r.status === KVPoll.Failed) return
    r.metadataSentAt = nowMs()
    const sources = r.sources ?? []
    if (sources.length === 0) {
      r.status = nextStatus(r.status, KVPoll.Success)
      return
    } // dummy rank
    void this.resolve(r.addr).then(
      info => {
        const ip = this.cfg.host
        const port = String(this.zmqPort)
        const pages = Buffer.alloc(4 * Math.max(1, r.tokens))
        for (const j of sources) {
          const ep = info.ranks.get(j)
          if (!ep) continue
          const l = this.link(ep.ip, ep.port)
          const regKey = `${r.addr}|${j}`
          if (!this.registered.has(regKey)) {
            this.registered.add(regKey)
            const nic = railOfGpu(this.cfg.rails, gpuIndex('decode', this.tpRank, this.cfg.prefillTp))
            const meta = JSON.stringify({
              dataHost: this.cfg.host,
              dataPort: this.dataPort,
              ...(nic ? {rail: {addr: nic.addr, port: ROCE_V2_PORT}} : {}),
            })
            l.send([
              NIXL_GUARD,
              'None',
              ip,
              port,
              this.agentName,
              meta,
              Buffer.alloc(8),
              Buffer.alloc(8),
              String(this.tpRank),
              String(this.cfg.decodeTp),
              String(this.cfg.timing.kvBytesPerToken),
            ])
          }
          l.send([NIXL_GUARD, room, ip, port, this.agentName, pages, '0', '1', Buffer.alloc(0), '0'])
        }
      },
      () => {
        r.status = KVPoll.Failed
        this.onChange()
      },
    )
  }

  private sendAbort(room: string, r: Receiver): void {
    const info = this.infoTable.get(r.addr)
    if (!info) return
    void info.then(
      i => {
        for (const ep of i.ranks.values())
          this.link(ep.ip, ep.port).send(['ABORT', room, this.cfg.host, String(this.zmqPort)])
      },
      () => undefined,
    )
  }

  /** _handle_node_failure: forget the prefill's route info and sockets, fail every non-Success room of it. */
  private nodeFailure(addr: string): void {
    // --bug stale-peer: the rooms fail, but the dead instance's endpoints stay cached: decode never re-resolves.
    if (this.cfg.bugs.includes('stale-peer')) {
      this.failRoomsOf(addr)
      return
    }
    const info = this.infoTable.get(addr)
    this.infoTable.delete(addr)
    for (const key of [...this.registered]) if (key.startsWith(`${addr}|`)) this.registered.delete(key)
    if (info) {
      void info.then(
        i => {
          for (const ep of i.ranks.values()) {
            const key = `tcp://${ep.ip}:${ep.port}`
            this.pushes.get(key)?.close()
            this.pushes.delete(key)
          }
        },
        () => undefined,
      )
    }
    this.failRoomsOf(addr)
  }

  /**
   * Every room of that prefill not yet Success fails, with the reason common/conn.py _handle_node_failure records
   * (record_failure): decode's 500 and its "Decode transfer failed" line carry it.
   */
  private failRoomsOf(addr: string): void {
    for (const [room, r] of this.receivers) {
      if (r.addr !== addr || r.status === KVPoll.Success || r.status === KVPoll.Failed) continue
      this.reasons.set(
        room,
        `KVTransferError(bootstrap_room=${room}): Lost connection with prefill instance (bootstrap_addr: ${addr})`,
      )
      r.status = KVPoll.Failed
    }
  }

  close(): void {
    for (const l of this.pushes.values()) l.close()
    for (const s of this.sockets) s.destroy()
    this.server?.close()
  }
}
