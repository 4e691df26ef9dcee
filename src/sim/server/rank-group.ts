import {spawn, type ChildProcess} from 'node:child_process'
import {rmSync} from 'node:fs'
import {entryArgv, sibling} from '../entry.js'
import {simPaths, type Role, type SimConfig} from '../sim-config.js'
import {gpuIndex, type FromRank, type PolledMsg, type RankOp, type ReadyMsg, type StepMsg} from './protocol.js'
import {KVPoll} from './kvpoll.js'
import type {Logger} from './log.js'

/** gloo's default collective timeout is 30 min: a stopped rank wedges the instance for that long. */
export const ALL_REDUCE_DEADLINE_MS = 1_800_000

/** Ranks allocate little and briefly: a small young generation keeps 8 of them lean in RSS. */
const RANK_NODE_FLAGS = ['--max-semi-space-size=1']

interface Rank {child: ChildProcess; tpRank: number; ready?: ReadyMsg}

/**
 * The TP ranks of one server, and the twin's all-reduce: one `step` to every rank, every answer awaited,
 * the MIN per room taken. Nothing is answered early: one silent rank blocks the whole step.
 */
export class RankGroup {
  private readonly ranks: Rank[] = []
  private seq = 0
  private readonly pending = new Map<number, {answers: Map<number, number[]>; resolve: (s: number[]) => void}>()
  private stopping = false
  onUnexpectedExit: (tpRank: number, code: number | null, signal: string | null) => void = () => undefined

  constructor(private readonly cfg: SimConfig, private readonly role: Role, private readonly stateDir: string, private readonly log: Logger) {}

  get size(): number { return this.role === 'prefill' ? this.cfg.prefillTp : this.cfg.decodeTp }
  get pids(): number[] { return this.ranks.map((r) => r.child.pid ?? 0) }
  get readies(): ReadyMsg[] { return this.ranks.map((r) => r.ready!).filter(Boolean) }

  /** Start every rank and wait until each has bound its sockets (and, on prefill, registered). */
  async start(deadlineMs: number): Promise<void> {
    const {command, args} = entryArgv(sibling(import.meta.url, 'rank-main'))
    // Absolute tsx (dev/test runs only), so the ranks do not depend on the server's cwd to find it.
    const i = args.indexOf('--import')
    if (i >= 0 && args[i + 1] === 'tsx') args[i + 1] = import.meta.resolve('tsx')
    const readies: Array<Promise<void>> = []
    for (let k = 0; k < this.size; k++) {
      const child = spawn(command, [...RANK_NODE_FLAGS, ...args, '--role', this.role, '--tp-rank', String(k), '--state-dir', this.stateDir], {
        stdio: ['ignore', 'inherit', 'inherit', 'ipc'], env: process.env,
      })
      const rank: Rank = {child, tpRank: k}
      this.ranks.push(rank)
      readies.push(new Promise<void>((resolve, reject) => {
        child.on('message', (m: FromRank) => {
          if (m.t === 'ready') { rank.ready = m; resolve() }
          else if (m.t === 'polled') this.onPolled(k, m)
          else if (m.t === 'fatal') reject(new Error(`TP${k}: ${m.message}`))
        })
        child.once('exit', (code, signal) => {
          reject(new Error(`TP${k} exited during startup (code ${code}, signal ${signal})`))
          if (!this.stopping) this.onUnexpectedExit(k, code, signal)
        })
      }))
    }
    let timer: NodeJS.Timeout | undefined
    const timeout = new Promise<never>((_, reject) => { timer = setTimeout(() => reject(new Error(`ranks not ready within ${deadlineMs} ms`)), deadlineMs) })
    try { await Promise.race([Promise.all(readies), timeout]) } finally { clearTimeout(timer) }
  }

  /** One all-reduce: ops applied on every rank, then every rank's poll of `rooms`; resolves with the MIN per room. */
  allReduce(ops: RankOp[], rooms: string[]): Promise<number[]> {
    const seq = ++this.seq
    const msg: StepMsg = {t: 'step', seq, ops, rooms}
    return new Promise<number[]>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(seq)
        reject(new Error(`all_reduce timed out after ${ALL_REDUCE_DEADLINE_MS / 1000}s`))
      }, ALL_REDUCE_DEADLINE_MS)
      this.pending.set(seq, {answers: new Map(), resolve: (s) => { clearTimeout(timer); resolve(s) }})
      for (const r of this.ranks) {
        try { r.child.send(msg) } catch { /* a dead rank is reported by its exit handler */ }
      }
    })
  }

  private onPolled(tpRank: number, m: PolledMsg): void {
    const p = this.pending.get(m.seq)
    if (!p) return
    p.answers.set(tpRank, m.states)
    if (p.answers.size < this.ranks.length) return
    this.pending.delete(m.seq)
    const n = m.states.length
    const out = new Array<number>(n).fill(KVPoll.Success)
    for (const states of p.answers.values()) for (let i = 0; i < n; i++) out[i] = Math.min(out[i]!, states[i] ?? KVPoll.Failed)
    p.resolve(out)
  }

  /** Stop every rank: disconnect IPC (they exit on it), SIGTERM, then SIGKILL after a short grace (a SIGSTOPped rank cannot act). */
  async stop(graceMs = 300): Promise<void> {
    this.stopping = true
    const alive = this.ranks.filter((r) => r.child.exitCode === null && r.child.signalCode === null)
    const exits = alive.map((r) => new Promise<void>((resolve) => r.child.once('exit', () => resolve())))
    for (const r of alive) {
      try { r.child.disconnect() } catch { /* already gone */ }
      r.child.kill('SIGTERM')
    }
    const timer = setTimeout(() => { for (const r of alive) { r.child.kill('SIGCONT'); r.child.kill('SIGKILL') } }, graceMs)
    await Promise.all(exits)
    clearTimeout(timer)
    for (let k = 0; k < this.size; k++) rmSync(simPaths(this.stateDir).gpu(gpuIndex(this.role, k, this.cfg.prefillTp)), {force: true})
  }
}
