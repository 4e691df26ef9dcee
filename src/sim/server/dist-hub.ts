import * as net from 'node:net'

import type {DistConfig, Role} from '../sim-config.js'
import {JsonLines, type FollowerMsg, type LeaderMsg} from './dist-link.js'
import type {Logger} from './log.js'
import type {PolledMsg, ReadyMsg, StepMsg} from './protocol.js'

/** What node 0's rank group hears from the other nodes' ranks. */
export interface HubEvents {
  ready: (m: ReadyMsg) => void
  polled: (tpRank: number, m: PolledMsg) => void
  /** A remote rank failed, or a node's link ended: the instance cannot go on (as a NCCL/gloo failure ends it). */
  lost: (why: string) => void
}

/**
 * Node 0's end of the links to the other nodes of one instance: listens on the dist-init-addr, admits each node rank
 * once (its TP ranks must be the ones SGLang would give it), fans every step out to them and passes their ranks'
 * answers back one by one.
 */
export class DistHub {
  private server: net.Server | undefined
  private readonly links = new Map<number, JsonLines<FollowerMsg, LeaderMsg>>()
  private closing = false

  constructor(
    private readonly dist: DistConfig,
    private readonly role: Role,
    private readonly tpPerNode: number,
    private readonly log: Logger,
    private readonly on: HubEvents,
  ) {}

  async listen(host: string, port: number): Promise<void> {
    this.server = net.createServer(s => this.admit(new JsonLines<FollowerMsg, LeaderMsg>(s)))
    await new Promise<void>((resolve, reject) => {
      this.server!.once('error', reject)
      this.server!.listen(port, host, () => {
        this.server!.off('error', reject)
        resolve()
      })
    })
    this.log.info(`Waiting for ${this.dist.nnodes - 1} more node(s) at dist_init_addr=${this.dist.distInitAddr}`)
  }

  private admit(link: JsonLines<FollowerMsg, LeaderMsg>): void {
    let nodeRank: number | undefined
    link.onMessage = m => {
      if (nodeRank === undefined) {
        const why = m.t !== 'hello' ? 'expected hello' : this.refusal(m)
        if (why) {
          link.send({t: 'reject', message: why})
          this.log.warn(`Refused a node at ${link.socket.remoteAddress}: ${why}`)
          link.close(why)
          return
        }
        nodeRank = (m as Extract<FollowerMsg, {t: 'hello'}>).nodeRank
        this.links.set(nodeRank, link)
        link.send({t: 'welcome'})
        this.log.info(
          `Node rank ${nodeRank} joined from ${link.socket.remoteAddress} ` +
            `(TP${nodeRank * this.tpPerNode}..TP${(nodeRank + 1) * this.tpPerNode - 1})`,
        )
        return
      }
      if (m.t === 'ready') this.on.ready(m)
      else if (m.t === 'polled') this.on.polled(m.tpRank, m)
      else if (m.t === 'fatal') this.on.lost(`TP${m.tpRank} on node rank ${nodeRank} failed: ${m.message}`)
    }
    link.onClose = why => {
      if (nodeRank === undefined || this.links.get(nodeRank) !== link) return
      this.links.delete(nodeRank)
      if (!this.closing)
        this.on.lost(`lost the link to node rank ${nodeRank} (${link.socket.remoteAddress ?? '?'}): ${why}`)
    }
  }

  /** Why a hello is refused: another instance's node, a rank out of range or already here, the wrong TP ranks. */
  private refusal(h: Extract<FollowerMsg, {t: 'hello'}>): string | undefined {
    if (h.role !== this.role) return `this is a ${this.role} instance, the node runs ${h.role}`
    if (h.nnodes !== this.dist.nnodes) return `--nnodes ${h.nnodes} differs from node 0's ${this.dist.nnodes}`
    if (!(h.nodeRank >= 1 && h.nodeRank < this.dist.nnodes)) return `node rank ${h.nodeRank} is out of range`
    if (this.links.has(h.nodeRank)) return `node rank ${h.nodeRank} has already joined`
    const want = Array.from({length: this.tpPerNode}, (_, i) => h.nodeRank * this.tpPerNode + i)
    if (JSON.stringify(h.tpRanks) !== JSON.stringify(want))
      return (
        `node rank ${h.nodeRank} must run TP${want[0]}..TP${want.at(-1)}, it runs ${h.tpRanks.join(',')} (a ` +
        `different --${this.role}-tp?)`
      )
    return undefined
  }

  step(m: StepMsg): void {
    for (const link of this.links.values()) link.send(m)
  }

  close(): void {
    this.closing = true
    for (const link of this.links.values()) link.close('node 0 shutting down')
    this.server?.close()
  }
}
