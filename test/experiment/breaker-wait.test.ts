import {createServer, type Server} from 'node:http'

import {afterAll, describe, expect, it} from 'vitest'

import {RouterClient} from '../../src/engines/sglang/deployment/router-client.js'
import {untilBreakersClose} from '../../src/experiment/session.js'

/**
 * The wait for the gateway's circuit breakers before the canaries. A scrape that fails says nothing about the
 * breaker: taking it for "closed" sent canaries at an open breaker, whose 503s failed a healthy twin (ci10).
 */
const servers: Server[] = []
afterAll(async () => {
  await Promise.all(servers.map(s => new Promise<void>(resolve => s.close(() => resolve()))))
})

/** A gateway's /metrics answering, in turn, each of `script`: 'open', 'closed', or 'fail' (a 500). */
async function gateway(
  script: Array<'open' | 'closed' | 'fail'>,
): Promise<{router: RouterClient; scrapes: () => number}> {
  let n = 0
  const server = createServer((_req, res) => {
    const step = script[Math.min(n++, script.length - 1)]
    if (step === 'fail') {
      res.writeHead(500).end('busy')
      return
    }
    res
      .writeHead(200, {'content-type': 'text/plain'})
      .end(`smg_worker_cb_state{worker="http://p:1"} ${step === 'open' ? 1 : 0}\n`)
  })
  servers.push(server)
  await new Promise<void>(resolve => server.listen(0, '127.0.0.1', resolve))
  const {port} = server.address() as {port: number}
  return {router: new RouterClient(`http://127.0.0.1:${port}`, {timeoutMs: 1000}), scrapes: () => n}
}

// Side by side: each test waits out whole seconds of the gateway's pace.
describe.concurrent('waiting for the gateway breakers to close', () => {
  it('a failed scrape while a breaker is open does not count as closed', async () => {
    const g = await gateway(['open', 'fail', 'fail', 'closed'])
    const r = await untilBreakersClose(g.router)
    expect(r).toEqual({open: ['http://p:1'], closed: true})
    expect(g.scrapes()).toBe(4)
  }, 20_000)

  it('a failed first scrape is read again before the breaker counts as unknown', async () => {
    const g = await gateway(['fail', 'open', 'closed'])
    const opened: string[][] = []
    const r = await untilBreakersClose(g.router, {onOpen: w => opened.push(w)})
    expect(opened).toEqual([['http://p:1']])
    expect(r.closed).toBe(true)
    expect(g.scrapes()).toBe(3)
  }, 20_000)

  it('a gateway whose metrics never answer is not waited for beyond three reads', async () => {
    const g = await gateway(['fail'])
    expect(await untilBreakersClose(g.router)).toEqual({open: [], closed: true})
    expect(g.scrapes()).toBe(3)
  }, 20_000)
})
