import type {TwinFailpoint} from './protocol.js'
import {createServer, type IncomingMessage, type Server, type ServerResponse} from 'node:http'
import {randomUUID} from 'node:crypto'
import type {SimConfig} from '../sim-config.js'
import type {EnvSettings} from './settings.js'
import type {SchedulerCore} from './scheduler-core.js'
import {normalizeRoom, parseRoomJson} from './json-room.js'
import {countTokens, type Req} from './request.js'
import {nowMs} from './clock.js'
import {rcGiveUpS, ROCE_V2_PORT, ucxRcSettings} from './rail-plan.js'
import {serverLayout} from './layout.js'

export interface ApiDeps {
  cfg: SimConfig
  env: EnvSettings
  role: 'prefill' | 'decode'
  /** Undefined while the server is starting: everything but liveness answers 503. */
  sched: () => SchedulerCore | undefined
  onNewAddr?: (addr: string) => void
  startedAt: number
}

const MAX_BODY = 64 * 1024 * 1024

/** The SGLang server's HTTP API (entrypoints/http_server.py), paths and payload shapes as SGLang has them. */
export function createHttpApi(deps: ApiDeps): Server {
  const server = createServer((req, res) => {
    handle(deps, req, res).catch((err: unknown) => {
      if (!res.headersSent) json(res, 500, {error: {message: String(err), code: 500}})
      else res.destroy()
    })
  })
  server.keepAliveTimeout = 30_000
  return server
}

function json(res: ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, {'content-type': 'application/json'}).end(JSON.stringify(body))
}

function text(res: ServerResponse, status: number, body: string, type = 'text/plain; charset=utf-8'): void {
  res.writeHead(status, {'content-type': type}).end(body)
}

async function readBody(req: IncomingMessage): Promise<string> {
  const chunks: Buffer[] = []
  let n = 0
  for await (const c of req as AsyncIterable<Buffer>) {
    n += c.length
    if (n > MAX_BODY) throw new Error('request body too large')
    chunks.push(c)
  }
  return Buffer.concat(chunks).toString('utf8')
}

async function handle(deps: ApiDeps, req: IncomingMessage, res: ServerResponse): Promise<void> {
  const url = new URL(req.url ?? '/', 'http://server')
  const path = url.pathname
  const method = req.method ?? 'GET'
  const sched = deps.sched()
  const {cfg} = deps

  if (path === '/health' || path === '/health_generate') {
    if (!sched) return text(res, 503, '')
    const ok = await sched.waitIteration(cfg.timing.healthTimeoutS * 1000)
    return text(res, ok ? 200 : 503, '')
  }
  if (path === '/server_info' || path === '/get_server_info') {
    return json(res, sched ? 200 : 503, serverInfo(deps, sched))
  }
  if (path === '/model_info' || path === '/get_model_info')
    return json(res, 200, {model_path: cfg.model, tokenizer_path: cfg.model, is_generation: true})
  if (!sched) return json(res, 503, {error: {message: 'Server is starting', code: 503}})

  if (path === '/metrics') return text(res, 200, sched.metrics.render(), 'text/plain; version=0.0.4; charset=utf-8')
  // no-loads: an SGLang before entrypoints/v1_loads.py, whose FastAPI app answers an unknown route 404.
  if ((path === '/v1/loads' || path === '/get_load') && !cfg.bugs.includes('no-loads'))
    return loads(deps, sched, url, res)
  if (path === '/flush_cache') {
    const q = sched.queued().filter(r => r.queue !== 'done').length
    if (q > 0)
      return text(
        res,
        400,
        `Cache not flushed. Please check backend logs for more details. (When there are running or waiting ` +
          `requests, the operation will not be performed.) #queue-req: ${q}\n`,
      )
    return text(
      res,
      200,
      'Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, ' +
        'the operation will not be performed.)\n',
    )
  }
  if (path === '/abort_request' && method === 'POST') {
    let body: Record<string, unknown> = {}
    try {
      body = JSON.parse((await readBody(req)) || '{}') as Record<string, unknown>
    } catch {
      /* SGLang answers 200 regardless */
    }
    const rid = typeof body.rid === 'string' ? body.rid : ''
    // A rid still being tokenized is not in rid_to_state yet: TokenizerManager.abort_request drops the abort.
    if (body.abort_all !== true && sched.tokenizer.unknown(rid)) return text(res, 200, '')
    sched.receiveAbort(rid, body.abort_all === true)
    return text(res, 200, '')
  }
  if (path === FAILPOINT_PATH && deps.role === 'prefill') return failpoint(deps, sched, req, res, method)
  if (path === '/generate' && method === 'POST') {
    // The twin's stand-in for a packet filter refusing the gateway (trip-breaker without root): the connection is
    // reset.
    if (deps.role === 'prefill' && (failpoints.get('refuse-generate')?.size ?? 0) > 0)
      return void req.socket.resetAndDestroy()
    return generate(deps, sched, req, res)
  }
  return json(res, 404, {detail: 'Not Found'})
}

