import http from 'node:http'
import type {AddressInfo} from 'node:net'

import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {counterValue, readNixlCounters, sendPrefillOnly} from '../../../src/engines/vllm/client.js'

let server: http.Server
let base = ''
const seen: {body: Record<string, unknown>; xid: string | undefined}[] = []

beforeAll(async () => {
  server = http.createServer((req, res) => {
    let text = ''
    req.on('data', c => (text += c))
    req.on('end', () => {
      if (req.url === '/metrics') {
        res.end(
          '# HELP vllm:nixl_num_kv_expired_reqs_total Number of requests that had their KV expire.\n' +
            'vllm:nixl_num_kv_expired_reqs_total{engine="0",model_name="m"} 3.0\n' +
            'vllm:nixl_num_failed_transfers_total{engine="0",model_name="m"} 1.0\n',
        )
        return
      }
      const xid = req.headers['x-request-id'] as string | undefined
      seen.push({body: JSON.parse(text), xid})
      res.setHeader('content-type', 'application/json')
      res.end(
        JSON.stringify({
          id: `cmpl-${xid}-0`,
          kv_transfer_params: {do_remote_prefill: true, remote_request_id: `cmpl-${xid}-0`},
        }),
      )
    })
  })
  await new Promise<void>(ok => server.listen(0, '127.0.0.1', ok))
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
})
afterAll(() => new Promise<void>(ok => server.close(() => ok())))

describe('the vLLM prefill client', () => {
  it("sends a P-only request as vLLM's toy proxy does and returns P's kv_transfer_params with the grant's bounds", () => {
    return sendPrefillOnly({baseUrl: base, model: 'm', prompt: 'hello', timeoutMs: 5000, xRequestId: 'x1'}).then(g => {
      expect(seen.at(-1)!.xid).toBe('x1')
      expect(seen.at(-1)!.body).toMatchObject({
        max_tokens: 1,
        stream: false,
        kv_transfer_params: {do_remote_decode: true},
      })
      expect(g.requestId).toBe('cmpl-x1-0')
      expect(g.kvTransferParams.do_remote_prefill).toBe(true)
      expect(g.answeredMs).toBeGreaterThanOrEqual(g.sentMs)
    })
  })

  it('reads the NIXL counters with their _total suffix', async () => {
    const r = await readNixlCounters(base, 5000)
    expect(r.values).toEqual({'vllm:nixl_num_kv_expired_reqs': 3, 'vllm:nixl_num_failed_transfers': 1})
    expect(counterValue('vllm:nixl_num_kv_expired_reqs_created{a="1"} 1.7e9\n', 'vllm:nixl_num_kv_expired_reqs')).toBe(
      undefined,
    )
  })
})
