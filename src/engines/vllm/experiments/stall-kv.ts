import {judgeKvLeases} from '../../../checks/kv-lease.js'
import {type DecodeState, judgeKvPinned, type StalledRequest} from '../../../checks/kv-pinned.js'
import {httpRequest, joinUrl} from '../../../deployment/http.js'
import type {LeaseRecord, ScenarioRun} from '../../../model/run.js'
import {
  counterValue,
  type DecodeLeg,
  type PrefillGrant,
  readNixlCounters,
  sendDecodeLeg,
  sendPrefillOnly,
} from '../client.js'
import {type ReadStallHandle, type ReadStallPlan, installReadStall, planReadStall} from '../faults/read-stall.js'
import {
  heartbeatsSeen,
  sideChannelBytesIn,
  sideChannelSsArgv,
  type VllmStallPlan,
  VLLM_STALL_FAULT,
  renderVllmStallPlan,
  vllmStallPlan,
  vllmStallScenario,
} from '../faults/stall-kv.js'
import {parseEnviron} from '../../../discovery/proc.js'
import {parseReleaseLog, type ReleaseObservation} from '../log-lines.js'
import {type LogLevelEvidence, logLevelFromEnv, parseRenewalLog, type RenewalObservation} from '../renewal-log.js'
import {readPrefillLog} from './drop-dest-info.js'
import type {VllmContext, VllmExperiment, VllmFaultOptions} from './experiment.js'
import {servedModel, sleepUntil} from './host-reads.js'

/**
 * stall-kv on vLLM: stall P's data path (read-stall.ts, under a fault lease), send `--pins` requests through both legs
 * (P, then D with P's kv_transfer_params) and one P-only bystander, observe until the bound, read P's log and counters
 * and D's state, lift the filter, wait (bounded) for D's READs to finish, and judge: the stalled requests with
 * checks/kv-pinned.ts, the bystander with checks/kv-lease.ts. The plan and record are faults/stall-kv.ts.
 */

const PROMPT = 'x '.repeat(64)

type Settled = Awaited<DecodeLeg['done']>

interface Sent {
  grants: PrefillGrant[]
  legs: DecodeLeg[]
  settled: Map<string, Settled>
  bystanders: PrefillGrant[]
}

async function sendAll(ctx: VllmContext, plan: VllmStallPlan, legTimeoutMs: number): Promise<Sent> {
  const d = ctx.deployment
  const model = await servedModel(d.services.prefill.url, ctx.signal)
  const sent: Sent = {grants: [], legs: [], settled: new Map(), bystanders: []}
  const p = {baseUrl: d.services.prefill.url, model, prompt: PROMPT, timeoutMs: 30_000, signal: ctx.signal}
  for (let i = 0; i < plan.requests; i++) {
    const g = await sendPrefillOnly(p)
    const leg = sendDecodeLeg({...p, baseUrl: d.services.decode.url, timeoutMs: legTimeoutMs, grant: g})
    void leg.done.then(x => sent.settled.set(g.requestId, x))
    sent.grants.push(g)
    sent.legs.push(leg)
    ctx.progress(`sent ${g.requestId}: P answered, D's leg sent (its READ meets the stall)`)
  }
  for (let i = 0; i < plan.bystanders; i++) {
    sent.bystanders.push(await sendPrefillOnly(p))
    ctx.progress(`sent bystander ${sent.bystanders.at(-1)!.requestId} to P only; no D leg`)
  }
  return sent
}

async function decodeState(ctx: VllmContext): Promise<DecodeState> {
  const url = ctx.deployment.services.decode
  const get = (path: string) =>
    httpRequest({service: 'decode', url: joinUrl(url.url, path), timeoutMs: 10_000}).catch(() => undefined)
  const [h, m] = await Promise.all([get(url.healthPath), get('/metrics')])
  const waiting = m?.status === 200 ? counterValue(m.text, 'vllm:num_requests_waiting') : undefined
  return {healthy: h?.status === 200, ...(waiting === undefined ? {} : {waiting}), t: Date.now()}
}

interface Observed {
  /** The stalled requests as they stood at the end of the observation (D's legs settled by then, or not). */
  stalled: StalledRequest[]
  releases?: ReleaseObservation[]
  observedUntilMs: number
  decode: DecodeState
  matchedPackets?: number
  expiredAfter?: number
  heartbeats: {reachedP: boolean; evidence: string}
  /** P's renewal lines (DEBUG) for this run's requests; undefined when its log was unreadable. */
  renewals?: RenewalObservation[]
}

