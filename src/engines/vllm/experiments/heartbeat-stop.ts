import {judgeWedgeLeases, type KvWedgeInput} from '../../../checks/kv-wedge.js'
import {httpRequest, joinUrl} from '../../../deployment/http.js'
import {oneLine, PdError} from '../../../errors.js'
import {ExitCode} from '../../../exit-codes.js'
import {type Probe, runProbes} from '../../../faults/fault.js'
import {withLeases, type LeaseGuard} from '../../../faults/lease/lease-guard.js'
import type {LeaseRecord, ScenarioRun} from '../../../model/run.js'
import type {Verdict} from '../../../model/verdict.js'
import {parsePs} from '../../../discovery/proc.js'
import {type DecodeLeg, type PrefillGrant, sendDecodeLeg, sendPrefillOnly} from '../client.js'
import {serverPort, type VllmProcessTree, vllmProcessTrees} from '../detect.js'
import {stopScenario, type StopTiming} from '../faults/heartbeat-stop.js'
import {installReadStall, planReadStall, type ReadStallHandle, type ReadStallPlan} from '../faults/read-stall.js'
import {parseReleaseLog} from '../log-lines.js'
import {logsAtDebug, parseRenewalLog} from '../renewal-log.js'
import type {VllmContext} from './experiment.js'
import {servedModel, sleepUntil} from './host-reads.js'
import {readPrefillLog} from './drop-dest-info.js'

/**
 * The run wedge-rank --side decode and kill-decode share on vLLM: hold D's READs (the READ stall on P's data path,
 * faults/read-stall.ts) so that D keeps the requests in WAITING_FOR_REMOTE_KVS and heartbeats P's lease; send the
 * renewed requests, hold them, send the fresh ones, stop D (the fault's own step, under its fault lease), keep it
 * stopped until every window closed, read P's log, revert (the fault's own), lift the stall, judge
 * (checks/kv-wedge.ts). Every exit path reverts: the fault lease through withLeases (and the host's reverter at its
 * TTL), the stall through its handle, D's legs aborted.
 */

export interface StopFault {
  fault: string
  mechanism: string
  description: string
  /** What the stop is, for the evidence ("SIGSTOP of D's VLLM::EngineCore"). */
  what: string
  timing: StopTiming
  settings: KvWedgeInput['settings']
  sources: string[]
  leaseTtlMs: number
  /** Install the stop under a fault lease on the guard; resolves once verified (or with the record saying not). */
  stop(guard: LeaseGuard): Promise<LeaseRecord>
  /** Take it out (and prove D back); returns the verdicts about D after the revert. */
  revert(guard: LeaseGuard, record: LeaseRecord): Promise<Verdict[]>
}

/** D's process tree on the host (ps), matched by D's port. */
export async function decodeTree(ctx: VllmContext): Promise<VllmProcessTree | undefined> {
  const ps = await ctx.host.run(['ps', '-eo', 'pid=,ppid=,stat=,args='], {timeoutMs: 10_000, signal: ctx.signal})
  const port = Number(new URL(ctx.deployment.services.decode.url).port || 80)
  return vllmProcessTrees(parsePs(ps.stdout)).find(t => serverPort(t.server.args.split(/\s+/)) === port)
}

/** A process's start time (/proc/<pid>/stat field 22), undefined when unreadable. */
export async function startTicksOf(ctx: VllmContext, pid: number): Promise<number | undefined> {
  const r = await ctx.host.run(['cat', `/proc/${pid}/stat`], {timeoutMs: 10_000, signal: ctx.signal})
  if (r.code !== 0) return undefined
  const v = Number(r.stdout.slice(r.stdout.lastIndexOf(')') + 2).split(' ')[19])
  return Number.isInteger(v) ? v : undefined
}

/** The READ stall's plan for this run (reads only), or the refusal. */
export function planStall(ctx: VllmContext, fault: string, ttlMs: number) {
  return planReadStall(
    {host: ctx.host, deployment: ctx.deployment, discovery: ctx.discovery, signal: ctx.signal},
    {ttlMs, fault, command: `inject ${fault}`},
  )
}

interface Held {
  grants: PrefillGrant[]
  legs: DecodeLeg[]
  /** D legs that ended (answered or failed) while the run went on, in the order they did. */
  ended: string[]
  notes: string[]
}

