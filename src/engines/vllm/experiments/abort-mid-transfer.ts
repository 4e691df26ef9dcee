import {
  type AbortEntryEvidence,
  type AbortedLeaseVerdict,
  abortReleaseWindow,
  judgeAbortedLease,
} from '../../../checks/kv-lease-abort.js'
import {joinUrl, requestText} from '../../../deployment/http.js'
import type {LeaseRecord} from '../../../model/run.js'
import {type DecodeLeg, readNixlCounters, sendDecodeLeg, sendPrefillOnly} from '../client.js'
import {
  ABORT_SEEN_DEADLINE_MS,
  type AbortTrialRecord,
  ENTRY_DEADLINE_MS,
  ENTRY_POLL_MS,
  renderVllmAbortPlan,
  VLLM_ABORT_FAULT,
  type VllmAbortPlan,
  vllmAbortPlan,
  vllmAbortScenario,
} from '../faults/abort-mid-transfer.js'
import {installReadStall, planReadStall, type ReadStallHandle, type ReadStallPlan} from '../faults/read-stall.js'
import {parseReleaseLog, VLLM_LOG_RESOLUTION_MS} from '../log-lines.js'
import {readPrefillLog} from './drop-dest-info.js'
import type {VllmContext, VllmExperiment, VllmFaultOptions} from './experiment.js'
import {servedModel, sleepUntil, stoppedError} from './host-reads.js'

/**
 * abort-mid-transfer on vLLM: under one READ stall (faults/read-stall.ts, a fault lease reverted on every exit path),
 * each trial sends P its leg, sends D its leg, waits until D's /metrics shows the request in its READ, aborts D's leg
 * as a client going away does (its epoch ms recorded), and watches D's gauge fall back (D processed the abort). Then
 * every window is waited out with the READ still held, the stall's counter and P's log are read, the stall reverted,
 * and each trial judged with checks/kv-lease-abort.ts. The plan and record are faults/abort-mid-transfer.ts.
 */

const STOPPED = 'the READ stall is reverted'

/** D's waiting gauges (vLLM's /metrics, summed over label sets of one name); undefined where a series is absent. */
export interface WaitingGauges {
  t: number
  deferred?: number
  waiting?: number
}