/** P's log level from its environment (/proc/<pid>/environ over the Host interface, as read-stall.ts reads it). */
async function prefillLogLevel(ctx: VllmContext): Promise<LogLevelEvidence> {
  const pid = ctx.discovery.servers.find(s => s.role === 'prefill')?.pid
  if (pid === undefined) return logLevelFromEnv(undefined, "P's environment (no pid)")
  const r = await ctx.host.run(['cat', `/proc/${pid}/environ`], {timeoutMs: 10_000, sudo: true, signal: ctx.signal})
  return logLevelFromEnv(r.code === 0 ? parseEnviron(r.stdout) : undefined, `P's environment (/proc/${pid}/environ)`)
}

/** Bytes into P's side channel now (`ss -tin` over the Host interface), undefined without a connection. */
async function sideChannelIn(ctx: VllmContext, port: number | undefined): Promise<number | undefined> {
  if (port === undefined) return undefined
  const r = await ctx.host.run(sideChannelSsArgv(port), {timeoutMs: 10_000, sudo: true, signal: ctx.signal})
  return r.code === 0 ? sideChannelBytesIn(r.stdout) : undefined
}

async function observe(
  ctx: VllmContext,
  handle: ReadStallHandle,
  sent: Sent,
  side: {port: number | undefined; before: number | undefined},
): Promise<Observed> {
  const observedUntilMs = Date.now()
  const stalled = stalledOf(sent)
  const heartbeats = heartbeatsSeen(side.port, side.before, await sideChannelIn(ctx, side.port))
  const [decode, filter, counters] = await Promise.all([
    decodeState(ctx),
    handle.verify(),
    readNixlCounters(ctx.deployment.services.prefill.url, 10_000).catch(() => undefined),
  ])
  const [log, offset] = await readPrefillLog(ctx.host, ctx.deployment.services.prefill.logs?.file, ctx.signal)
  const clock = {nearMs: observedUntilMs, ...(offset === undefined ? {} : {utcOffsetMin: offset})}
  const releases = log === undefined ? undefined : parseReleaseLog(log, clock).filter(r => r.t <= observedUntilMs)
  const ids = new Set([...sent.grants, ...sent.bystanders].map(g => g.requestId))
  const renewals =
    log === undefined
      ? undefined
      : parseRenewalLog(log, clock).filter(r => ids.has(r.requestId) && r.t <= observedUntilMs)
  const expiredAfter = counters?.values['vllm:nixl_num_kv_expired_reqs']
  return {
    stalled,
    heartbeats,
    ...(renewals ? {renewals} : {}),
    ...(releases ? {releases} : {}),
    observedUntilMs,
    decode,
    ...(filter.matchedPackets === undefined ? {} : {matchedPackets: filter.matchedPackets}),
    ...(expiredAfter === undefined ? {} : {expiredAfter}),
  }
}

const stalledOf = (s: Sent): StalledRequest[] =>
  s.grants.map((g, i) => {
    const x = s.settled.get(g.requestId)
    const settled =
      x === undefined
        ? undefined
        : 'error' in x
          ? {atMs: x.answeredMs, error: x.error}
          : {atMs: x.answeredMs, status: x.status, text: x.text.slice(0, 200)}
    return {
      requestId: g.requestId,
      sentMs: g.sentMs,
      answeredMs: g.answeredMs,
      decodeSentMs: s.legs[i]!.sentMs,
      ...(settled ? {decodeSettled: settled} : {}),
    }
  })

