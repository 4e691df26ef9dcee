import {randomUUID} from 'node:crypto'
import http from 'node:http'

import {writeJsonAtomic} from '../lifecycle/files.js'
import {TruthLog} from '../server/truth.js'
import {readBody, sendJson} from './common.js'
import {vllmPaths} from './config.js'

/**
 * The toy proxy in front of the vLLM twin, with its interface (vllm-project/vllm
 * tests/v1/kv_connector/nixl_integration/toy_proxy_server.py): `--port --host --prefiller-hosts/--prefiller-ports
 * --decoder-hosts/--decoder-ports`, round robin on each side, `GET /healthcheck`. `_handle_completions` sends the
 * request to P with `kv_transfer_params.do_remote_decode`, `stream: false`, `max_tokens: 1` and `X-Request-Id`,
 * raises on P's error (the client gets 500), then streams D's answer with P's kv_transfer_params. D's status is
 * checked inside the stream (`raise_for_status` after the 200 went out), so a D error cuts the answer short.
 */
function list(name: string): string[] {
  const i = process.argv.indexOf(name)
  if (i < 0) return []
  const out: string[] = []
  for (let j = i + 1; j < process.argv.length && !process.argv[j]!.startsWith('--'); j++) out.push(process.argv[j]!)
  return out
}
const one = (name: string, dflt: string): string => list(name)[0] ?? dflt

const stateDir = one('--state-dir', '')
const host = one('--host', '127.0.0.1')
const port = Number(one('--port', '8000'))
const pair = (hosts: string[], ports: string[]): string[] => hosts.map((h, i) => `http://${h}:${ports[i]}`)
const prefills = pair(list('--prefiller-hosts'), list('--prefiller-ports'))
const decodes = pair(list('--decoder-hosts'), list('--decoder-ports'))
if (prefills.length === 0 || decodes.length === 0) {
  process.stderr.write('Number of prefiller hosts must match number of prefiller ports\n')
  process.exit(2)
}
const truth = stateDir ? new TruthLog(vllmPaths(stateDir).truth('router'), 'router') : undefined
let pi = 0
let di = 0

function post(
  base: string,
  path: string,
  body: unknown,
  rid: string,
): {req: http.ClientRequest; res: Promise<http.IncomingMessage>} {
  const text = JSON.stringify(body)
  const req = http.request(`${base}/v1${path}`, {
    method: 'POST',
    agent: false,
    headers: {'content-type': 'application/json', 'content-length': Buffer.byteLength(text), 'x-request-id': rid},
  })
  const res = new Promise<http.IncomingMessage>((resolve, reject) => {
    req.on('response', resolve)
    req.on('error', reject)
  })
  req.end(text)
  return {req, res}
}

async function handle(path: string, req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
  const data = JSON.parse(await readBody(req)) as Record<string, unknown>
  const rid = randomUUID()
  const p = prefills[pi++ % prefills.length]!
  const toP = {
    ...data,
    kv_transfer_params: {
      do_remote_decode: true,
      do_remote_prefill: false,
      remote_engine_id: null,
      remote_block_ids: null,
      remote_host: null,
      remote_port: null,
    },
    stream: false,
    max_tokens: 1,
  }
  truth?.record(rid, null, 'sent-prefill', {detail: {prefill: p}})
  const pres = await post(p, path, toP, rid).res
  const ptext = await new Promise<string>(r => {
    let s = ''
    pres.setEncoding('utf8')
    pres.on('data', (c: string) => (s += c))
    pres.on('end', () => r(s))
  })
  if ((pres.statusCode ?? 0) >= 400) throw new Error(`prefill answered ${pres.statusCode}`)
  const kv = (JSON.parse(ptext) as {kv_transfer_params?: unknown}).kv_transfer_params
  const d = decodes[di++ % decodes.length]!
  truth?.record(rid, null, 'sent-decode', {detail: {decode: d, kv_transfer_params: kv}})
  const call = post(d, path, kv ? {...data, kv_transfer_params: kv} : data, rid)
  res.on('close', () => {
    if (!res.writableFinished) call.req.destroy()
  })
  const dres = await call.res
  res.writeHead(200, {'content-type': 'application/json'})
  if ((dres.statusCode ?? 0) >= 400) {
    truth?.record(rid, null, 'answered', {detail: {status: dres.statusCode, cut: true}})
    dres.resume()
    return void res.destroy()
  }
  dres.pipe(res)
  dres.on('end', () => truth?.record(rid, null, 'answered', {detail: {status: dres.statusCode}}))
}

const server = http.createServer((req, res) => {
  const url = (req.url ?? '/').split('?')[0]!
  if (req.method === 'GET' && url === '/healthcheck')
    return sendJson(res, 200, {status: 'ok', prefill_instances: prefills.length, decode_instances: decodes.length})
  if (req.method === 'POST' && (url === '/v1/completions' || url === '/v1/chat/completions'))
    return void handle(url.slice(3), req, res).catch(e => {
      process.stderr.write(`Error occurred in disagg prefill proxy server - ${url.slice(3)} endpoint\n${e}\n`)
      if (!res.headersSent) {
        res.writeHead(500, {'content-type': 'text/plain'})
        res.end('Internal Server Error')
      } else res.destroy()
    })
  sendJson(res, 404, {detail: 'Not Found'})
})

server.listen(port, host, () => {
  process.stdout.write(`Initialized ${prefills.length} prefill clients and ${decodes.length} decode clients.\n`)
  if (stateDir) writeJsonAtomic(vllmPaths(stateDir).service('router'), {pid: process.pid, port})
})
process.on('SIGTERM', () => process.exit(0))
