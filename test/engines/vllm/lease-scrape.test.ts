import http from 'node:http'
import type {AddressInfo} from 'node:net'

import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {readLeaseScrape} from '../../../src/engines/vllm/client.js'

let server: http.Server
let base = ''

beforeAll(async () => {
  server = http.createServer((_req, res) =>
    res.end(
      'vllm:nixl_num_kv_expired_reqs_total{engine="0",model_name="m"} 4.0\n' +
        'vllm:request_success_total{engine="0",finished_reason="length",model_name="m"} 5.0\n' +
        'vllm:request_success_total{engine="0",finished_reason="stop",model_name="m"} 2.0\n' +
        'vllm:request_success_created{engine="0",finished_reason="stop",model_name="m"} 1.7e9\n' +
        'vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.0\n',
    ),
  )
  await new Promise<void>(ok => server.listen(0, '127.0.0.1', ok))
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
})
afterAll(() => new Promise<void>(ok => server.close(() => ok())))

describe("a scrape of P's /metrics for the lease check", () => {
  it('reads the expiry counter, request_success summed over finished_reason, and the KV usage, with its bounds', async () => {
    const s = await readLeaseScrape(base, 5000)
    expect(s).toMatchObject({expired: 4, finished: 7, kvUsage: 0})
    expect(s.t).toBeGreaterThanOrEqual(s.fromT)
  })
})