/** After the revert: each leg's end (bounded by the plan), then the legs still open are cut. Lines for the record. */
async function afterRevert(ctx: VllmContext, plan: VllmStallPlan, sent: Sent, revertedAt: number): Promise<string[]> {
  const open = sent.legs.filter(l => !sent.settled.has(l.requestId))
  const deadline = revertedAt + plan.afterRevertMs
  await Promise.race([Promise.all(open.map(l => l.done)), sleepUntil(deadline, ctx.signal, 'the filter is lifted')])
  const lines = open.map(l => {
    const x = sent.settled.get(l.requestId)
    if (x === undefined)
      return `${l.requestId}: D's leg still unanswered ${plan.afterRevertMs / 1000} s after the revert`
    const after = ((x.answeredMs - revertedAt) / 1000).toFixed(1)
    return 'error' in x
      ? `${l.requestId}: D's leg failed ${after} s after the revert (${x.error})`
      : `${l.requestId}: D answered ${x.status} ${after} s after the revert` +
          (x.status === 200 ? " (the READ completed; its notification frees P's blocks)" : '')
  })
  for (const l of open) if (!sent.settled.has(l.requestId)) l.abort()
  return lines
}

/**
 * Bystanders not released during the observation: their release lines once the stalled READs completed (one step and
 * the log's second later), as a note: a reaper that stops at a renewed head frees them only behind it.
 */
async function bystandersAfter(ctx: VllmContext, plan: VllmStallPlan, sent: Sent, seen: Observed): Promise<string[]> {
  const late = sent.bystanders.filter(g => !seen.releases?.some(r => r.requestId === g.requestId))
  if (late.length === 0 || seen.releases === undefined) return []
  await sleepUntil(Date.now() + 1500, ctx.signal, 'the filter is lifted')
  const [log, offset] = await readPrefillLog(ctx.host, ctx.deployment.services.prefill.logs?.file, ctx.signal)
  const clock = {nearMs: Date.now(), ...(offset === undefined ? {} : {utcOffsetMin: offset})}
  const releases = log === undefined ? [] : parseReleaseLog(log, clock)
  const d = plan.settings.duration!.seconds * 1000
  return late.map(g => {
    const r = releases.find(x => x.requestId === g.requestId)
    if (!r) return `bystander ${g.requestId}: still no release line after the revert`
    const past = ((r.t - (g.answeredMs + d)) / 1000).toFixed(1)
    return `bystander ${g.requestId}: released ${past} s or more past its lease, only after the revert ("${r.line}")`
  })
}

function leaseRecord(stall: ReadStallPlan, handle: ReadStallHandle, ev: {injected: string[]; clean: string[]}) {
  return (r: {clean: boolean; revertedAt: number}): LeaseRecord => ({
    id: stall.leaseId,
    fault: VLLM_STALL_FAULT,
    mechanism: 'packet-filter',
    injectedAt: handle.injectedAt,
    revertedAt: r.revertedAt,
    verifiedInjected: true,
    verifiedClean: r.clean,
    expiresAt: handle.injectedAt + stall.ttlMs,
    evidence: ev,
  })
}

async function runStall(ctx: VllmContext, plan: VllmStallPlan, stall: ReadStallPlan): Promise<ScenarioRun> {
  const startedAt = Date.now()
  const url = ctx.deployment.services.prefill.url
  const before = await readNixlCounters(url, 10_000).catch(() => undefined)
  const level = await prefillLogLevel(ctx)
  const handle = await installReadStall(ctx, stall)
  const ev = {injected: [(await handle.verify()).evidence], clean: [] as string[]}
  let sent: Sent | undefined
  let seen: Observed | undefined
  try {
    sent = await sendAll(ctx, plan, plan.observeAfterLastAnswerMs + plan.afterRevertMs + 60_000)
    const port = stall.sideChannelPorts[0]
    const side = {port, before: await sideChannelIn(ctx, port)}
    const until = Math.max(...sent.grants.map(g => g.answeredMs)) + plan.observeAfterLastAnswerMs
    ctx.progress(`observing ${((until - Date.now()) / 1000).toFixed(1)} s with the READ stalled`)
    await sleepUntil(until, ctx.signal, 'reverting the READ stall')
    seen = await observe(ctx, handle, sent, side)
  } finally {
    const r = await handle.revert()
    ev.clean.push(...r.evidence)
    ctx.progress(
      r.clean ? `READ stall lifted: ${r.evidence.join('; ')}` : `NOT verified clean: ${r.evidence.join('; ')}`,
    )
    if (ctx.signal.aborted) for (const l of sent?.legs ?? []) l.abort()
  }
  const reverted = await handle.revert()
  const after = await afterRevert(ctx, plan, sent!, reverted.revertedAt)
  after.push(...(await bystandersAfter(ctx, plan, sent!, seen!)))
  const expired = before?.values['vllm:nixl_num_kv_expired_reqs']
  const lease = leaseRecord(stall, handle, ev)(reverted)
  return judge(plan, {
    sent: sent!,
    seen: seen!,
    level,
    ...(expired === undefined ? {} : {before: expired}),
    startedAt,
    after,
    lease,
  })
}