async function generate(deps: ApiDeps, sched: SchedulerCore, req: IncomingMessage, res: ServerResponse): Promise<void> {
  let body: Record<string, unknown>
  let room: string | undefined
  try {
    body = parseRoomJson(await readBody(req)) as Record<string, unknown>
    if (typeof body !== 'object' || body === null) throw new Error('body must be a JSON object')
    room = normalizeRoom(body.bootstrap_room)
  } catch (err) {
    return json(res, 400, {
      error: {message: `Invalid request: ${String(err instanceof Error ? err.message : err)}`, code: 400},
    })
  }
  const host = typeof body.bootstrap_host === 'string' ? body.bootstrap_host : undefined
  if (room === undefined || !host) {
    return json(res, 400, {
      error: {message: 'Disaggregation mode requires bootstrap_host and bootstrap_room in the request', code: 400},
    })
  }
  // A null bootstrap_port is replaced by this server's own --disaggregation-bootstrap-port.
  const port =
    body.bootstrap_port === undefined || body.bootstrap_port === null
      ? deps.cfg.ports.bootstrap
      : Number(body.bootstrap_port)
  const sp = (body.sampling_params ?? {}) as Record<string, unknown>
  const maxNew = typeof sp.max_new_tokens === 'number' && sp.max_new_tokens >= 0 ? Math.floor(sp.max_new_tokens) : 128
  const r: Req = {
    rid: typeof body.rid === 'string' && body.rid !== '' ? body.rid : randomUUID().replace(/-/g, ''),
    room,
    addr: `${host}:${port}`,
    tokens: countTokens(body),
    maxNewTokens: maxNew,
    stream: body.stream === true,
    res,
    arrivedAt: nowMs(),
    queue: 'bootstrap',
    bootstrapAt: nowMs(),
    kvTokens: 0,
  }
  // A client that goes away is aborted after the request-state wait timeout, as the tokenizer does.
  res.on('close', () => {
    if (r.queue === 'done') return
    const waitS = deps.cfg.timing.requestStateWaitS ?? 4
    r.disconnectTimer = setTimeout(() => {
      if (r.queue === 'done') return
      sched.receiveAbort(r.rid, false)
    }, waitS * 1000)
  })
  sched.truth.record(r.rid, r.room, 'received', {
    detail: {tokens: r.tokens, maxNewTokens: r.maxNewTokens, addr: r.addr},
  })
  deps.onNewAddr?.(r.addr)
  await sched.tokenizer.tokenize(r.rid)
  sched.receive(r)
}

function loads(deps: ApiDeps, sched: SchedulerCore, url: URL, res: ServerResponse): void {
  const s = sched.loadsSnapshot
  const disagg =
    (url.searchParams.get('include')?.split(',').includes('disagg') ?? false) &&
    !deps.cfg.bugs.includes('no-disagg-loads')
  const d = {
    prefill_bootstrap_queue_reqs: s.prefill_bootstrap_queue_reqs ?? 0,
    prefill_inflight_queue_reqs: s.prefill_inflight_queue_reqs ?? 0,
    decode_prealloc_queue_reqs: s.decode_prealloc_queue_reqs ?? 0,
    decode_transfer_queue_reqs: s.decode_transfer_queue_reqs ?? 0,
  }
  if (url.searchParams.get('format') === 'prometheus') {
    const lines = [
      `sglang_num_running_reqs{dp_rank="0"} ${s.num_running_reqs ?? 0}`,
      `sglang_num_waiting_reqs{dp_rank="0"} ${s.num_waiting_reqs ?? 0}`,
      `sglang_num_used_tokens{dp_rank="0"} ${s.num_used_tokens ?? 0}`,
    ]
    if (disagg) for (const [k, v] of Object.entries(d)) lines.push(`sglang_disagg_${k}{dp_rank="0"} ${v}`)
    return text(res, 200, lines.join('\n') + '\n', 'text/plain; version=0.0.4; charset=utf-8')
  }
  const load: Record<string, unknown> = {
    dp_rank: 0,
    num_running_reqs: s.num_running_reqs ?? 0,
    num_waiting_reqs: s.num_waiting_reqs ?? 0,
    num_used_tokens: s.num_used_tokens ?? 0,
    max_total_num_tokens: deps.cfg.kvPoolTokens,
    token_usage: (s.num_used_tokens ?? 0) / deps.cfg.kvPoolTokens,
  }
  if (disagg) load.disagg = d
  json(res, 200, {timestamp: new Date().toISOString(), version: deps.cfg.version, dp_rank_count: 1, loads: [load]})
}

/** The twin's control endpoint: its failure points, for users without root. Not an SGLang route. */
export const FAILPOINT_PATH = '/_pdchaos/twin/failpoint'
const failpoints = new Map<TwinFailpoint, Set<number>>([
  ['drop-dest-info', new Set()],
  ['stall-kv', new Set()],
  ['refuse-generate', new Set()],
])

