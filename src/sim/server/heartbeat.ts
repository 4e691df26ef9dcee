import type {DecodeScheduler} from './decode-scheduler.js'
import type {EnvSettings} from './settings.js'
import type {Logger} from './log.js'
import {httpCall, isOk} from './http-call.js'

interface Peer {
  misses: number
  instanceId?: string
  timer: NodeJS.Timeout
  busy: boolean
}

/**
 * Decode's liveness check of each prefill it talks to: GET bootstrap /health every interval (probe
 * timeout 2/3 s); after max-failure misses, node failure. It also compares the prefill's bootstrap
 * instance id (PR #36029) and treats a change as a failure at once — unless `stale-prefill-ports` is on.
 */
export class Heartbeat {
  private readonly peers = new Map<string, Peer>()

  constructor(
    private readonly sched: DecodeScheduler,
    private readonly env: EnvSettings,
    private readonly log: Logger,
    private readonly checkInstance: boolean,
  ) {}

  /** Start watching a prefill bootstrap address (idempotent), as the first request to it does. */
  watch(addr: string): void {
    if (this.peers.has(addr)) return
    const peer: Peer = {
      misses: 0,
      busy: false,
      timer: setInterval(() => {
        void this.probe(addr, peer)
      }, this.env.heartbeatIntervalS * 1000),
    }
    this.peers.set(addr, peer)
    if (this.checkInstance)
      void this.instance(addr).then(id => {
        if (id && peer.instanceId === undefined) peer.instanceId = id
      })
  }

  private async instance(addr: string): Promise<string | undefined> {
    try {
      const res = await httpCall(
        `http://${addr}/route?prefill_dp_rank=-1&prefill_cp_rank=-1&target_tp_rank=-1&target_pp_rank=-1`,
        {timeoutMs: 667},
      )
      if (!isOk(res.status)) return undefined
      const info = JSON.parse(res.text) as {bootstrap_instance_id?: string}
      return info.bootstrap_instance_id
    } catch {
      return undefined
    }
  }

  private async probe(addr: string, peer: Peer): Promise<void> {
    if (peer.busy) return
    peer.busy = true
    try {
      let ok = false
      try {
        ok = isOk((await httpCall(`http://${addr}/health`, {timeoutMs: 667})).status)
      } catch {
        ok = false
      }
      if (!ok) {
        peer.misses++
        this.log.warn(`Heartbeat to prefill bootstrap ${addr} failed (${peer.misses}/${this.env.heartbeatMaxFailure})`)
        if (peer.misses >= this.env.heartbeatMaxFailure) this.fail(addr, peer, `${peer.misses} heartbeat failures`)
        return
      }
      peer.misses = 0
      if (!this.checkInstance) return
      const id = await this.instance(addr)
      if (id === undefined) return
      if (peer.instanceId === undefined) peer.instanceId = id
      else if (peer.instanceId !== id)
        this.fail(addr, peer, `prefill bootstrap instance changed (${peer.instanceId} -> ${id})`)
    } finally {
      peer.busy = false
    }
  }

  private fail(addr: string, peer: Peer, why: string): void {
    clearInterval(peer.timer)
    this.peers.delete(addr)
    this.sched.nodeFailure(addr, why)
  }

  close(): void {
    for (const p of this.peers.values()) clearInterval(p.timer)
    this.peers.clear()
  }
}