function judge(
  plan: VllmStallPlan,
  o: {
    sent: Sent
    seen: Observed
    level: LogLevelEvidence
    before?: number
    startedAt: number
    after: string[]
    lease: LeaseRecord
  },
): ScenarioRun {
  const {seen} = o
  const pinned = judgeKvPinned({
    requests: seen.stalled,
    settings: plan.settings,
    ...(seen.releases ? {logReleases: seen.releases} : {}),
    ...(seen.renewals ? {renewals: seen.renewals} : {}),
    prefillLogLevel: o.level,
    observedUntilMs: seen.observedUntilMs,
    decode: seen.decode,
    heartbeats: seen.heartbeats,
    ...(seen.matchedPackets === undefined ? {} : {matchedPackets: seen.matchedPackets}),
    ...(o.before !== undefined && seen.expiredAfter !== undefined
      ? {expiredCounter: {before: o.before, after: seen.expiredAfter}}
      : {}),
  })
  const bystanders = judgeKvLeases({
    requests: o.sent.bystanders.map(g => ({
      requestId: g.requestId,
      sentMs: g.sentMs,
      answeredMs: g.answeredMs,
      decodeSent: false,
    })),
    settings: plan.settings,
    ...(seen.releases ? {logReleases: seen.releases} : {}),
    observedUntilMs: seen.observedUntilMs,
  })
  const notes = [
    `vllm:nixl_num_kv_expired_reqs: ${o.before ?? 'not exported'} -> ${seen.expiredAfter ?? 'not exported'}`,
    `filter dropped ${seen.matchedPackets ?? '?'} packet(s) to P's data port`,
    `heartbeats: ${seen.heartbeats.evidence}`,
    `P's log level: ${o.level.evidence}; renewal lines for this run's requests: ` +
      (seen.renewals ? String(seen.renewals.length) : "P's log unreadable"),
    ...o.after.map(l => `after the revert: ${l}`),
  ]
  return vllmStallScenario(plan, {
    startedAt: o.startedAt,
    finishedAt: Date.now(),
    pinned,
    bystanders,
    lease: o.lease,
    notes,
  })
}

export const vllmStallKv: VllmExperiment = {
  fault: VLLM_STALL_FAULT,
  summary: "D's READ stalled on P's data path while D heartbeats: P's blocks must not stay pinned for ever",
  takes: ['requests', 'gpu', 'ttlS'],
  async prepare(ctx: VllmContext, opts: VllmFaultOptions) {
    const d = ctx.deployment
    const p = ctx.discovery.servers.find(s => s.role === 'prefill')!
    const plan = vllmStallPlan(p.lease, {
      requests: opts.requests ?? 2,
      logFile: d.services.prefill.logs?.file,
      problems: p.problems,
      ...(opts.gpu === undefined ? {} : {gpu: opts.gpu}),
    })
    if ('refusal' in plan) return plan
    // The host lifts the filter by itself at the TTL: the observation, the wait after the revert, and a margin.
    const needMs = plan.observeAfterLastAnswerMs + 60_000
    const ttlMs = opts.ttlS !== undefined ? opts.ttlS * 1000 : needMs + 60_000
    if (ttlMs < needMs)
      return {
        refusal:
          `--ttl ${opts.ttlS} s would lift the stall before the observation ends ` + `(${Math.ceil(needMs / 1000)} s)`,
        hint: `pass --ttl ${Math.ceil(needMs / 1000)} or more, or drop --ttl`,
      }
    const stall = await planReadStall(ctx, {
      ttlMs,
      fault: VLLM_STALL_FAULT,
      ...(opts.gpu === undefined ? {} : {gpu: opts.gpu}),
    })
    if ('refusal' in stall) return stall
    return {
      lines: renderVllmStallPlan(plan, stall.lines),
      plan: {...plan, stall: {leaseId: stall.leaseId, ports: stall.listeners.map(l => l.port), ttlMs}},
      run: () => runStall(ctx, plan, stall),
    }
  },
}
