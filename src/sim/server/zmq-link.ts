import * as zmq from 'zeromq'

export const NIXL_GUARD = 'NixlMsgGuard'

/** A bound PULL socket on (host, random port), as SGLang's bind_to_random_port does. */
export async function bindPull(host: string): Promise<{sock: zmq.Pull; port: number}> {
  const sock = new zmq.Pull({linger: 0, receiveHighWaterMark: 100_000})
  await sock.bind(`tcp://${host}:*`)
  const port = Number(/:(\d+)$/.exec(sock.lastEndpoint ?? '')?.[1])
  if (!Number.isInteger(port) || port <= 0) throw new Error(`could not read the bound port from ${sock.lastEndpoint}`)
  return {sock, port}
}

/**
 * One PUSH socket to one prefill rank (LINGER 0). zeromq.js allows one pending send per socket, so sends are
 * chained; a dead peer's messages just queue (as libzmq does) until the socket is closed.
 */
export class PushLink {
  private readonly sock: zmq.Push
  private chain: Promise<void> = Promise.resolve()
  private closed = false

  constructor(readonly endpoint: string) {
    this.sock = new zmq.Push({linger: 0, sendHighWaterMark: 100_000})
    this.sock.connect(endpoint)
  }

  send(frames: Array<string | Buffer>): void {
    if (this.closed) return
    this.chain = this.chain.then(() => (this.closed ? undefined : this.sock.send(frames))).catch(() => undefined)
  }

  close(): void {
    if (this.closed) return
    this.closed = true
    try {
      this.sock.close()
    } catch {
      /* already closed */
    }
  }
}
