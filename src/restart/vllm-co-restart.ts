import {randomUUID} from 'node:crypto'

import {httpRequest, joinUrl} from '../deployment/http.js'
import type {VllmDeployment} from '../engines/vllm/deployment-file.js'
import {oneLine} from '../errors.js'
import type {Host} from '../hosts/host.js'
import {displayArgv} from '../hosts/quote.js'
import {sleep} from '../util/time.js'
import {
  judgeCanaries,
  type RestartResult,
  type RestartTarget,
  restartEach,
  type ServiceName,
  startRun,
} from './co-restart.js'

/**
 * The co-restart of a vLLM PD deployment (`engine: vllm`, issue 31): the SGLang co-restart's steps (co-restart.ts:
 * each service's restart command with its deadline, then its health gate, before the next) in vLLM's order, then
 * canaries through the proxy. What differs is the engine's surface, chosen here:
 * - the order: prefill, decode, then the proxy (the toy proxy takes the servers' addresses at launch and only
 *   forwards: restarted last, it comes back in front of servers that already serve);
 * - the gates: a vLLM server's `GET /health` (vllm/entrypoints/serve/instrumentator/health.py `health`: 200, or 503
 *   on EngineDeadError), the toy proxy's `GET /healthcheck` (tests/v1/kv_connector/nixl_integration/
 *   toy_proxy_server.py `healthcheck`): the file's `healthPath` of each;
 * - the canary: `POST /v1/completions` to the proxy with the served model's id (`GET /v1/models` on decode), judged
 *   200 with a `choices` list. No watchdog pin watch: a vLLM pin is P's blocks under their lease, not an open request.
 */

export const VLLM_ORDER: ServiceName[] = ['prefill', 'decode', 'router']

export interface VllmRestartOptions {
  healthTimeoutS: number
  commandTimeoutS: number
  canaries: number
  /** Seconds after the last gate before the canaries. */
  settleS: number
  /** Deadline of each canary, in seconds. */
  canaryTimeoutS: number
  onProgress?: (line: string) => void
  signal?: AbortSignal
}

/** Each service of the file in vLLM's order, its gate the file's healthPath (the proxy's as its readiness). */
export function vllmTargets(d: VllmDeployment, host: Host, order: ServiceName[] = VLLM_ORDER): RestartTarget[] {
  return order.map(role => {
    const s = d.services[role]
    return {
      name: role,
      role,
      path: `services.${role}`,
      service: {
        url: s.url,
        healthPath: s.healthPath,
        ...(role === 'router' ? {readinessPath: s.healthPath} : {}),
        ...(s.restart ? {restart: s.restart} : {}),
      } as RestartTarget['service'],
      host,
    }
  })
}

/** What `--dry-run` prints: each step with its command, gate and deadlines, then the canaries. */
export function vllmRestartPlan(d: VllmDeployment, opts: VllmRestartOptions, order = VLLM_ORDER): string[] {
  const steps = order.map((role, i) => {
    const s = d.services[role]
    const what = role === 'router' ? 'router (the proxy)' : role
    return (
      `${i + 1}. restart ${what}: ${s.restart ? displayArgv(s.restart) : '(no restart command in the file)'} ` +
      `(deadline ${opts.commandTimeoutS}s); gate GET ${joinUrl(s.url, s.healthPath)} = 2xx within ` +
      `${opts.healthTimeoutS}s`
    )
  })
  return [
    `engine: vllm; order: ${order.join(' → ')}`,
    ...steps,
    `${order.length + 1}. settle ${opts.settleS}s, then ${opts.canaries} canaries POST ` +
      `${joinUrl(d.services.router.url, '/v1/completions')} (each within ${opts.canaryTimeoutS}s), 200 expected`,
  ]
}

export async function vllmCoRestart(
  d: VllmDeployment,
  host: Host,
  opts: VllmRestartOptions,
  order: ServiceName[] = VLLM_ORDER,
): Promise<RestartResult> {
  const run = startRun(d.sudo === 'passwordless', {
    order,
    healthTimeoutS: opts.healthTimeoutS,
    commandTimeoutS: opts.commandTimeoutS,
    canaries: opts.canaries,
    watchS: 0,
    sampleS: 1,
    settleS: opts.settleS,
    ...(opts.onProgress ? {onProgress: opts.onProgress} : {}),
    ...(opts.signal ? {signal: opts.signal} : {}),
  })
  if (!(await restartEach(run, vllmTargets(d, host, order)))) return run.finish()
  if (opts.canaries === 0) return run.finish()
  if (opts.settleS > 0) {
    run.say(`settling ${opts.settleS}s before the canaries`)
    await sleep(opts.settleS * 1000, opts.signal)
    run.stopped('the settle')
  }
  const model = await servedModel(d, opts)
  run.say(`${opts.canaries} canaries through the proxy: POST /v1/completions (model ${model ?? 'unknown'})`)
  const sent = Array.from({length: opts.canaries}, () => vllmCanary(d.services.router.url, model, opts))
  for (const c of await Promise.all(sent)) run.canaries.push(c)
  run.stopped('the canaries')
  judgeCanaries(run)
  return run.finish()
}

/** The served model's id from decode's `GET /v1/models` (the OpenAI surface vLLM serves); undefined when unread. */
async function servedModel(d: VllmDeployment, opts: VllmRestartOptions): Promise<string | undefined> {
  try {
    const res = await httpRequest({
      service: 'decode',
      url: joinUrl(d.services.decode.url, '/v1/models'),
      timeoutMs: opts.canaryTimeoutS * 1000,
      ...(opts.signal ? {signal: opts.signal} : {}),
    })
    const data = (JSON.parse(res.text) as {data?: Array<{id?: unknown}>}).data
    const id = data?.[0]?.id
    return typeof id === 'string' ? id : undefined
  } catch {
    return undefined
  }
}

/** One canary through the proxy: its status (null when it got no whole answer, or a 200 without choices). */
export async function vllmCanary(
  proxyUrl: string,
  model: string | undefined,
  opts: Pick<VllmRestartOptions, 'canaryTimeoutS' | 'signal' | 'onProgress'>,
): Promise<RestartResult['canaries'][number]> {
  const rid = `canary-${randomUUID().slice(0, 8)}`
  const t0 = performance.now()
  const body = {...(model ? {model} : {}), prompt: `pdchaos canary ${rid}`, max_tokens: 4, stream: false}
  try {
    const res = await httpRequest({
      service: 'router',
      url: joinUrl(proxyUrl, '/v1/completions'),
      method: 'POST',
      body: JSON.stringify(body),
      headers: {'content-type': 'application/json', 'X-Request-Id': rid},
      timeoutMs: opts.canaryTimeoutS * 1000,
      ...(opts.signal ? {signal: opts.signal} : {}),
    })
    const ms = Math.round(performance.now() - t0)
    if (res.status !== 200) return {rid, status: res.status, ms}
    return {rid, status: hasChoices(res.text) ? 200 : null, ms}
  } catch (error) {
    opts.onProgress?.(`canary ${rid}: ${oneLine(error).slice(0, 200)}`)
    return {rid, status: null, ms: Math.round(performance.now() - t0)}
  }
}

/** A completion's answer: JSON with a `choices` list. */
export function hasChoices(text: string): boolean {
  try {
    return Array.isArray((JSON.parse(text) as {choices?: unknown}).choices)
  } catch {
    return false
  }
}