/** The gauges from a Prometheus text page, pure. `deferred`: waiting_by_reason{reason="deferred"}. */
export function waitingGauges(text: string, t: number): WaitingGauges {
  const g: WaitingGauges = {t}
  for (const line of text.split('\n')) {
    if (line.startsWith('#')) continue
    const v = Number(line.trim().split(/\s+/).at(-1))
    if (!Number.isFinite(v)) continue
    if (/^vllm:num_requests_waiting_by_reason\{[^}]*reason="deferred"/.test(line)) g.deferred = (g.deferred ?? 0) + v
    else if (/^vllm:num_requests_waiting[{\s]/.test(line)) g.waiting = (g.waiting ?? 0) + v
  }
  return g
}

async function readGauges(url: string, signal: AbortSignal): Promise<WaitingGauges | undefined> {
  const res = await requestText({service: 'decode', url: joinUrl(url, '/metrics'), timeoutMs: 5000, signal}).catch(
    () => undefined,
  )
  if (signal.aborted) throw stoppedError(STOPPED)
  return res && res.status === 200 ? waitingGauges(res.text, Date.now()) : undefined
}

/** Poll D's gauges until `hit` says so or the deadline passes; the sample that hit, or undefined. */
async function pollGauges(
  url: string,
  signal: AbortSignal,
  deadlineMs: number,
  hit: (g: WaitingGauges) => boolean,
): Promise<WaitingGauges | undefined> {
  while (Date.now() < deadlineMs) {
    const g = await readGauges(url, signal)
    if (g && hit(g)) return g
    await sleepUntil(Date.now() + ENTRY_POLL_MS, signal, STOPPED)
  }
  return undefined
}

/** Wait for the request to show in D's READ: the deferred gauge above its baseline, else the waiting gauge. */
async function awaitEntry(url: string, signal: AbortSignal, base: WaitingGauges): Promise<AbortEntryEvidence> {
  const useDeferred = base.deferred !== undefined
  const deadline = Date.now() + ENTRY_DEADLINE_MS
  const above = (g: WaitingGauges) =>
    useDeferred ? (g.deferred ?? 0) > base.deferred! : (g.waiting ?? 0) > (base.waiting ?? 0)
  const g = await pollGauges(url, signal, deadline, above)
  if (g && useDeferred)
    return {by: 'deferred', atMs: g.t, detail: `D's deferred gauge ${base.deferred} -> ${g.deferred}`}
  if (g)
    return {by: 'waiting', atMs: g.t, detail: `no deferred series; D's waiting gauge ${base.waiting} -> ${g.waiting}`}
  return {
    by: 'none',
    detail:
      `D's ${useDeferred ? 'deferred' : 'waiting'} gauge did not rise above ` +
      `${useDeferred ? base.deferred : (base.waiting ?? 'absent')} within ${ENTRY_DEADLINE_MS} ms`,
  }
}

interface Trial {
  record: AbortTrialRecord
  entry: AbortEntryEvidence
  leg: DecodeLeg
}

/** One trial: P's leg, D's leg, the READ shown, the client abort, D seen to process it. */
async function runTrial(ctx: VllmContext, model: string, i: number): Promise<Trial> {
  const d = ctx.deployment
  const dUrl = d.services.decode.url
  const base = (await readGauges(dUrl, ctx.signal)) ?? {t: Date.now()}
  const prompt = `abort ${i} `.repeat(32)
  const grant = await sendPrefillOnly({
    baseUrl: d.services.prefill.url,
    model,
    prompt,
    timeoutMs: 30_000,
    signal: ctx.signal,
  })
  const leg = sendDecodeLeg({baseUrl: dUrl, model, prompt, timeoutMs: 120_000, grant, signal: ctx.signal})
  const entry = await awaitEntry(dUrl, ctx.signal, base)
  leg.abort()
  const abortedMs = leg.abortedMs!
  ctx.progress(`${grant.requestId}: ${entry.detail}; aborted D's leg at ${new Date(abortedMs).toISOString()}`)
  const key = base.deferred !== undefined ? 'deferred' : 'waiting'
  const fell = await pollGauges(
    dUrl,
    ctx.signal,
    Date.now() + ABORT_SEEN_DEADLINE_MS,
    g => (g[key] ?? 0) <= (base[key] ?? 0),
  )
  await leg.done
  return {
    record: {
      requestId: grant.requestId,
      sentMs: grant.sentMs,
      answeredMs: grant.answeredMs,
      decodeSentMs: leg.sentMs,
      ...(entry.atMs === undefined ? {} : {entrySeenMs: entry.atMs}),
      abortedMs,
      ...(fell ? {dAbortSeenMs: fell.t} : {}),
    },
    entry,
    leg,
  }
}

/** The stall's lease as the run model records it. */
function leaseRecord(
  plan: ReadStallPlan,
  h: ReadStallHandle | undefined,
  held: {ok: boolean; evidence: string} | undefined,
  back: {clean: boolean; evidence: string[]; revertedAt: number} | undefined,
): LeaseRecord {
  return {
    id: plan.leaseId,
    fault: VLLM_ABORT_FAULT,
    mechanism: "read-stall (packet filter on P's data path)",
    injectedAt: h?.injectedAt ?? null,
    revertedAt: back?.revertedAt ?? null,
    verifiedInjected: h !== undefined,
    verifiedClean: back?.clean ?? false,
    expiresAt: (h?.injectedAt ?? Date.now()) + plan.ttlMs,
    evidence: {injected: held ? [held.evidence] : [], clean: back?.evidence ?? []},
  }
}

interface Observed {
  trials: Trial[]
  held?: {ok: boolean; evidence: string; matchedPackets?: number}
  log?: string
  offset?: number
  observedUntilMs: number
  counters: string[]
}

/** The trials, the wait for every window with the READ held, the stall's counter and P's log (stall still in). */
async function observe(ctx: VllmContext, plan: VllmAbortPlan, stall: ReadStallHandle): Promise<Observed> {
  const d = ctx.deployment
  const model = await servedModel(d.services.prefill.url, ctx.signal)
  const before = await readNixlCounters(d.services.prefill.url, 10_000).catch(() => undefined)
  const trials: Trial[] = []
  for (let i = 0; i < plan.requests; i++) trials.push(await runTrial(ctx, model, i))
  const closes = trials.map(t => abortReleaseWindow(judgeInput(plan, t))?.closeMs ?? Date.now())
  const until = Math.max(...closes) + VLLM_LOG_RESOLUTION_MS + 500
  ctx.progress(`waiting ${((until - Date.now()) / 1000).toFixed(1)} s for every window to close, the READ held`)
  await sleepUntil(until, ctx.signal, STOPPED)
  const held = await stall.verify()
  const after = await readNixlCounters(d.services.prefill.url, 10_000).catch(() => undefined)
  const [log, offset] = await readPrefillLog(ctx.host, d.services.prefill.logs?.file, ctx.signal)
  const name = 'vllm:nixl_num_kv_expired_reqs'
  const counters = [`${name}: ${[before, after].map(s => s?.values[name] ?? 'not exported').join(' -> ')}`]
  return {
    trials,
    held,
    ...(log === undefined ? {} : {log}),
    ...(offset === undefined ? {} : {offset}),
    observedUntilMs: Date.now(),
    counters,
  }
}

function judgeInput(plan: VllmAbortPlan, t: Trial, o?: Observed, held?: {held: boolean; evidence: string}) {
  const r = t.record
  return {
    requestId: r.requestId,
    sentMs: r.sentMs,
    answeredMs: r.answeredMs,
    abortMs: r.abortedMs,
    entry: t.entry,
    ...(r.dAbortSeenMs === undefined ? {} : {dAbortSeenMs: r.dAbortSeenMs}),
    readHeld: held ?? {held: false, evidence: 'not read yet'},
    settings: plan.settings,
    ...(o?.log === undefined
      ? {}
      : {
          logReleases: parseReleaseLog(o.log, {
            nearMs: o.observedUntilMs,
            ...(o.offset === undefined ? {} : {utcOffsetMin: o.offset}),
          }),
        }),
    observedUntilMs: o?.observedUntilMs ?? 0,
  }
}

/** Whether the stall held the READ through every window: in place at the end, and its rule dropped packets. */
function heldOf(o: Observed): {held: boolean; evidence: string} {
  const h = o.held
  if (!h) return {held: false, evidence: 'the stall was not read after the windows'}
  const dropped = (h.matchedPackets ?? 0) > 0
  return {
    held: h.ok && dropped,
    evidence: `${h.evidence}${dropped ? '' : ' (its rule matched no packet: the READ may not have gone through it)'}`,
  }
}

async function runAll(ctx: VllmContext, plan: VllmAbortPlan, stallPlan: ReadStallPlan) {
  const startedAt = Date.now()
  const stall = await installReadStall(ctx, stallPlan)
  let o: Observed | undefined
  let back: Awaited<ReturnType<ReadStallHandle['revert']>> | undefined
  try {
    o = await observe(ctx, plan, stall)
  } finally {
    back = await stall.revert()
    ctx.progress(
      `READ stall reverted: ${back.clean ? 'verified clean' : `NOT verified clean: ${back.evidence.join('; ')}`}`,
    )
  }
  const held = heldOf(o)
  const verdicts: AbortedLeaseVerdict[] = o.trials.map(t => judgeAbortedLease(judgeInput(plan, t, o, held)))
  return vllmAbortScenario(plan, {
    startedAt,
    finishedAt: Date.now(),
    verdicts,
    trials: o.trials.map(t => t.record),
    leases: [leaseRecord(stallPlan, stall, o.held, back)],
    notes: [...o.counters, `READ held: ${held.evidence}`],
  })
}

export const vllmAbortMidTransfer: VllmExperiment = {
  fault: VLLM_ABORT_FAULT,
  summary: "a client abort of D's request while its READ is held: P must free its blocks at lease expiry",
  takes: ['requests', 'ttlS'],
  async prepare(ctx: VllmContext, opts: VllmFaultOptions) {
    const d = ctx.deployment
    const p = ctx.discovery.servers.find(s => s.role === 'prefill')!
    const plan = vllmAbortPlan(p.lease, {
      requests: opts.requests ?? 2,
      ...(opts.ttlS === undefined ? {} : {ttlS: opts.ttlS}),
      logFile: d.services.prefill.logs?.file,
      problems: p.problems,
      ...(d.vllm?.lease ? {declared: d.vllm.lease} : {}),
    })
    if ('refusal' in plan) return plan
    const stallPlan = await planReadStall(ctx, {ttlMs: plan.stallTtlS * 1000, fault: VLLM_ABORT_FAULT})
    if ('refusal' in stallPlan) return stallPlan
    return {
      lines: [...renderVllmAbortPlan(plan), ...stallPlan.lines],
      plan: {
        ...plan,
        stall: {leaseId: stallPlan.leaseId, listeners: stallPlan.listeners, filter: stallPlan.filter.summary},
      },
      run: () => runAll(ctx, plan, stallPlan),
    }
  },
}
