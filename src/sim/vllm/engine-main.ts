import {fork} from 'node:child_process'
import {randomUUID} from 'node:crypto'
import {mkdirSync, readFileSync} from 'node:fs'
import http from 'node:http'
import type net from 'node:net'
import {dirname} from 'node:path'

import {entryArgv, sibling} from '../entry.js'
import {writeJsonAtomic} from '../lifecycle/files.js'
import {TruthLog} from '../server/truth.js'
import {errorBody, promptTokens, readBody, sendJson, vlog} from './common.js'
import {dataPorts, type VllmRole, type VllmTwinConfig, vllmPaths} from './config.js'
import {DecodeSide} from './decode.js'
import {EngineLoop} from './engine-loop.js'
import {EngineCounters, renderMetrics} from './engine-state.js'
import {PrefillSide} from './prefill.js'

/**
 * One vLLM server of the twin (`vllm serve … --kv-transfer-config {NixlConnector, kv_both}`): the OpenAI HTTP
 * surface, the engine loop, the NIXL side channel (VLLM_NIXL_SIDE_CHANNEL_PORT) and the READ data path. Both roles
 * run the same code, as kv_both does: what a request's kv_transfer_params ask decides the side.
 *   node engine-main.js --state-dir DIR --role prefill|decode vllm serve MODEL … --kv-transfer-config JSON
 */
function arg(name: string): string | undefined {
  const i = process.argv.indexOf(name)
  return i >= 0 ? process.argv[i + 1] : undefined
}

const stateDir = arg('--state-dir')
const role = arg('--role') as VllmRole | undefined
if (!stateDir || (role !== 'prefill' && role !== 'decode')) {
  process.stderr.write('usage: engine-main --state-dir DIR --role prefill|decode vllm serve …\n')
  process.exit(2)
}
const c = JSON.parse(readFileSync(vllmPaths(stateDir).config, 'utf8')) as VllmTwinConfig
const truthFile = vllmPaths(stateDir).truth(role)
mkdirSync(dirname(truthFile), {recursive: true})
const truth = new TruthLog(truthFile, role)
const counters = new EngineCounters()

/** The local (abstract unix) socket each rank's data listener relays its connections to. */
const dataRelay = `pdchaos-vllm-${role}-${process.pid}-data`

/** The engine core (and under it, at TP above 1, one worker per rank: vLLM's MultiprocExecutor). */
function startEngineCore(): ReturnType<typeof fork> {
  const workers = c.tp > 1 ? ['--workers', String(c.tp)] : []
  const data = ['--data-host', c.host, '--data-ports', dataPorts(c, role!).join(','), '--data-relay', dataRelay]
  const {command, args} = entryArgv(
    sibling(import.meta.url, 'worker-main'),
    '--title',
    'VLLM::EngineCore',
    ...workers,
    ...data,
  )
  const viaTsx = args[0] === '--import'
  const execArgv = viaTsx ? ['--import', import.meta.resolve('tsx')] : []
  const [file, ...rest] = viaTsx ? args.slice(2) : args
  return fork(file!, rest, {execPath: command, execArgv, stdio: 'inherit'})
}

const workers = [startEngineCore()]
// A dead engine core ends the API server, as vLLM's does ("Engine core proc … died unexpectedly").
workers[0]!.on('exit', (code, signal) => {
  vlog(
    'APIServer',
    'ERROR',
    'core_client.py',
    `Engine core proc EngineCore_DP0 died unexpectedly (${signal ?? code}), shutting down client.`,
  )
  process.exit(1)
})
/** The engine core's own workers' pids, once it has started them. */
const workerPids = new Promise<number[]>(resolve =>
  workers[0]!.on('message', (m: {t?: string; pids?: number[]}) => {
    if (m?.t === 'pids') resolve(m.pids ?? [])
  }),
)
/** Each rank's data port, once its listener (in the rank's process) listens. */
const rankPorts = new Promise<number[]>(resolve => {
  const got: number[] = []
  workers[0]!.on('message', (m: {t?: string; rank?: number; port?: number}) => {
    if (m?.t !== 'data-port' || m.rank === undefined || m.port === undefined) return
    got[m.rank] = m.port
    if (got.filter(p => p !== undefined).length === c.tp) resolve(got)
  })
})
let loop: EngineLoop | undefined
const wake = (): void => loop?.wake()
const prefill = new PrefillSide(c, counters, truth, wake)
const decode = new DecodeSide(c, counters, truth, wake)
loop = new EngineLoop(
  async () => {
    await prefill.step()
    const p = counters.stats
    await decode.step()
    const d = counters.stats
    counters.stats = {
      running: p.running + d.running,
      waitingCapacity: p.waitingCapacity + d.waitingCapacity,
      waitingDeferred: d.waitingDeferred,
      usedBlocks: prefill.usedBlocks() + d.usedBlocks,
    }
    return prefill.pending || decode.pending
  },
  c.stepMs,
  workers,
)

