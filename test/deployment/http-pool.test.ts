import {createServer, type Server} from 'node:http'
import type {Socket} from 'node:net'

import {afterEach, describe, expect, it} from 'vitest'

import {httpRequest} from '../../src/deployment/http.js'
import {PdError} from '../../src/errors.js'

/**
 * pdchaos's GETs share keep-alive connections (a run polls several times a second; a connection per poll filled the
 * serving host's TCP table with TIME_WAIT); everything else gets a connection of its own. A pooled connection the
 * server dropped while idle costs one resend, never a failed probe.
 */

interface Counted {
  url: string
  connections: () => number
  close: () => Promise<void>
}

let open: Counted[] = []
afterEach(async () => {
  await Promise.all(open.map(s => s.close()))
  open = []
})

/** A loopback server that counts connections; `onRequest` gets the number of requests its socket carried so far. */
async function counted(onRequest: (n: number, socket: Socket) => 'answer' | 'drop'): Promise<Counted> {
  let connections = 0
  const perSocket = new WeakMap<Socket, number>()
  const server: Server = createServer((req, res) => {
    req.resume()
    req.on('end', () => {
      const n = (perSocket.get(req.socket) ?? 0) + 1
      perSocket.set(req.socket, n)
      if (onRequest(n, req.socket) === 'drop') return void req.socket.destroy()
      res.writeHead(200, {'content-type': 'text/plain'}).end(`request ${n} on this connection`)
    })
  })
  server.on('connection', () => {
    connections++
  })
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  const s: Counted = {
    url: `http://127.0.0.1:${(server.address() as {port: number}).port}`,
    connections: () => connections,
    close: () =>
      new Promise<void>(resolve => {
        server.closeAllConnections()
        server.close(() => resolve())
      }),
  }
  open.push(s)
  return s
}

describe('connections of pdchaos HTTP requests', () => {
  it('GETs in a row share one connection; each POST has its own', async () => {
    const s = await counted(() => 'answer')
    for (let i = 1; i <= 5; i++) {
      const res = await httpRequest({service: 'prefill', url: `${s.url}/v1/loads`, timeoutMs: 5000})
      expect(res.text).toBe(`request ${i} on this connection`)
    }
    expect(s.connections()).toBe(1)
    for (let i = 0; i < 3; i++) {
      const res = await httpRequest({
        service: 'prefill',
        url: `${s.url}/generate`,
        method: 'POST',
        body: '{}',
        timeoutMs: 5000,
      })
      expect(res.text).toBe('request 1 on this connection')
    }
    expect(s.connections()).toBe(4)
  })

  it('a pooled connection the server dropped is replaced and the GET answered', async () => {
    // The server drops every connection on its second request, as one closing an idle keep-alive socket just as a
    // request arrives on it does (or a server restarted between two polls).
    const s = await counted(n => (n >= 2 ? 'drop' : 'answer'))
    const first = await httpRequest({service: 'router', url: `${s.url}/liveness`, timeoutMs: 5000})
    expect(first.status).toBe(200)
    const second = await httpRequest({service: 'router', url: `${s.url}/liveness`, timeoutMs: 5000})
    expect(second.status).toBe(200)
    expect(second.text).toBe('request 1 on this connection')
    expect(s.connections()).toBe(2)
  })

  it('a GET dropped on a fresh connection fails as before, naming the service (no resend)', async () => {
    const s = await counted(() => 'drop')
    const error = await httpRequest({service: 'decode', url: `${s.url}/metrics`, timeoutMs: 5000}).catch(
      (e: unknown) => e,
    )
    expect(error).toBeInstanceOf(PdError)
    expect((error as PdError).exitCode).toBe(5)
    expect((error as PdError).message).toMatch(
      /^decode at http:\/\/127\.0\.0\.1:\d+\/metrics closed the connection before its answer was complete/,
    )
    expect(s.connections()).toBe(1)
  })

  it('a POST dropped mid-request is never sent again', async () => {
    const s = await counted(() => 'drop')
    await expect(
      httpRequest({
        service: 'prefill',
        url: `${s.url}/abort_request`,
        method: 'POST',
        body: '{"rid":"x"}',
        timeoutMs: 5000,
      }),
    ).rejects.toThrow(/closed the connection/)
    expect(s.connections()).toBe(1)
  })
})