async function failpoint(
  deps: ApiDeps,
  sched: SchedulerCore,
  req: IncomingMessage,
  res: ServerResponse,
  method: string | undefined,
): Promise<void> {
  const state = () => Object.fromEntries([...failpoints].map(([k, v]) => [k, [...v].sort((a, b) => a - b)]))
  if (method !== 'POST') return json(res, 200, {failpoints: state()})
  let body: {name?: unknown; enabled?: unknown; tpRanks?: unknown}
  try {
    body = JSON.parse((await readBody(req)) || '{}') as typeof body
  } catch {
    return json(res, 400, {error: {message: 'body must be JSON', code: 400}})
  }
  const name = body.name as TwinFailpoint
  if (!failpoints.has(name) || typeof body.enabled !== 'boolean')
    return json(res, 400, {
      error: {
        message: 'need {name: drop-dest-info|stall-kv|refuse-generate, enabled: boolean, tpRanks?: number[]}',
        code: 400,
      },
    })
  const all = Array.from({length: deps.cfg.prefillTp}, (_, k) => k)
  const tpRanks = Array.isArray(body.tpRanks)
    ? body.tpRanks.filter((k): k is number => Number.isInteger(k) && all.includes(k as number))
    : all
  const set = failpoints.get(name)!
  for (const k of tpRanks) body.enabled ? set.add(k) : set.delete(k)
  sched.pushOp({op: 'failpoint', name, enabled: body.enabled, tpRanks})
  json(res, 200, {failpoints: state()})
}

/**
 * The KV data path, stated for discovery without root: `tcp`, or with rail NICs `rdma-roce-rails` plus each GPU's
 * rail (interface, address, UDP port) and the RC limits the servers read from UCX's variables.
 */
function kvDataPath(cfg: SimConfig): Record<string, unknown> {
  if (!cfg.rails) return {kv_data_path: 'tcp'}
  const rc = ucxRcSettings(process.env)
  return {
    kv_data_path: 'rdma-roce-rails',
    rails: cfg.rails.nics.map(n => ({gpu: n.gpu, interface: n.name, address: n.addr, udp_port: ROCE_V2_PORT})),
    ucx_rc: {
      transport: rc.transport,
      timeout: rc.timeoutText,
      qp_timeout_s: rc.qpTimeoutS,
      retry_count: rc.retryCount,
      gives_up_after_s: rcGiveUpS(rc),
    },
  }
}

function layoutInfo(cfg: SimConfig, role: 'prefill' | 'decode'): Record<string, unknown> {
  const l = serverLayout(cfg, role)
  return {
    port: cfg.dockerProxy ? cfg.dockerProxy[role] : cfg.ports[role],
    tp_size: l.tp,
    dp_size: l.dp,
    pp_size: l.pp,
    ep_size: l.ep,
    enable_dp_attention: l.dpAttention,
    attn_cp_size: 1,
    base_gpu_id: l.baseGpuId,
    gpu_id_step: 1,
    // server_args' multi-node fields (one node: 1, 0, None); only node rank 0 serves this API.
    nnodes: cfg.dist?.role === role ? cfg.dist.nnodes : 1,
    node_rank: cfg.dist?.role === role ? cfg.dist.nodeRank : 0,
    dist_init_addr: cfg.dist?.role === role ? cfg.dist.distInitAddr : null,
  }
}

function serverInfo(deps: ApiDeps, sched: SchedulerCore | undefined): Record<string, unknown> {
  const {cfg, env, role} = deps
  const wd = env.watchdog
  return {
    version: cfg.version,
    model_path: cfg.model,
    served_model_name: cfg.model,
    host: cfg.host,
    // The layout as SGLang's server_args state it (sim up's layout flags; docs/twin.md "Layouts").
    ...layoutInfo(cfg, role),
    disaggregation_mode: role,
    disaggregation_transfer_backend: env.backend,
    disaggregation_bootstrap_port: cfg.ports.bootstrap,
    disaggregation_decode_polling_interval: 1,
    max_total_num_tokens: cfg.kvPoolTokens,
    disaggregation_watchdog_scope: wd.scope,
    disaggregation_watchdog_timeout: wd.deadlineS,
    disaggregation_watchdog_poll_interval: wd.pollS,
    watchdog: {scope: wd.scope, deadline_s: wd.deadlineS, poll_interval_s: wd.pollS},
    disaggregation_timeouts: {
      bootstrap_timeout_s: env.bootstrapTimeoutS,
      waiting_timeout_s: env.waitingTimeoutS,
      heartbeat_interval_s: env.heartbeatIntervalS,
      heartbeat_max_failure: env.heartbeatMaxFailure,
    },
    start_time: deps.startedAt / 1000,
    // Decode states its data path too: on a twin split over nodes, the rails of decode's GPUs are on decode's node
    // only.
    pdchaos_twin:
      role === 'prefill'
        ? {failpoint_path: FAILPOINT_PATH, failpoints: [...failpoints.keys()], ...kvDataPath(cfg)}
        : kvDataPath(cfg),
    internal_states: [
      {
        ...(sched ? sched.queueSizes() : {}),
        token_usage: sched ? sched.tokenUsage() : 0,
        loop_iterations: sched?.iterations ?? 0,
        status: sched?.running ? 'running' : 'starting',
      },
    ],
  }
}