async function completions(req: http.IncomingMessage, res: http.ServerResponse): Promise<void> {
  let body: Record<string, unknown>
  try {
    body = JSON.parse(await readBody(req)) as Record<string, unknown>
  } catch {
    return sendJson(res, 400, errorBody('invalid JSON body', 'BadRequestError', 400))
  }
  const header = req.headers['x-request-id']
  const id = `cmpl-${typeof header === 'string' && header ? header : randomUUID()}-0`
  const params = (body.kv_transfer_params ?? {}) as Record<string, unknown>
  const tokens = promptTokens(body.prompt ?? body.messages)
  const maxTokens = Math.max(1, Math.min(Number(body.max_tokens ?? 16) || 16, 4096))
  let answered = false
  const answer = (status: number, out: unknown): void => {
    answered = true
    sendJson(res, status, out)
  }
  if (params.do_remote_decode) return prefill.submit({id, tokens, answer})
  if (params.do_remote_prefill && params.remote_request_id && params.remote_host && params.remote_port) {
    res.on('close', () => {
      if (!answered) decode.abort(id)
    })
    return decode.submit({
      id,
      remoteId: String(params.remote_request_id),
      engineId: String(params.remote_engine_id ?? ''),
      host: String(params.remote_host),
      port: Number(params.remote_port),
      tokens: Number(params.remote_num_tokens ?? tokens) || tokens,
      maxTokens,
      answer,
    })
  }
  // Not disaggregated: prefill and decode here; no KV is held after the answer (not modelled further).
  setTimeout(
    () =>
      answer(200, {
        id,
        object: 'text_completion',
        model: c.model,
        choices: [{index: 0, text: ' twin'.repeat(maxTokens), finish_reason: 'length'}],
        usage: {prompt_tokens: tokens, completion_tokens: maxTokens, total_tokens: tokens + maxTokens},
      }),
    (tokens * c.prefillMsPerKToken) / 1000 + maxTokens * c.decodeMsPerToken,
  )
}

const server = http.createServer((req, res) => {
  const url = (req.url ?? '/').split('?')[0]
  if (req.method === 'GET' && url === '/health') return void res.writeHead(200).end()
  if (req.method === 'GET' && url === '/metrics') {
    res.writeHead(200, {'content-type': 'text/plain; version=0.0.4; charset=utf-8'})
    return void res.end(renderMetrics(c, counters))
  }
  if (req.method === 'GET' && url === '/v1/models')
    return sendJson(res, 200, {object: 'list', data: [{id: c.model, object: 'model', owned_by: 'vllm'}]})
  if (req.method === 'POST' && (url === '/v1/completions' || url === '/v1/chat/completions'))
    return void completions(req, res).catch(e => sendJson(res, 500, errorBody(String(e), 'InternalServerError', 500)))
  sendJson(res, 404, {detail: 'Not Found'})
})

const listen = (s: net.Server | http.Server, port: number): Promise<void> =>
  new Promise((resolve, reject) => {
    s.once('error', reject)
    s.listen(port, c.host, () => resolve())
  })

async function main(): Promise<void> {
  await new Promise<void>((resolve, reject) => {
    const relay = prefill.dataServer()
    relay.once('error', reject)
    relay.listen({path: `\0${dataRelay}`}, () => resolve())
  })
  const ports = await rankPorts
  prefill.dataPorts = ports
  await listen(prefill.sideChannel(), c.sideChannel[role!])
  await listen(server, c.ports[role!])
  vlog('APIServer', 'INFO', 'api_server.py', `Starting vLLM API server 0 on http://${c.host}:${c.ports[role!]}`)
  writeJsonAtomic(vllmPaths(stateDir!).service(role!), {
    pid: process.pid,
    // The engine core, then its TP workers (none at TP 1: the worker runs inside the engine core).
    workerPids: [workers[0]!.pid, ...(await workerPids)],
    port: c.ports[role!],
    sideChannelPort: c.sideChannel[role!],
    dataPorts: ports,
  })
  await loop!.run()
}

const stop = (): void => {
  for (const w of workers) w.kill('SIGTERM')
  truth.close()
  process.exit(0)
}
process.on('SIGTERM', stop)
process.on('SIGINT', stop)
main().catch(e => {
  process.stderr.write(`engine failed: ${(e as Error).message}\n`)
  for (const w of workers) w.kill('SIGKILL')
  process.exit(1)
})
