import {type KvLeaseVerdict, judgeKvLeases} from '../checks/kv-lease.js'
import {requestJson} from '../deployment/http.js'
import {joinUrl} from '../deployment/http.js'
import {type PrefillGrant, readNixlCounters, sendPrefillOnly} from '../engines/vllm/client.js'
import {loadVllmDeployment, type VllmDeployment} from '../engines/vllm/deployment-file.js'
import {discoverVllm} from '../engines/vllm/discover.js'
import {parseReleaseLog} from '../engines/vllm/log-lines.js'
import {badInput, PdError} from '../errors.js'
import {ExitCode} from '../exit-codes.js'
import {
  renderVllmDropPlan,
  renderVllmDropVerdicts,
  type VllmDropPlan,
  vllmDropPlan,
  vllmDropScenario,
} from '../faults/vllm/drop-dest-info.js'
import type {Host} from '../hosts/host.js'
import {openHost} from '../hosts/open-host.js'
import type {SuiteRun} from '../model/run.js'

/**
 * `pdchaos inject drop-dest-info -c <engine: vllm file>`: discover P's lease, send P-only requests and never the D
 * leg, wait every window out (bounded), read P's log over the Host interface and its NIXL counters, judge with
 * checks/kv-lease.ts. The run model is the SGLang inject's (model/run.ts); the command writes its outputs.
 */

export interface VllmDropOptions {
  requests: number
  dryRun: boolean
  signal: AbortSignal
  progress: (line: string) => void
}

export type VllmDropResult = {kind: 'dry-run'; plan: VllmDropPlan; lines: string[]} | {kind: 'run'; run: SuiteRun}

const stopped = (): PdError =>
  new PdError('interrupted: no D leg was sent, nothing to revert', {exit: ExitCode.stopped})

/** Sleep until `untilMs` or the stop, whichever is first. */
function sleepUntil(untilMs: number, signal: AbortSignal): Promise<void> {
  return new Promise((ok, no) => {
    if (signal.aborted) return no(stopped())
    const t = setTimeout(done, Math.max(0, untilMs - Date.now()))
    function done(): void {
      signal.removeEventListener('abort', onAbort)
      ok()
    }
    function onAbort(): void {
      clearTimeout(t)
      no(stopped())
    }
    signal.addEventListener('abort', onAbort, {once: true})
  })
}

/** The model P serves (GET /v1/models, as any OpenAI client would learn it). */
async function servedModel(url: string, signal: AbortSignal): Promise<string> {
  const {json} = await requestJson({service: 'prefill', url: joinUrl(url, '/v1/models'), timeoutMs: 10_000, signal})
  const id = (json as {data?: Array<{id?: unknown}>}).data?.[0]?.id
  if (typeof id !== 'string') throw badInput(`${url}/v1/models names no model`, 'check that P is a vLLM server')
  return id
}

/** P's log as the deployment file says it is kept, read over the Host interface (its last 8 MiB). */
async function readLog(host: Host, file: string | undefined, signal: AbortSignal): Promise<string | undefined> {
  if (file === undefined) return undefined
  const r = await host.run(['tail', '-c', '8388608', file], {timeoutMs: 20_000, signal})
  return r.code === 0 ? r.stdout : undefined
}

/** The host's offset from UTC in minutes (`date +%z`), for the log's local timestamps. */
async function utcOffsetMin(host: Host, signal: AbortSignal): Promise<number | undefined> {
  const r = await host.run(['date', '+%z'], {timeoutMs: 10_000, signal})
  const m = /^([+-])(\d\d)(\d\d)/.exec(r.stdout.trim())
  return m ? (m[1] === '-' ? -1 : 1) * (Number(m[2]) * 60 + Number(m[3])) : undefined
}

async function sendAll(d: VllmDeployment, n: number, o: VllmDropOptions): Promise<PrefillGrant[]> {
  const baseUrl = d.services.prefill.url
  const model = await servedModel(baseUrl, o.signal)
  const grants: PrefillGrant[] = []
  for (let i = 0; i < n; i++) {
    grants.push(await sendPrefillOnly({baseUrl, model, prompt: 'x '.repeat(64), timeoutMs: 30_000, signal: o.signal}))
    o.progress(`sent ${grants.at(-1)!.requestId} to P; no D leg`)
  }
  return grants
}