/** Send n requests as the toy proxy does (P leg, then D's with P's kv_transfer_params), and wait for D's READs. */
async function sendHeld(ctx: VllmContext, stall: ReadStallHandle, n: number, into: Held, kind: string) {
  const d = ctx.deployment
  const model = await servedModel(d.services.prefill.url, ctx.signal)
  const before = (await stall.verify()).matchedPackets ?? 0
  for (let i = 0; i < n; i++) {
    const req = {model, prompt: 'x '.repeat(64), timeoutMs: 30_000, signal: ctx.signal}
    const grant = await sendPrefillOnly({...req, baseUrl: d.services.prefill.url})
    into.grants.push(grant)
    const leg = sendDecodeLeg({...req, baseUrl: d.services.decode.url, grant, timeoutMs: 600_000})
    into.legs.push(leg)
    void leg.done.then(r => into.ended.push(`${grant.requestId}: ${'status' in r ? r.status : r.error}`.slice(0, 160)))
    ctx.progress(`${kind}: ${grant.requestId} granted by P, sent to D`)
  }
  // D's READ hits the stall: the drop rule counts its SYN (D holds the request in WAITING_FOR_REMOTE_KVS).
  const until = Date.now() + 10_000
  let seen = before
  while (Date.now() < until && seen - before < n) {
    await sleepUntil(Date.now() + 100, ctx.signal, 'D legs aborted, the stall lifted')
    seen = (await stall.verify()).matchedPackets ?? seen
  }
  into.notes.push(
    `${kind}: the stall's rule matched ${seen - before} packet(s) from D's READs after ${n} D leg(s); ` +
      (into.ended.length > 0 ? `D legs ended already: ${into.ended.join('; ')}` : 'no D leg ended'),
  )
}

/** The whole run: install, send, stop, wait, read, revert; judge. */
export async function runStop(ctx: VllmContext, f: StopFault, stallPlan: ReadStallPlan): Promise<ScenarioRun> {
  const startedAt = Date.now()
  const d = ctx.deployment
  const stateDir = d.stateDir ?? '/run/pdchaos'
  const held: Held = {grants: [], legs: [], ended: [], notes: []}
  const stall = await installReadStall({host: ctx.host, deployment: d, discovery: ctx.discovery}, stallPlan)
  let out: {input: KvWedgeInput; others: Verdict[]; record: LeaseRecord}
  let back: {clean: boolean; evidence: string[]}
  try {
    out = await withLeases(ctx.host, stateDir, guard => observe(ctx, f, stall, held, guard), {actOn: 'second'})
  } finally {
    for (const l of held.legs) l.abort()
    back = await stall.revert().catch((e: unknown) => ({clean: false, evidence: [oneLine(e)]}))
    ctx.progress(`READ stall lifted: ${back.clean ? 'verified clean' : 'NOT verified clean'}`)
  }
  const others: Verdict[] = [
    ...out.others,
    {
      check: 'cleanup',
      subject: 'read-stall',
      verdict: back.clean ? 'pass' : 'fail',
      summary: back.clean ? "READ stall lifted from P's data path, verified clean" : 'READ stall NOT verified clean',
      evidence: {revert: back.evidence},
    },
  ]
  return stopScenario({
    fault: f.fault,
    mechanism: f.mechanism,
    description: f.description,
    requests: held.grants.length,
    durationS: f.settings.duration!.seconds,
    startedAt,
    finishedAt: Date.now(),
    verdicts: judgeWedgeLeases(out.input),
    others,
    leases: [out.record],
    notes: [...f.sources, ...held.notes],
  })
}

async function observe(ctx: VllmContext, f: StopFault, stall: ReadStallHandle, held: Held, guard: LeaseGuard) {
  const t = f.timing
  await sendHeld(ctx, stall, t.renewed, held, 'renewed')
  const holdUntil = Math.max(...held.grants.map(g => g.answeredMs)) + t.holdRenewedMs
  ctx.progress(`holding the renewed request(s) ${((holdUntil - Date.now()) / 1000).toFixed(1)} s (D heartbeating)`)
  await sleepUntil(holdUntil, ctx.signal, 'D legs aborted, the stall lifted')
  if (t.fresh > 0) await sendHeld(ctx, stall, t.fresh, held, 'fresh')
  const stopStart = Date.now()
  const record = await f.stop(guard)
  const stopEnd = Date.now()
  let others: Verdict[] = []
  let input: KvWedgeInput
  try {
    if (!record.verifiedInjected)
      throw new PdError(`${f.what} did not take: ${record.evidence.injected.join('; ')}`, {
        exit: ExitCode.unreachable,
        suggestion: 'run `pdchaos status -c FILE` and check that D is a vLLM server this user may signal',
      })
    ctx.progress(`${f.what}; waiting ${(t.holdStopMs / 1000).toFixed(1)} s for every window to close`)
    await sleepUntil(stopEnd + t.holdStopMs, ctx.signal, `${f.what} reverted, the stall lifted`)
    input = await readEvidence(ctx, f, held, {startMs: stopStart, endMs: stopEnd, what: f.what})
  } finally {
    others = await f.revert(guard, record)
  }
  return {input, others, record}
}

