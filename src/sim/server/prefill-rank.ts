import * as net from 'node:net'
import type * as zmq from 'zeromq'
import {KVPoll, nextStatus, pollName} from './kvpoll.js'
import {FrameReader, FrameType, kvFrames} from './data-frames.js'
import {NIXL_GUARD} from './zmq-link.js'
import type {PrefillOp} from './protocol.js'
import type {Logger} from './log.js'
import type {SimConfig} from '../sim-config.js'
import type {EnvSettings} from './settings.js'
import {nowMs, sleep} from './clock.js'

interface DecodeAgent {dataHost: string; dataPort: number}
interface DstInfo {agentName: string; decodeIp: string; decodePort: string; pages: number}
interface DataConn {socket: net.Socket; waiting: Set<string>}

/**
 * One prefill TP rank's KV sender side: the per-room status table (NIXL's update_status rules), the
 * destination infos decode pushed over ZMQ, and the data connections that carry each room's KV bytes.
 */
export class PrefillRank {
  private readonly status = new Map<string, number>()
  private readonly createdAt = new Map<string, number>()
  private readonly infos = new Map<string, DstInfo[]>()
  private readonly required = new Map<string, number>()
  private readonly agents = new Map<string, DecodeAgent>()
  private readonly conns = new Map<string, DataConn>()
  private readonly bugAbortRace: boolean
  /** Failure points (the twin's control endpoint): drop every decode frame; hold KV writes until released. */
  private dropFrames = false
  private stallKv = false
  private readonly held: Array<() => void> = []

  constructor(
    private readonly cfg: SimConfig, private readonly env: EnvSettings, private readonly tpRank: number,
    private readonly log: Logger,
  ) {
    this.bugAbortRace = cfg.bugs.includes('abort-race')
  }

  /** PUT /route on the in-process bootstrap server, 5 tries with backoff, as register_to_bootstrap does. */
  async register(zmqPort: number): Promise<void> {
    const body = JSON.stringify({
      role: 'Prefill', attn_tp_size: this.cfg.prefillTp, attn_tp_rank: this.tpRank, attn_cp_size: 1, attn_cp_rank: 0,
      attn_dp_size: 1, attn_dp_rank: 0, pp_size: 1, pp_rank: 0, system_dp_size: 1, system_dp_rank: 0,
      rank_ip: this.cfg.host, rank_port: zmqPort, page_size: 1, kv_cache_dtype: 'auto', prefill_http_port: this.cfg.ports.prefill,
    })
    const url = `http://${this.cfg.host}:${this.cfg.ports.bootstrap}/route`
    let last: unknown
    for (let attempt = 0; attempt < 5; attempt++) {
      try {
        const res = await fetch(url, {method: 'PUT', body, headers: {'content-type': 'application/json'}, signal: AbortSignal.timeout(5000)})
        if (res.ok) return
        last = new Error(`HTTP ${res.status}`)
      } catch (err) { last = err }
      await sleep(200 * 2 ** attempt)
    }
    throw new Error(`Failed to register to bootstrap server ${url}: ${String(last)}`)
  }

  async receive(pull: zmq.Pull): Promise<void> {
    for await (const frames of pull) {
      try { this.onFrames(frames.map((f) => f.toString('latin1')), frames) } catch (err) { this.log.error(`bootstrap thread: ${String(err)}`) }
    }
  }

