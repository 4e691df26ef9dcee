import http from 'node:http'
import type {AddressInfo} from 'node:net'

import {afterEach, describe, expect, it} from 'vitest'

import {VllmDeploymentSchema} from '../../src/engines/vllm/deployment-file.js'
import type {Host, RunOptions} from '../../src/hosts/host.js'
import {vllmCoRestart, vllmRestartPlan, vllmTargets} from '../../src/restart/vllm-co-restart.js'

// vLLM's co-restart against one loopback server standing in for P, D and the proxy: which paths the gates probe,
// the order the restart commands run in, and how a canary through the proxy is judged.

interface Seen {
  method: string
  url: string
  body: string
}

let server: http.Server | undefined
afterEach(() => new Promise<void>(r => (server ? server.close(() => r()) : r())))

/** One server for all three services; `completion` answers POST /v1/completions. */
async function fake(completion: (res: http.ServerResponse) => void, healthy = () => true) {
  const seen: Seen[] = []
  server = http.createServer((req, res) => {
    let body = ''
    req.on('data', c => (body += c))
    req.on('end', () => {
      seen.push({method: req.method ?? '', url: req.url ?? '', body})
      if (req.url === '/v1/completions') return completion(res)
      if (req.url === '/v1/models') return void res.end(JSON.stringify({data: [{id: 'm-1'}]}))
      if ((req.url === '/health' || req.url === '/healthcheck') && healthy()) return void res.end('{}')
      res.writeHead(404).end()
    })
  })
  await new Promise<void>(r => server!.listen(0, '127.0.0.1', r))
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`
  const svc = (name: string, healthPath: string) => ({url, healthPath, restart: [`restart-${name}`]})
  const d = VllmDeploymentSchema.parse({
    engine: 'vllm',
    host: {kind: 'local'},
    services: {
      prefill: svc('prefill', '/health'),
      decode: svc('decode', '/health'),
      router: svc('router', '/healthcheck'),
    },
  })
  return {seen, d}
}

function scriptedHost(codeOf: (argv: string[]) => number = () => 0): Host & {ran: string[][]} {
  const ran: string[][] = []
  return {
    ran,
    run: async (argv: string[], _opts: RunOptions) => {
      ran.push(argv)
      const code = codeOf(argv)
      return {code, stdout: '', stderr: '', durationMs: 1}
    },
    upload: async () => undefined,
    startDetached: async () => ({pid: 1}),
    describe: () => 'scripted',
    close: async () => undefined,
  }
}

const OPTS = {healthTimeoutS: 2, commandTimeoutS: 2, canaries: 2, settleS: 0, canaryTimeoutS: 5}
const okCompletion = (res: http.ServerResponse) => void res.end(JSON.stringify({choices: [{text: 'x'}]}))

describe("vLLM's co-restart", () => {
  it('restarts prefill, decode, then the proxy, gating servers on /health and the proxy on /healthcheck', async () => {
    const {seen, d} = await fake(okCompletion)
    const host = scriptedHost()
    const r = await vllmCoRestart(d, host, OPTS)
    expect(host.ran).toEqual([['restart-prefill'], ['restart-decode'], ['restart-router']])
    const gets = seen.filter(s => s.method === 'GET').map(s => s.url)
    expect(gets.slice(0, 3)).toEqual(['/health', '/health', '/healthcheck'])
    expect(r.steps.map(s => s.service)).toEqual(['prefill', 'decode', 'router'])
    expect(r.verdicts.map(v => `${v.verdict} ${v.subject}`)).toEqual([
      'pass prefill',
      'pass decode',
      'pass router',
      'pass canaries',
    ])
  })

  it('sends each canary as POST /v1/completions with the served model through the proxy', async () => {
    const {seen, d} = await fake(okCompletion)
    const r = await vllmCoRestart(d, scriptedHost(), OPTS)
    const posts = seen.filter(s => s.method === 'POST')
    expect(posts).toHaveLength(2)
    for (const p of posts) {
      expect(p.url).toBe('/v1/completions')
      expect(JSON.parse(p.body)).toMatchObject({model: 'm-1', stream: false})
    }
    expect(r.canaries.map(c => c.status)).toEqual([200, 200])
  })

  it('fails the canaries on a 500 and on a 200 that carries no completion', async () => {
    let n = 0
    const {d} = await fake(res => (n++ === 0 ? void res.writeHead(500).end('boom') : void res.end('{"detail":1}')))
    const r = await vllmCoRestart(d, scriptedHost(), OPTS)
    expect(r.canaries.map(c => c.status).sort()).toEqual([500, null].sort())
    const v = r.verdicts.find(x => x.subject === 'canaries')!
    expect(v.verdict).toBe('fail')
    expect(v.summary).toMatch(/2 of 2 canary requests failed/)
  })

  it('stops at a failed restart command: later services are not restarted and no canary is sent', async () => {
    const {seen, d} = await fake(okCompletion)
    const host = scriptedHost(argv => (argv[0] === 'restart-decode' ? 3 : 0))
    const r = await vllmCoRestart(d, host, OPTS)
    expect(host.ran).toEqual([['restart-prefill'], ['restart-decode']])
    expect(r.verdicts.at(-1)).toMatchObject({verdict: 'fail', subject: 'decode'})
    expect(seen.some(s => s.method === 'POST')).toBe(false)
  })

  it('fails a gate that never passes within the health timeout', async () => {
    const {d} = await fake(okCompletion, () => false)
    const r = await vllmCoRestart(d, scriptedHost(), {...OPTS, healthTimeoutS: 1})
    expect(r.verdicts).toHaveLength(1)
    expect(r.verdicts[0]!.summary).toMatch(/prefill not healthy within 1s/)
  })

  it("plans the steps with each gate's path and the proxy last", async () => {
    const {d} = await fake(okCompletion)
    const plan = vllmRestartPlan(d, {...OPTS, settleS: 5})
    expect(plan[0]).toBe('engine: vllm; order: prefill → decode → router')
    expect(plan[3]).toMatch(/^3\. restart router \(the proxy\): restart-router .*\/healthcheck = 2xx within 2s$/)
    expect(plan[4]).toMatch(/settle 5s, then 2 canaries POST http:\/\/127\.0\.0\.1:\d+\/v1\/completions/)
    expect(vllmTargets(d, scriptedHost())[2]!.service).toMatchObject({readinessPath: '/healthcheck'})
  })
})
