import * as net from 'node:net'

import type {Role} from '../sim-config.js'
import type {FatalMsg, PolledMsg, ReadyMsg, StepMsg} from './protocol.js'

/**
 * The twin's stand-in for the links between the nodes of one instance (NCCL/gloo over the dist-init-addr): node 0
 * listens there, every other node's server connects and relays its ranks' messages. Newline-delimited JSON over TCP.
 * The relay never answers for a rank: a stopped rank on a follower blocks node 0's all-reduce as a local one does.
 */
export type FollowerMsg =
  | {t: 'hello'; role: Role; nnodes: number; nodeRank: number; tpRanks: number[]}
  | ReadyMsg
  | (PolledMsg & {tpRank: number})
  | FatalMsg
export type LeaderMsg = {t: 'welcome'} | {t: 'reject'; message: string} | StepMsg

/** One connection, one JSON message per line. `onClose` fires once, with why the link ended. */
export class JsonLines<In, Out> {
  private buf = ''
  private why = 'connection closed by the peer'
  onMessage: (m: In) => void = () => undefined
  onClose: (why: string) => void = () => undefined

  constructor(readonly socket: net.Socket) {
    socket.setNoDelay(true)
    socket.setEncoding('utf8')
    socket.on('data', (chunk: string) => {
      this.buf += chunk
      for (let i = this.buf.indexOf('\n'); i >= 0; i = this.buf.indexOf('\n')) {
        const line = this.buf.slice(0, i)
        this.buf = this.buf.slice(i + 1)
        if (line === '') continue
        let m: In
        try {
          m = JSON.parse(line) as In
        } catch {
          this.close('unreadable message')
          return
        }
        this.onMessage(m)
      }
    })
    socket.on('error', err => {
      this.why = err.message
    })
    socket.on('close', () => this.onClose(this.why))
  }

  send(m: Out): void {
    if (!this.socket.destroyed) this.socket.write(JSON.stringify(m) + '\n')
  }

  close(why: string): void {
    this.why = why
    this.socket.destroy()
  }
}

/**
 * Connect to node 0 from this node's own address, retrying every 200 ms until the deadline (nodes start together;
 * node 0 may not listen yet). Each attempt ends by the deadline too: a peer that drops SYNs would otherwise hold one
 * for the kernel's whole connect timeout.
 */
export async function connectWithRetry(
  host: string,
  port: number,
  localAddress: string,
  deadline: number,
): Promise<net.Socket> {
  let last = 'no attempt'
  while (Date.now() < deadline) {
    try {
      return await new Promise<net.Socket>((resolve, reject) => {
        const s = net.connect({host, port, localAddress})
        const timer = setTimeout(
          () => {
            s.destroy()
            reject(new Error('connect timed out'))
          },
          Math.max(1, deadline - Date.now()),
        )
        s.once('connect', () => {
          clearTimeout(timer)
          s.off('error', reject)
          resolve(s)
        })
        s.once('error', err => {
          clearTimeout(timer)
          reject(err)
        })
      })
    } catch (err) {
      last = err instanceof Error ? err.message : String(err)
    }
    await new Promise(r => setTimeout(r, 200))
  }
  throw new Error(`could not reach node rank 0 at ${host}:${port} (--dist-init-addr): ${last}`)
}
