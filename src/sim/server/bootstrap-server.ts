import {createServer, type IncomingMessage, type Server, type ServerResponse} from 'node:http'
import {randomUUID} from 'node:crypto'
import type {SimConfig} from '../sim-config.js'
import type {Logger} from './log.js'
import {attnTpSize, rankCount, serverLayout, type ServerLayout} from './layout.js'

interface RankEntry {
  rank_ip: string
  rank_port: number
  page_size: number
  kv_cache_dtype: string
  prefill_http_port?: number
}

/**
 * CommonKVBootstrapServer: lives in the prefill's HTTP process. Ranks PUT their ZMQ endpoint; decode GETs
 * it. 503 until every rank registered. The instance id changes on every start (what PR #36029 compares).
 */
export class BootstrapServer {
  readonly instanceId = randomUUID()
  /** Keyed as upstream's prefill_port_table: dp group / attn cp rank / attn tp rank / pp rank. */
  private readonly ranks = new Map<string, RankEntry>()
  private readonly layout: ServerLayout
  private server: Server | undefined

  constructor(
    private readonly cfg: SimConfig,
    private readonly log: Logger,
  ) {
    this.layout = serverLayout(cfg, 'prefill')
  }

  get complete(): boolean {
    return this.ranks.size >= rankCount(this.layout)
  }

  async listen(): Promise<void> {
    this.server = createServer((req, res) => {
      void this.handle(req, res)
    })
    this.server.keepAliveTimeout = 30_000
    await new Promise<void>((resolve, reject) => {
      this.server!.once('error', reject)
      this.server!.listen(this.cfg.ports.bootstrap, this.cfg.host, () => resolve())
    })
    this.log.info(`Bootstrap server started on ${this.cfg.host}:${this.cfg.ports.bootstrap}`)
  }

  close(): void {
    this.server?.closeAllConnections()
    this.server?.close()
  }

  private async handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? '/', 'http://bootstrap')
    const send = (status: number, body: unknown) => {
      const text = typeof body === 'string' ? body : JSON.stringify(body)
      res.writeHead(status, {'content-type': typeof body === 'string' ? 'text/plain' : 'application/json'}).end(text)
    }
    if (url.pathname === '/health' && req.method === 'GET') return send(200, 'OK')
    if (url.pathname !== '/route') return send(404, 'Not Found')
    if (req.method === 'PUT') {
      let text = ''
      for await (const chunk of req) text += chunk
      try {
        const b = JSON.parse(text) as Record<string, unknown>
        const tp = Number(b.attn_tp_rank ?? b.tp_rank)
        if (!Number.isInteger(tp) || tp < 0 || tp >= attnTpSize(this.layout))
          return send(400, `bad tp rank ${String(b.attn_tp_rank)}`)
        // dp_group: the attention DP rank when system_dp_size is 1, else the system DP rank (common/conn.py).
        const dp = Number(b.system_dp_size ?? 1) === 1 ? Number(b.attn_dp_rank ?? 0) : Number(b.system_dp_rank ?? 0)
        const key = `${dp}/${Number(b.attn_cp_rank ?? 0)}/${tp}/${Number(b.pp_rank ?? 0)}`
        this.ranks.set(key, {
          rank_ip: String(b.rank_ip),
          rank_port: Number(b.rank_port),
          page_size: Number(b.page_size ?? 1),
          kv_cache_dtype: String(b.kv_cache_dtype ?? 'auto'),
          prefill_http_port: Number(b.prefill_http_port),
        })
        this.log.info(
          `Register prefill bootstrap: DP${dp} CP${Number(b.attn_cp_rank ?? 0)} TP${tp} ` +
            `PP${Number(b.pp_rank ?? 0)} rank_ip=${String(b.rank_ip)} rank_port=${String(b.rank_port)}`,
        )
        return send(200, 'OK')
      } catch (err) {
        return send(400, `bad registration: ${String(err)}`)
      }
    }
    if (req.method !== 'GET') return send(405, 'Method Not Allowed')
    if (!this.complete)
      return send(503, `Prefill instance not ready: ${this.ranks.size}/${rankCount(this.layout)} ranks registered`)
    const q = (k: string) => Number(url.searchParams.get(k) ?? '-1')
    const dp = q('prefill_dp_rank')
    const cp = q('prefill_cp_rank')
    const tp = q('target_tp_rank')
    const pp = q('target_pp_rank')
    if (dp === -1 && cp === -1 && tp === -1 && pp === -1) {
      const first = [...this.ranks.values()][0]!
      return send(200, {
        attn_tp_size: attnTpSize(this.layout),
        attn_cp_size: 1,
        dp_size: this.layout.dp,
        pp_size: this.layout.pp,
        page_size: first.page_size,
        kv_cache_dtype: first.kv_cache_dtype,
        follow_bootstrap_room: true,
        bootstrap_instance_id: this.instanceId,
      })
    }
    const entry = this.ranks.get(`${dp}/${cp}/${tp}/${pp}`)
    if (!entry) return send(404, `Bootstrap info not found for dp_rank=${dp} cp_rank=${cp} tp_rank=${tp} pp_rank=${pp}`)
    return send(200, {rank_ip: entry.rank_ip, rank_port: entry.rank_port})
  }
}
