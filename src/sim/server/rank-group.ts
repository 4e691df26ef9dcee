import {spawn, type ChildProcess} from 'node:child_process'
import {rmSync} from 'node:fs'
import {entryArgv, sibling} from '../entry.js'
import {distEndpoint, nodeTpRanks, simPaths, type Role, type SimConfig} from '../sim-config.js'
import {DistHub} from './dist-hub.js'
import {
  gpuIndex,
  type FromRank,
  type PolledMsg,
  type RankOp,
  type RdmaWriteMsg,
  type ReadyMsg,
  type StepMsg,
  type ToRank,
} from './protocol.js'
import {KVPoll} from './kvpoll.js'
import {makeLogger, type Logger} from './log.js'
import {RailNicEngine} from './rail-nic.js'
import {physicalGpu, serverLayout} from './layout.js'
import {railOfGpu, rcGiveUpS, ucxRcSettings} from './rail-plan.js'

/** gloo's default collective timeout is 30 min: a stopped rank wedges the instance for that long. */
export const ALL_REDUCE_DEADLINE_MS = 1_800_000

/** Ranks allocate little and briefly: a small young generation keeps 8 of them lean in RSS. */
const RANK_NODE_FLAGS = ['--max-semi-space-size=1']

interface Rank {
  child: ChildProcess
  tpRank: number
  ready?: ReadyMsg
  nic?: RailNicEngine
}

/** One all-reduce's result: the MIN KVPoll per room, and why a room failed (from the first rank that says). */
export interface AllReduced {
  states: number[]
  reasons: Map<number, {tpRank: number; text: string}>
}

/**
 * The TP ranks of one server, and the twin's all-reduce: one `step` to every rank, every answer awaited,
 * the MIN per room taken. Nothing is answered early: one silent rank blocks the whole step.
 *
 * Over several nodes (`--nnodes`), this node's ranks are IPC children as always; on node 0 the other nodes' ranks
 * join over TCP (dist-hub.ts) and count in every all-reduce; on a follower the group only relays (`relay`).
 */
export class RankGroup {
  private readonly ranks: Rank[] = []
  /** The global TP ranks this node runs (all of them on one node). */
  readonly tpRanks: number[]
  private seq = 0
  private readonly pending = new Map<number, {answers: Map<number, PolledMsg>; resolve: (s: AllReduced) => void}>()
  private stopping = false
  private hub: DistHub | undefined
  private readonly remoteReady = new Map<number, ReadyMsg>()
  private remoteWait: {resolve: () => void; reject: (e: Error) => void} | undefined
  onUnexpectedExit: (tpRank: number, code: number | null, signal: string | null) => void = () => undefined
  /** Node 0: a remote rank or a node's link is gone (startup fails instead, while it runs). */
  onRemoteLost: (why: string) => void = () => undefined
  /** A local rank had a change between steps (protocol.ts ChangedMsg): the scheduler's next iteration is due now. */
  onChanged: () => void = () => undefined
  /** A follower: each local rank's answer goes to node 0 as it is, never aggregated here. */
  relay: ((tpRank: number, m: PolledMsg) => void) | undefined

  constructor(
    private readonly cfg: SimConfig,
    private readonly role: Role,
    private readonly stateDir: string,
    private readonly log: Logger,
  ) {
    this.tpRanks = nodeTpRanks(cfg, role)
  }

  get size(): number {
    return this.role === 'prefill' ? this.cfg.prefillTp : this.cfg.decodeTp
  }
  get pids(): number[] {
    return this.ranks.map(r => r.child.pid ?? 0)
  }
  get readies(): ReadyMsg[] {
    return this.ranks.map(r => r.ready!).filter(Boolean)
  }

  /** Node 0 of a multi-node instance: listen on the dist-init-addr for the other nodes before starting. */
  private async listenForNodes(): Promise<Promise<void> | undefined> {
    const d = this.cfg.dist
    if (!d || d.role !== this.role || d.nodeRank !== 0) return undefined
    const remote = this.size - this.tpRanks.length
    const all = new Promise<void>((resolve, reject) => {
      this.remoteWait = {resolve, reject}
    })
    all.catch(() => undefined) // awaited once the local ranks are up; a node lost before that must not crash us first
    this.hub = new DistHub(d, this.role, this.tpRanks.length, this.log, {
      ready: m => {
        this.remoteReady.set(m.tpRank, m)
        if (this.remoteReady.size >= remote) this.remoteWait?.resolve()
      },
      polled: (k, m) => this.onPolled(k, m),
      lost: why => {
        if (this.stopping) return
        if (this.remoteReady.size < remote) this.remoteWait?.reject(new Error(why))
        else this.onRemoteLost(why)
      },
    })
    const {host, port} = distEndpoint(d)
    await this.hub.listen(host, port)
    return all
  }