  private onFrames(text: string[], raw: Buffer[]): void {
    // As a packet filter on the ZMQ port would: nothing decode sends arrives, ABORT included.
    if (this.dropFrames) return
    if (text[0] === 'ABORT') {
      const room = text[1]!
      this.abort(room, 'Aborted by decode ABORT.')
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
    this.status.set(room, nextStatus(this.status.get(room), s))
  }

  apply(op: PrefillOp): void {
    switch (op.op) {
      case 'create':
        this.update(op.room, KVPoll.Bootstrapping)
        this.createdAt.set(op.room, nowMs())
        break
      case 'send': this.send(op.room, op.tokens); break
      case 'abort': this.abort(op.room, 'Aborted by AbortReq.'); break
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
        this.status.delete(op.room); this.createdAt.delete(op.room); this.infos.delete(op.room); this.required.delete(op.room)
        break
    }
  }

  private abort(room: string, why: string): void {
    const cur = this.status.get(room)
    if (cur === undefined) return
    // The defect: once this rank's transfer has started (Transferring, or already done while a sibling rank
    // still transfers), the abort is lost, so the all-reduced room stays Transferring.
    if (this.bugAbortRace && cur >= KVPoll.Transferring) return
    if (cur !== KVPoll.Success) this.log.info(`KVSender room=${room}: ${why}`)
    this.update(room, KVPoll.Failed)
  }

  poll(room: string): number {
    const s = this.status.get(room)
    if (s === undefined) return KVPoll.WaitingForInput // NIXL check_status: unknown rooms read as WaitingForInput
    // Only the Mooncake sender bounds Bootstrapping (its constructor sets init_time); NIXL has no timeout.
    if (s === KVPoll.Bootstrapping && this.env.backend === 'mooncake') {
      const elapsed = (nowMs() - (this.createdAt.get(room) ?? nowMs())) / 1000
      if (elapsed >= this.env.bootstrapTimeoutS) {
        this.log.warn(`Request ${room} timed out after ${elapsed.toFixed(1)}s in ${pollName(KVPoll.Bootstrapping)}`)
        this.update(room, KVPoll.Failed)
        return KVPoll.Failed
      }
    }
    return s
  }

  /** send_kv_chunk(last_chunk=True): Transferring, KV frames to every destination, Success on the decode's ACK. */
  private send(room: string, tokens: number): void {
    if (this.status.get(room) === KVPoll.Failed) return
    const infos = this.infos.get(room) ?? []
    if (infos.length === 0) { this.fail(room, 'no destination info'); return }
    this.update(room, KVPoll.Transferring)
    const bytes = Math.ceil((this.cfg.timing.kvBytesPerToken * tokens) / this.cfg.prefillTp)
    for (const info of infos) {
      if (info.pages === 0) continue // a dummy decode rank gets no KV
      const agent = this.agents.get(info.agentName)
      if (!agent) { this.fail(room, `unknown decode agent ${info.agentName}`); return }
      const conn = this.connect(agent)
      conn.waiting.add(room)
      const big = BigInt(room)
      const write = () => { for (const frame of kvFrames(big, this.tpRank, bytes)) conn.socket.write(frame) }
      if (this.stallKv) this.held.push(write)
      else write()
    }
  }

  private fail(room: string, why: string): void {
    this.log.warn(`KV transfer failed for room=${room}: ${why}`)
    this.update(room, KVPoll.Failed)
  }

  private connect(agent: DecodeAgent): DataConn {
    const key = `${agent.dataHost}:${agent.dataPort}`
    const existing = this.conns.get(key)
    if (existing) return existing
    const socket = net.createConnection({host: agent.dataHost, port: agent.dataPort})
    socket.setNoDelay(true)
    const conn: DataConn = {socket, waiting: new Set()}
    const reader = new FrameReader((h) => {
      if (h.type !== FrameType.ack) return
      const room = h.room.toString()
      conn.waiting.delete(room)
      if (this.status.has(room)) this.update(room, KVPoll.Success)
    })
    socket.on('data', (d) => reader.push(d))
    const drop = (why: string) => {
      if (this.conns.get(key) === conn) this.conns.delete(key)
      for (const room of conn.waiting) if (this.status.has(room)) this.fail(room, `data connection to ${key} ${why}`)
      conn.waiting.clear()
    }
    socket.on('error', (err) => drop(`failed: ${err.message}`))
    socket.on('close', () => drop('closed'))
    this.conns.set(key, conn)
    return conn
  }

  close(): void {
    for (const c of this.conns.values()) c.socket.destroy()
    this.conns.clear()
  }
}
