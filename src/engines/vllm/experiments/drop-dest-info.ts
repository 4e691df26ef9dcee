import {judgeKvLeases, type KvLeaseVerdict} from '../../../checks/kv-lease.js'
import type {Host} from '../../../hosts/host.js'
import {type PrefillGrant, readNixlCounters, sendPrefillOnly} from '../client.js'
import type {VllmDeployment} from '../deployment-file.js'
import {
  type VllmDropPlan,
  VLLM_DROP_FAULT,
  renderVllmDropPlan,
  vllmDropPlan,
  vllmDropScenario,
} from '../faults/drop-dest-info.js'
import {parseReleaseLog} from '../log-lines.js'
import type {VllmContext, VllmExperiment, VllmFaultOptions} from './experiment.js'
import {readLog, servedModel, sleepUntil, utcOffsetMin} from './host-reads.js'

/**
 * drop-dest-info on vLLM: send P-only requests and never the D leg, wait every window out (bounded), read P's log
 * over the Host interface and its NIXL counters, judge with checks/kv-lease.ts. The plan and the scenario record are
 * faults/drop-dest-info.ts; nothing is installed on the host.
 */

const STOPPED = 'no D leg was sent, nothing to revert'

async function sendAll(d: VllmDeployment, n: number, ctx: VllmContext): Promise<PrefillGrant[]> {
  const baseUrl = d.services.prefill.url
  const model = await servedModel(baseUrl, ctx.signal)
  const grants: PrefillGrant[] = []
  for (let i = 0; i < n; i++) {
    grants.push(await sendPrefillOnly({baseUrl, model, prompt: 'x '.repeat(64), timeoutMs: 30_000, signal: ctx.signal}))
    ctx.progress(`sent ${grants.at(-1)!.requestId} to P; no D leg`)
  }
  return grants
}

async function observeAndJudge(
  ctx: VllmContext,
  plan: VllmDropPlan,
): Promise<{verdicts: KvLeaseVerdict[]; notes: string[]}> {
  const d = ctx.deployment
  const url = d.services.prefill.url
  const before = await readNixlCounters(url, 10_000).catch(() => undefined)
  const grants = await sendAll(d, plan.requests, ctx)
  const until = Math.max(...grants.map(g => g.answeredMs)) + plan.waitAfterLastGrantMs
  ctx.progress(`waiting ${((until - Date.now()) / 1000).toFixed(1)} s for every window to close`)
  await sleepUntil(until, ctx.signal, STOPPED)
  const after = await readNixlCounters(url, 10_000).catch(() => undefined)
  const logFile = d.services.prefill.logs?.file
  const [log, offset] = await readPrefillLog(ctx.host, logFile, ctx.signal)
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

/** P's log and the host's UTC offset (the log's timestamps are local time). */
export function readPrefillLog(
  host: Host,
  logFile: string | undefined,
  signal: AbortSignal,
): Promise<[string | undefined, number | undefined]> {
  return Promise.all([readLog(host, logFile, signal), utcOffsetMin(host, signal)])
}

export const vllmDropDestInfo: VllmExperiment = {
  fault: VLLM_DROP_FAULT,
  summary: "P-only requests, the D leg never sent: P's blocks must be freed at lease expiry from the grant",
  takes: ['requests'],
  async prepare(ctx: VllmContext, opts: VllmFaultOptions) {
    const d = ctx.deployment
    const p = ctx.discovery.servers.find(s => s.role === 'prefill')!
    const plan = vllmDropPlan(p.lease, {
      // Two P-only requests unless --pins says otherwise (each holds P's blocks for a whole lease).
      requests: opts.requests ?? 2,
      logFile: d.services.prefill.logs?.file,
      problems: p.problems,
      ...(d.vllm?.lease ? {declared: d.vllm.lease} : {}),
    })
    if ('refusal' in plan) return plan
    return {
      lines: renderVllmDropPlan(plan),
      plan,
      run: async () => {
        const startedAt = Date.now()
        const {verdicts, notes} = await observeAndJudge(ctx, plan)
        return vllmDropScenario(plan, {startedAt, finishedAt: Date.now(), verdicts, notes})
      },
    }
  },
}
