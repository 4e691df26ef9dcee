import {judgeKvLeases, type KvLeaseVerdict} from '../../../checks/kv-lease.js'
import type {Host} from '../../../hosts/host.js'
import {type LeaseScrape, type PrefillGrant, readLeaseScrape, sendPrefillOnly} from '../client.js'
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
/** How often P's /metrics is scraped while the windows run (the expiry counter as a clock finer than the log's). */
const SCRAPE_MS = 200

/**
 * P's /metrics every SCRAPE_MS from before the first request until stopped (bounded by the run's wait; each scrape
 * has its own deadline): the expiry counter, request_success and kv_cache_usage_perc (src/checks/kv-lease.ts). The
 * first scrape is taken before this returns; stop() takes a last one and returns them all.
 */
async function scrapeLease(url: string, signal: AbortSignal): Promise<{stop: () => Promise<LeaseScrape[]>}> {
  const out: LeaseScrape[] = []
  const one = () =>
    readLeaseScrape(url, 5000, signal).then(
      s => void out.push(s),
      () => undefined,
    )
  await one()
  let on = true
  const loop = (async () => {
    while (on && !signal.aborted) {
      await new Promise(r => setTimeout(r, SCRAPE_MS))
      if (on) await one()
    }
  })()
  return {
    stop: async () => {
      on = false
      await loop
      await one()
      return out
    },
  }
}

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
  const scraper = await scrapeLease(url, ctx.signal)
  let scrapes: LeaseScrape[] = []
  let grants: PrefillGrant[]
  try {
    grants = await sendAll(d, plan.requests, ctx)
    const until = Math.max(...grants.map(g => g.answeredMs)) + plan.waitAfterLastGrantMs
    ctx.progress(`waiting ${((until - Date.now()) / 1000).toFixed(1)} s for every window to close`)
    await sleepUntil(until, ctx.signal, STOPPED)
  } finally {
    scrapes = await scraper.stop()
  }
  const logFile = d.services.prefill.logs?.file
  const [log, offset] = await readPrefillLog(ctx.host, logFile, ctx.signal)
  const observedUntilMs = Date.now()
  const name = 'vllm:nixl_num_kv_expired_reqs'
  const samples = scrapes.flatMap(s => (s.expired === undefined ? [] : [{fromT: s.fromT, t: s.t, value: s.expired}]))
  const traffic = scrapes.flatMap(s =>
    s.finished === undefined
      ? []
      : [{t: s.t, finished: s.finished, ...(s.kvUsage === undefined ? {} : {kvUsage: s.kvUsage})}],
  )
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
    traffic,
  })
  const notes = [
    samples.length
      ? `${name}: ${samples[0]!.value} -> ${samples.at(-1)!.value} over ${samples.length} scrapes ` +
        `(every ${SCRAPE_MS} ms)`
      : `${name}: not exported`,
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
