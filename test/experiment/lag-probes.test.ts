import {createServer, type Server, type ServerResponse} from 'node:http'
import type {AddressInfo} from 'node:net'

import {afterEach, describe, expect, it} from 'vitest'

import {SglangClient} from '../../src/engines/sglang/deployment/sglang-client.js'
import {measureLags} from '../../src/experiment/lag-probes.js'

/**
 * A scripted prefill on loopback with known lags: a request enters its bootstrap queue entryMs after it arrives, an
 * abort takes effect entryMs after it arrives, and the answer leaves answerMs after the release. /v1/loads counts the
 * queue live (or has no disagg section).
 */
function fakePrefill(o: {entryMs: number; answerMs: number; disagg?: boolean}): Promise<{url: string; server: Server}> {
  const queued = new Map<string, ServerResponse>()
  const server = createServer((req, res) => {
    let body = ''
    req.on('data', (c: Buffer) => {
      body += c.toString()
    })
    req.on('end', () => {
      const path = (req.url ?? '/').split('?')[0]
      if (path === '/generate') {
        const rid = (JSON.parse(body) as {rid: string}).rid
        setTimeout(() => queued.set(rid, res), o.entryMs)
        return
      }
      if (path === '/abort_request') {
        const rid = (JSON.parse(body) as {rid: string}).rid
        setTimeout(() => {
          const held = queued.get(rid)
          queued.delete(rid)
          if (held)
            setTimeout(
              () =>
                held
                  .writeHead(500, {'content-type': 'application/json'})
                  .end('{"error":{"message":"aborted","code":500}}'),
              o.answerMs,
            )
        }, o.entryMs)
        return res.writeHead(200).end()
      }
      if (path === '/v1/loads') {
        const load =
          o.disagg === false ? {dp_rank: 0} : {dp_rank: 0, disagg: {prefill_bootstrap_queue_reqs: queued.size}}
        return res.writeHead(200, {'content-type': 'application/json'}).end(JSON.stringify({loads: [load]}))
      }
      res.writeHead(404).end()
    })
  })
  return new Promise(resolve =>
    server.listen(0, '127.0.0.1', () =>
      resolve({url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, server}),
    ),
  )
}

const servers: Server[] = []
afterEach(async () => {
  for (const s of servers.splice(0)) {
    s.closeAllConnections()
    await new Promise(r => s.close(r))
  }
})

const OPTS = {
  count: 6,
  burst: 1,
  gapMs: 10,
  holdLimitMs: 3000,
  answerWaitMs: 3000,
  text: 'x',
  bootstrap: {host: '127.0.0.1', port: 8998},
}

describe('lag probes (calibration: entry and answer lag on held requests)', {timeout: 20_000}, () => {
  it(
    'measures entry lag from the live queue count and answer lag from the aborts, each near what the ' + 'server does',
    async () => {
      const f = await fakePrefill({entryMs: 80, answerMs: 150})
      servers.push(f.server)
      const lags = await measureLags(new SglangClient(f.url, {service: 'prefill'}), OPTS)
      expect(lags).toMatchObject({concurrency: 6, samples: 6, notes: []})
      // Upper bounds by construction (a snapshot read over HTTP), so at least the true lags; loopback keeps them close.
      expect(lags.entry!.maxMs).toBeGreaterThanOrEqual(79)
      expect(lags.entry!.p50Ms).toBeLessThan(80 + 400)
      expect(lags.answer.includesEntry).toBe(false)
      expect(lags.answer.p50Ms).toBeGreaterThan(150 - 80)
      expect(lags.answer.p50Ms).toBeLessThan(150 + 400)
      // What ε allows covers entry + answer.
      expect(lags.entry!.maxMs + lags.answer.maxMs).toBeGreaterThanOrEqual(80 + 150 - 1)
    },
  )

  it('without a disagg section: entry not separable, the answer lag includes it, and says so', async () => {
    const f = await fakePrefill({entryMs: 50, answerMs: 100, disagg: false})
    servers.push(f.server)
    const lags = await measureLags(new SglangClient(f.url, {service: 'prefill'}), {...OPTS, count: 3})
    expect(lags.entry).toBeUndefined()
    expect(lags.answer.includesEntry).toBe(true)
    expect(lags.answer.p50Ms).toBeGreaterThanOrEqual(50 + 100 - 1)
    expect(lags.notes.join(' ')).toMatch(/no disagg section/)
  })
})
