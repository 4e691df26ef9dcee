import {httpRequest, joinUrl} from '../../deployment/http.js'
import type {HostState} from '../../discovery/host-state.js'
import type {Host} from '../../hosts/host.js'
import type {HaltRecord} from '../../model/halt.js'
import {parseEnviron, parsePs} from '../../discovery/proc.js'
import type {Sourced} from '../engine.js'
import type {VllmDeployment} from './deployment-file.js'
import {isVllmMetricsText, kvTransferConfig, serverPort, vllmProcessTrees} from './detect.js'
import {type LeaseContract, leaseContract} from './lease-contract.js'

/**
 * Discovery of a vLLM deployment over the Host interface, as for a real host: the process table (ps), each server's
 * /proc/<pid>/cmdline (its exact argv: the --kv-transfer-config JSON is one word) and /proc/<pid>/environ through the
 * host's run(), and each service's HTTP API (health path, /metrics, /version). Changes nothing on the host.
 */

export interface VllmServerReport {
  role: 'prefill' | 'decode'
  url: string
  health: {ok: boolean; detail: string}
  pid?: number
  /** Process titles confirming vLLM: the engine core(s) and TP workers under the API server. */
  titles: string[]
  metrics: {vllm: boolean; detail: string}
  version: Sourced<string> | {value: 'unknown'; detail: string}
  lease?: LeaseContract
  problems: string[]
}

export interface VllmStatusReport {
  engine: 'vllm'
  host: string
  declared: NonNullable<VllmDeployment['vllm']> | undefined
  servers: VllmServerReport[]
  router: {url: string; health: {ok: boolean; detail: string}}
  /** What pdchaos left in the deployment's stateDir on the host (leases, the run lock), read by `status`. */
  hostState?: HostState
  /** The halt (`pdchaos halt`) on the host, if any. */
  halt?: HaltRecord
}

async function get(service: string, url: string, timeoutMs: number): Promise<{status: number; text: string} | string> {
  try {
    const r = await httpRequest({service, url, timeoutMs})
    return {status: r.status, text: r.text}
  } catch (error) {
    return (error as Error).message.split('\n')[0]!
  }
}

async function health(service: string, url: string, timeoutMs: number): Promise<{ok: boolean; detail: string}> {
  const r = await get(service, url, timeoutMs)
  if (typeof r === 'string') return {ok: false, detail: r}
  return {ok: r.status === 200, detail: `GET ${url}: ${r.status}`}
}

async function readProc(host: Host, path: string, timeoutMs: number): Promise<string | undefined> {
  const r = await host.run(['cat', path], {timeoutMs})
  return r.code === 0 ? r.stdout : undefined
}

async function versionOf(
  url: string,
  declared: string | undefined,
  timeoutMs: number,
): Promise<VllmServerReport['version']> {
  const r = await get('vllm', joinUrl(url, '/version'), timeoutMs)
  if (typeof r !== 'string' && r.status === 200) {
    let v: unknown
    try {
      v = (JSON.parse(r.text) as {version?: unknown}).version
    } catch {}
    if (typeof v === 'string') return {value: v, source: 'endpoint', detail: 'GET /version'}
  }
  const why = typeof r === 'string' ? r : `GET /version: ${r.status}`
  if (declared !== undefined) return {value: declared, source: 'file', detail: `vllm.version (${why})`}
  return {value: 'unknown', detail: why}
}

async function readServer(
  host: Host,
  d: VllmDeployment,
  role: 'prefill' | 'decode',
  trees: ReturnType<typeof vllmProcessTrees>,
  timeoutMs: number,
): Promise<VllmServerReport> {
  const svc = d.services[role]
  const port = Number(new URL(svc.url).port || 80)
  const problems: string[] = []
  const tree = trees.find(t => serverPort(t.server.args.split(/\s+/)) === port)
  const [h, metrics, version] = await Promise.all([
    health(role, joinUrl(svc.url, svc.healthPath), timeoutMs),
    get(role, joinUrl(svc.url, '/metrics'), timeoutMs),
    versionOf(svc.url, d.vllm?.version, timeoutMs),
  ])
  const m =
    typeof metrics === 'string'
      ? {vllm: false, detail: metrics}
      : {vllm: isVllmMetricsText(metrics.text), detail: `GET /metrics: ${metrics.status}`}
  if (!tree) {
    problems.push(`no \`vllm serve\` process with --port ${port} in the process table`)
    return {role, url: svc.url, health: h, titles: [], metrics: m, version, problems}
  }
  const pid = tree.server.pid
  const cmdline = await readProc(host, `/proc/${pid}/cmdline`, timeoutMs)
  const environ = await readProc(host, `/proc/${pid}/environ`, timeoutMs)
  if (environ === undefined) problems.push(`/proc/${pid}/environ not readable (needs the same user or root)`)
  const argv = (cmdline ?? tree.server.args).split(cmdline === undefined ? /\s+/ : '\0')
  const config = kvTransferConfig(argv)
  if (typeof config === 'string') problems.push(`--kv-transfer-config ${config}`)
  const titles = [...tree.engineCores.map(e => e.args), ...tree.workers.map(w => w.process.args)]
  if (titles.length === 0) problems.push('no VLLM::EngineCore process under the API server')
  const lease = leaseContract(
    typeof config === 'object' ? config : undefined,
    environ === undefined ? undefined : parseEnviron(environ),
  )
  return {role, url: svc.url, health: h, pid, titles, metrics: m, version, lease, problems}
}

/** Read every service of a vLLM deployment once. */
export async function discoverVllm(
  d: VllmDeployment,
  host: Host,
  opts: {timeoutMs: number},
): Promise<VllmStatusReport> {
  const ps = await host.run(['ps', '-eo', 'pid=,ppid=,stat=,args='], {timeoutMs: opts.timeoutMs})
  const trees = vllmProcessTrees(parsePs(ps.stdout))
  const [prefill, decode, router] = await Promise.all([
    readServer(host, d, 'prefill', trees, opts.timeoutMs),
    readServer(host, d, 'decode', trees, opts.timeoutMs),
    health('router', joinUrl(d.services.router.url, d.services.router.healthPath), opts.timeoutMs),
  ])
  return {
    engine: 'vllm',
    host: host.describe(),
    declared: d.vllm,
    servers: [prefill, decode],
    router: {url: d.services.router.url, health: router},
  }
}