async function readEvidence(
  ctx: VllmContext,
  f: StopFault,
  held: Held,
  stop: KvWedgeInput['stop'],
): Promise<KvWedgeInput> {
  const logFile = ctx.deployment.services.prefill.logs?.file
  const [log, offset] = await readPrefillLog(ctx.host, logFile, ctx.signal)
  const observedUntilMs = Date.now()
  const clock = {nearMs: observedUntilMs, ...(offset === undefined ? {} : {utcOffsetMin: offset})}
  const ids = new Set(held.grants.map(g => g.requestId))
  const renewals =
    log !== undefined && logsAtDebug(log) ? parseRenewalLog(log, clock).filter(r => ids.has(r.requestId)) : undefined
  held.notes.push(
    log === undefined
      ? `P's log ${logFile ?? '(not in the deployment file)'} not readable`
      : `P's log read: ${logFile}`,
    renewals === undefined
      ? "P's renewals: not logged (P is not at DEBUG), so the heartbeat edges are assumed"
      : `P's renewals: ${renewals.length} DEBUG line(s) for these requests`,
  )
  return {
    requests: held.grants.map(g => ({requestId: g.requestId, sentMs: g.sentMs, answeredMs: g.answeredMs})),
    settings: f.settings,
    stop,
    ...(log === undefined ? {} : {logReleases: parseReleaseLog(log, clock)}),
    ...(renewals === undefined ? {} : {renewals}),
    observedUntilMs,
  }
}

/** Create the fault lease, run the inject commands, prove the fault in place: the lease record says what happened. */
export async function injectUnder(
  guard: LeaseGuard,
  o: {fault: string; mechanism: string; ttlMs: number; inject: string[][]; revert: string[][]; verify: Probe},
): Promise<LeaseRecord> {
  const lease = await guard.create({
    fault: o.fault,
    params: {mechanism: o.mechanism},
    ttlMs: o.ttlMs,
    revert: o.revert,
    command: `inject ${o.fault}`,
  })
  const record: LeaseRecord = {
    id: lease.id,
    fault: o.fault,
    mechanism: o.mechanism,
    injectedAt: Date.now(),
    revertedAt: null,
    verifiedInjected: false,
    verifiedClean: false,
    expiresAt: lease.expiresAt,
    evidence: {injected: [], clean: []},
  }
  for (const argv of o.inject) {
    const r = await guard.host.run(argv, {timeoutMs: 15_000, sudo: true})
    record.evidence.injected.push(`exit ${r.code}: ${oneLine(r.stdout || r.stderr).slice(0, 300)}`)
    if (r.code !== 0) return record
  }
  // A signal is delivered asynchronously (a process running on another CPU shows state R for a moment after
  // SIGSTOP; a killed one lingers while its memory is freed): the proof is read again, up to 3 s.
  let v = await runProbes(guard.host, [o.verify], 10_000)
  for (let i = 0; i < 30 && !v.ok; i++) {
    await new Promise(r => setTimeout(r, 100))
    v = await runProbes(guard.host, [o.verify], 10_000)
  }
  record.verifiedInjected = v.ok
  record.evidence.injected.push(...v.results.map(x => x.evidence))
  return record
}

/** Revert the fault lease and prove it clean; never throws (the record says what happened). */
export async function revertUnder(guard: LeaseGuard, record: LeaseRecord, verify: Probe): Promise<LeaseRecord> {
  const r = await guard.revert(record.id).catch((e: unknown) => ({status: `failed: ${oneLine(e)}`, exitCode: null}))
  record.revertedAt = Date.now()
  const v = await runProbes(guard.host, [verify], 10_000)
  record.verifiedClean = v.ok && (r.exitCode === 0 || r.status === 'already-reverted')
  record.evidence.clean.push(`revert ${r.status} (exit ${r.exitCode})`, ...v.results.map(x => x.evidence))
  return record
}

/** D's /health now (vLLM: 200, or 503 once the engine is dead): one GET with a deadline. */
export async function decodeHealth(ctx: VllmContext): Promise<{ok: boolean; detail: string}> {
  const s = ctx.deployment.services.decode
  const url = joinUrl(s.url, s.healthPath)
  try {
    const r = await httpRequest({service: 'decode', url, timeoutMs: 5000})
    return {ok: r.status === 200, detail: `GET ${url}: ${r.status}`}
  } catch (error) {
    return {ok: false, detail: `GET ${url}: ${oneLine(error)}`}
  }
}
