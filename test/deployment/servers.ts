import {createServer as createHttpServer, type IncomingMessage, type ServerResponse} from 'node:http'
import {createServer as createTcpServer, type Socket} from 'node:net'

/**
 * Real servers on 127.0.0.1 for the client tests: well-behaved, hanging, garbage-speaking. Each records what it
 * received and closes every socket it accepted, so a test leaves nothing behind.
 */

export interface Received {
  method: string
  url: string
  body: string
}

export interface TestServer {
  url: string
  port: number
  received: Received[]
  close(): Promise<void>
}

type Handler = (req: IncomingMessage & {body: string}, res: ServerResponse) => void

export async function startHttp(handler: Handler): Promise<TestServer> {
  const received: Received[] = []
  const server = createHttpServer((req, res) => {
    const chunks: Buffer[] = []
    req.on('data', (c: Buffer) => chunks.push(c))
    req.on('end', () => {
      const body = Buffer.concat(chunks).toString('utf8')
      received.push({method: req.method ?? '', url: req.url ?? '', body})
      handler(Object.assign(req, {body}), res)
    })
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  const port = (server.address() as {port: number}).port
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    received,
    close: () =>
      new Promise<void>(resolve => {
        server.closeAllConnections()
        server.close(() => resolve())
      }),
  }
}

/** A TCP server that answers every connection with `reply` (not HTTP) and closes. */
export async function startRawTcp(reply: string): Promise<TestServer> {
  const sockets = new Set<Socket>()
  const server = createTcpServer(socket => {
    sockets.add(socket)
    socket.on('close', () => sockets.delete(socket))
    socket.on('error', () => {})
    socket.once('data', () => socket.end(reply))
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  const port = (server.address() as {port: number}).port
  return {
    url: `http://127.0.0.1:${port}`,
    port,
    received: [],
    close: () =>
      new Promise<void>(resolve => {
        for (const s of sockets) s.destroy()
        server.close(() => resolve())
      }),
  }
}

/** A loopback port with nothing listening: bound, then released. */
export async function closedPort(): Promise<number> {
  const server = createTcpServer()
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  const port = (server.address() as {port: number}).port
  await new Promise<void>(resolve => server.close(() => resolve()))
  return port
}

export function sendJson(res: ServerResponse, status: number, value: unknown): void {
  res.writeHead(status, {'content-type': 'application/json'})
  res.end(JSON.stringify(value))
}