async function observeAndJudge(
  host: Host,
  d: VllmDeployment,
  plan: VllmDropPlan,
  o: VllmDropOptions,
): Promise<{verdicts: KvLeaseVerdict[]; notes: string[]}> {
  const url = d.services.prefill.url
  const before = await readNixlCounters(url, 10_000).catch(() => undefined)
  const grants = await sendAll(d, plan.requests, o)
  const until = Math.max(...grants.map(g => g.answeredMs)) + plan.waitAfterLastGrantMs
  o.progress(`waiting ${((until - Date.now()) / 1000).toFixed(1)} s for every window to close`)
  await sleepUntil(until, o.signal)
  const after = await readNixlCounters(url, 10_000).catch(() => undefined)
  const logFile = d.services.prefill.logs?.file
  const [log, offset] = await Promise.all([readLog(host, logFile, o.signal), utcOffsetMin(host, o.signal)])
  const observedUntilMs = Date.now()
  const name = 'vllm:nixl_num_kv_expired_reqs'
  const samples = [before, after].flatMap(s => (s?.values[name] === undefined ? [] : [{t: s.t, value: s.values[name]}]))
  const verdicts = judgeKvLeases({
    requests: grants.map(g => ({
      requestId: g.requestId,
      sentMs: g.sentMs,
      answeredMs: g.answeredMs,
      decodeSent: false,
    })),
    settings: plan.settings,
    ...(log === undefined
      ? {}
      : {
          logReleases: parseReleaseLog(log, {
            nearMs: observedUntilMs,
            ...(offset === undefined ? {} : {utcOffsetMin: offset}),
          }),
        }),
    observedUntilMs,
    expiredCounter: samples,
  })
  const notes = [
    `${name}: ${samples.map(s => s.value).join(' -> ') || 'not exported'}`,
    log === undefined
      ? `P's log ${logFile ?? '(not in the deployment file)'} not readable`
      : `P's log read: ${logFile}`,
  ]
  return {verdicts, notes}
}

export async function vllmDropDestInfo(file: string, o: VllmDropOptions): Promise<VllmDropResult> {
  const d = await loadVllmDeployment(file)
  const host = await openHost(d.host, {sudo: d.sudo})
  try {
    const report = await discoverVllm(d, host, {timeoutMs: (d.probeTimeoutSeconds ?? 5) * 1000})
    const p = report.servers.find(s => s.role === 'prefill')!
    if (!p.health.ok) throw new PdError(`prefill is not healthy: ${p.health.detail}`, {exit: ExitCode.unreachable})
    const plan = vllmDropPlan(p.lease, {
      requests: o.requests,
      logFile: d.services.prefill.logs?.file,
      problems: p.problems,
      ...(d.vllm?.lease ? {declared: d.vllm.lease} : {}),
    })
    if ('refusal' in plan) throw badInput(plan.refusal, plan.hint)
    const lines = renderVllmDropPlan(plan)
    if (o.dryRun) return {kind: 'dry-run', plan, lines}
    for (const l of lines) o.progress(l)
    const startedAt = Date.now()
    const {verdicts, notes} = await observeAndJudge(host, d, plan, o)
    const scenario = vllmDropScenario(plan, {startedAt, finishedAt: Date.now(), verdicts, notes})
    const run: SuiteRun = {
      name: `inject ${scenario.name}`,
      startedAt,
      finishedAt: scenario.finishedAt,
      deployment: d.name ?? 'vllm',
      target: `${d.host.kind}`,
      scenarios: [scenario],
      notes: ['engine: vllm'],
    }
    return {kind: 'run', run}
  } finally {
    await host.close()
  }
}

/** The run as text: the verdicts, each with its summary. */
export function renderVllmDropRun(run: SuiteRun): string {
  const s = run.scenarios[0]!
  return [
    `${s.name}: ${s.description}`,
    ...(s.notes ?? []).map(n => `  ${n}`),
    'verdicts:',
    ...renderVllmDropVerdicts(s.verdicts),
  ].join('\n')
}