  /**
   * Start every rank and wait until each has bound its sockets (and, on prefill, registered); node 0 waits for every
   * node's.
   */
  async start(deadlineMs: number): Promise<void> {
    const remoteAll = await this.listenForNodes()
    const {command, args} = entryArgv(sibling(import.meta.url, 'rank-main'))
    // Absolute tsx (dev/test runs only), so the ranks do not depend on the server's cwd to find it.
    const i = args.indexOf('--import')
    if (i >= 0 && args[i + 1] === 'tsx') args[i + 1] = import.meta.resolve('tsx')
    const readies: Array<Promise<void>> = []
    const nics = await this.bindNics()
    for (const [i, k] of this.tpRanks.entries()) {
      const child = spawn(
        command,
        [...RANK_NODE_FLAGS, ...args, '--role', this.role, '--tp-rank', String(k), '--state-dir', this.stateDir],
        {
          stdio: ['ignore', 'inherit', 'inherit', 'ipc'],
          env: process.env,
        },
      )
      const rank: Rank = {child, tpRank: k, nic: nics[i]}
      this.ranks.push(rank)
      if (rank.nic)
        rank.nic.onNotifyRank = (room, prefillRank) => this.toRank(rank, {t: 'rdma_notif', room, prefillRank})
      readies.push(
        new Promise<void>((resolve, reject) => {
          child.on('message', (m: FromRank) => {
            if (m.t === 'ready') {
              rank.ready = m
              resolve()
            } else if (m.t === 'polled') this.onPolled(k, m)
            // On a follower node 0 steps on its own back-off: a change is not relayed (dist-link.ts carries steps and
            // answers only).
            else if (m.t === 'changed') {
              if (!this.relay) this.onChanged()
            } else if (m.t === 'rdma_write') this.rdmaWrite(rank, m)
            else if (m.t === 'fatal') reject(new Error(`TP${k}: ${m.message}`))
          })
          child.once('exit', (code, signal) => {
            reject(new Error(`TP${k} exited during startup (code ${code}, signal ${signal})`))
            if (!this.stopping) this.onUnexpectedExit(k, code, signal)
          })
        }),
      )
    }
    let timer: NodeJS.Timeout | undefined
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`ranks not ready within ${deadlineMs} ms`)), deadlineMs)
    })
    try {
      await Promise.race([Promise.all(readies), timeout])
      if (remoteAll) {
        this.log.info(
          `All ${this.tpRanks.length} local ranks ready; waiting for the ranks of the ` +
            `other ${this.cfg.dist!.nnodes - 1} node(s)`,
        )
        await Promise.race([remoteAll, timeout])
      }
    } finally {
      clearTimeout(timer)
    }
  }

  /**
   * With --rail-nics: the NIC of each rank's GPU, bound to its rail address (UDP 4791) before the ranks start. It
   * runs here, in the server process, so that it keeps acknowledging while its rank is stopped, as a NIC does.
   */
  private async bindNics(): Promise<Array<RailNicEngine | undefined>> {
    const out: Array<RailNicEngine | undefined> = []
    if (!this.cfg.rails) return out
    const rc = ucxRcSettings(process.env)
    for (const w of rc.warnings) this.log.warn(`UCX  WARN  ${w}`)
    this.log.info(
      `UCX RC (${rc.transport}): timeout ${rc.timeoutText} (${rc.timeoutFrom}) -> QP local ACK ` +
        `timeout ${(rc.qpTimeoutS * 1000).toFixed(2)} ms, ` +
        `retry count ${rc.retryCount} (${rc.retryCountFrom}): a rail stalled longer ` +
        `than ${(rcGiveUpS(rc) * 1000).toFixed(0)} ms fails the endpoint`,
    )
    for (const k of this.tpRanks) {
      const nic = railOfGpu(this.cfg.rails, gpuIndex(this.role, k, this.cfg.prefillTp))
      if (!nic) {
        out.push(undefined)
        continue
      }
      const engine = new RailNicEngine(nic, rc, makeLogger(`TP${k}`))
      await engine.bind().catch((err: unknown) => {
        throw new Error(
          `cannot bind ${nic.name}'s address ${nic.addr} (UDP 4791) for ` +
            `TP${k}: ${err instanceof Error ? err.message : String(err)} (was the twin started with sim up ` +
            `--rail-nics?)`,
        )
      })
      out.push(engine)
    }
    return out
  }

  private toRank(rank: Rank, m: ToRank): void {
    try {
      rank.child.send(m)
    } catch {
      /* a dead rank is reported by its exit handler */
    }
  }

  private rdmaWrite(rank: Rank, m: RdmaWriteMsg): void {
    if (!rank.nic) {
      this.toRank(rank, {t: 'rdma_cqe', wrId: m.wrId, error: `no rail NIC for TP${rank.tpRank}`})
      return
    }
    rank.nic.post({dest: m.dest, room: m.room, prefillRank: rank.tpRank, bytes: m.bytes, notify: m.notify}).then(
      () => this.toRank(rank, {t: 'rdma_cqe', wrId: m.wrId}),
      (err: unknown) =>
        this.toRank(rank, {t: 'rdma_cqe', wrId: m.wrId, error: err instanceof Error ? err.message : String(err)}),
    )
  }

  /** One all-reduce: ops applied on every rank, then every rank's poll of `rooms`; resolves with the MIN per room. */
  allReduce(ops: RankOp[], rooms: string[]): Promise<AllReduced> {
    const seq = ++this.seq
    const msg: StepMsg = {t: 'step', seq, ops, rooms}
    return new Promise<AllReduced>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(seq)
        reject(new Error(`all_reduce timed out after ${ALL_REDUCE_DEADLINE_MS / 1000}s`))
      }, ALL_REDUCE_DEADLINE_MS)
      this.pending.set(seq, {
        answers: new Map(),
        resolve: s => {
          clearTimeout(timer)
          resolve(s)
        },
      })
      this.sendStep(msg)
    })
  }

  /** One step to every local rank (and, on node 0, to every other node); a follower relays node 0's steps with this. */
  sendStep(msg: StepMsg): void {
    for (const r of this.ranks) {
      try {
        r.child.send(msg)
      } catch {
        /* a dead rank is reported by its exit handler */
      }
    }
    this.hub?.step(msg)
  }

  private onPolled(tpRank: number, m: PolledMsg): void {
    if (this.relay) {
      this.relay(tpRank, m)
      return
    }
    const p = this.pending.get(m.seq)
    if (!p) return
    p.answers.set(tpRank, m)
    if (p.answers.size < this.size) return
    this.pending.delete(m.seq)
    const n = m.states.length
    const out = new Array<number>(n).fill(KVPoll.Success)
    const reasons: AllReduced['reasons'] = new Map()
    for (const [k, a] of [...p.answers].sort((x, y) => x[0] - y[0])) {
      for (let i = 0; i < n; i++) out[i] = Math.min(out[i]!, a.states[i] ?? KVPoll.Failed)
      for (const [i, text] of a.reasons ?? []) if (!reasons.has(i)) reasons.set(i, {tpRank: k, text})
    }
    p.resolve({states: out, reasons})
  }

  /**
   * Stop every rank: disconnect IPC (they exit on it), SIGTERM, then SIGKILL after a short grace (a SIGSTOPped rank
   * cannot act).
   */
  async stop(graceMs = 300): Promise<void> {
    this.stopping = true
    this.hub?.close()
    for (const r of this.ranks) r.nic?.close()
    const alive = this.ranks.filter(r => r.child.exitCode === null && r.child.signalCode === null)
    const exits = alive.map(r => new Promise<void>(resolve => r.child.once('exit', () => resolve())))
    for (const r of alive) {
      try {
        r.child.disconnect()
      } catch {
        /* already gone */
      }
      r.child.kill('SIGTERM')
    }
    const timer = setTimeout(() => {
      for (const r of alive) {
        r.child.kill('SIGCONT')
        r.child.kill('SIGKILL')
      }
    }, graceMs)
    await Promise.all(exits)
    clearTimeout(timer)
    for (const k of this.tpRanks)
      rmSync(simPaths(this.stateDir).gpu(physicalGpu(serverLayout(this.cfg, this.role), k)), {force: true})
  }
}
