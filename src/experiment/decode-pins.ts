import type {DecodeReleaseExpectation} from '../checks/decode-release.js'
import {LOADS_DECODE_PREALLOC_QUEUE, LOADS_DECODE_TRANSFER_QUEUE} from '../engines/sglang/sglang-metrics.js'
import {newRid, newRoom} from '../engines/sglang/deployment/sglang-client.js'
import {oneLine} from '../errors.js'
import {getFault} from '../faults/registry.js'
import {coRestart, roleTargets} from '../restart/co-restart.js'
import {sleep, within} from '../util/time.js'
import {now, Recorder} from '../workload/recorder.js'
import {type SampledServer, sampleOnce} from '../workload/sampler.js'
import {type Sent, sendDirect} from '../workload/send.js'
import type {FaultPlan} from '../faults/fault.js'
import type {Timeline} from '../model/timeline.js'
import {checkDecodeRelease} from '../checks/decode-release.js'
import type {Verdict} from '../model/verdict.js'
import type {BatchScenario} from './batch-scenario.js'
import type {PairInBatch} from './batch-pairs.js'
import type {RunSession} from './session.js'

/**
 * The observation of a fault that kills prefill (Fault.observe 'decode-pins'): decode's halves of requests, held in
 * decode's transfer queue when prefill dies. Each is a request sent to decode alone with a fresh bootstrap room,
 * prefill's half held back by pdchaos: decode resolves the room on prefill's bootstrap server, allocates its KV pages,
 * sends its destination info (send_metadata) and waits in WaitingForInput for KV that never comes
 * (disaggregation/decode.py: prealloc queue, then transfer queue). Once decode's /v1/loads shows them held, the kill is
 * injected; the runner then waits for each half's answer until the expectation's window ends, aborts what decode still
 * holds, and restarts prefill by its restart command behind its health gate (as `restart --only prefill` does) before
 * the lease's revert verifies it. checks/decode-release.ts judges the releases.
 */

/** How long decode may take to show its halves held (a /route lookup and send_metadata), polled. */
const HELD_WAIT_MS = 5000
const HELD_POLL_MS = 100
const RESTART_TIMEOUT_S = 120
/** The direct request that tells a stale decode after prefill's restart: past the watchdog's deadline on the twin. */
const STALE_PROBE_MS = 15_000

/** What this module reads of a batch's scenario entry (experiment/judge.ts Entry). */
export interface Entry {
  s: BatchScenario
  plan?: FaultPlan
  lease?: {injectedAt: number | null}
}

export interface DecodePins {
  entry: Entry
  /** The scenario is among the batch's active ones (its fault took effect): the runner waits for its releases. */
  observes(active: readonly Entry[]): boolean
  expected: DecodeReleaseExpectation
  sent: Sent[]
  /** After the kill: until every half is answered or the window (from the kill) has passed. */
  waitReleased(signal: AbortSignal): Promise<void>
  /**
   * Abort what decode still holds, then restart prefill behind its health gate. Never throws. Records the batch's floor
   * (marker batch-floor): decode's heartbeat bound (SGLang's default where unread) and prefill's health wait after its
   * restart command, as a restart batch counts its health waits.
   */
  restore(say: (l: string) => void): Promise<void>
}

/** The verdicts on decode's halves (checks/decode-release.ts) from the plan's expectation. */
export function decodeVerdicts(tl: Timeline, plan: FaultPlan): Verdict[] {
  return checkDecodeRelease(tl, plan.expected?.kind === 'decode-release' ? plan.expected : undefined)
}

/** The one scenario of the batch that observes decode pins (its footprint is exclusive), or undefined. */
function decodePinEntry(planned: Entry[]): Entry | undefined {
  return planned.find(
    e => getFault(e.plan!.fault).observe === 'decode-pins' && e.plan!.expected?.kind === 'decode-release',
  )
}

/** One request to decode alone, as the gateway would send decode's half, recorded as a pin with path decode-half. */
function sendDecodeHalf(session: RunSession, rec: Recorder, e: Entry, o: HoldOptions): Sent {
  const rid = newRid('pdchaos-dpin')
  const sentAt = now()
  rec.add({
    kind: 'request-sent',
    t: sentAt,
    rid,
    role: 'pin',
    fault: e.plan!.fault,
    scenario: e.s.name,
    path: 'decode-half',
  })
  const body = {
    rid,
    text: 'chaos '.repeat(Math.max(1, Math.round((o.promptTokens * 4) / 6))),
    max_new_tokens: 4,
    bootstrap_host: session.bootstrap.host,
    bootstrap_port: session.bootstrap.port,
    bootstrap_room: newRoom(),
  }
  const done = session.decode.generate(body, {timeoutMs: o.timeoutMs, signal: o.signal}).then(
    res => {
      const at = now()
      const detail =
        res.status >= 300 ? (typeof res.body === 'string' ? res.body : JSON.stringify(res.body)) : undefined
      rec.add({kind: 'request-answered', t: at, rid, status: res.status, detail: detail?.slice(0, 1000)})
      return {status: res.status, at}
    },
    (error: unknown) => {
      const at = now()
      rec.add({kind: 'request-abandoned', t: at, rid, detail: oneLine(error)})
      return {status: null, at}
    },
  )
  return {rid, sentAt, done}
}

export interface HoldOptions {
  promptTokens: number
  timeoutMs: number
  signal: AbortSignal
  say: (l: string) => void
}

/** decode's prealloc + transfer queue at its latest /v1/loads reading (undefined: none). */
function latestHeld(rec: Recorder): number | undefined {
  const reads = rec.observations.filter(
    o =>
      o.kind === 'metric' &&
      o.service === 'decode' &&
      (o.name === LOADS_DECODE_PREALLOC_QUEUE || o.name === LOADS_DECODE_TRANSFER_QUEUE),
  ) as Array<{t: number; value: number}>
  const t = reads.at(-1)?.t
  return t === undefined ? undefined : reads.filter(r => r.t === t).reduce((n, r) => n + r.value, 0)
}

/**
 * A batch's decode-pins scenario (a run, not a dry run or a hold): send its halves before the kill and wait (bounded)
 * until decode's /v1/loads shows them held. Undefined when the batch has none.
 */
export async function holdHalves(
  planned: Entry[],
  pairOf: (s: BatchScenario) => PairInBatch,
  rec: Recorder,
  servers: SampledServer[],
  settings: {mode: string; promptTokens: number; say: (l: string) => void},
  timeoutMs: number,
  signal: AbortSignal,
): Promise<DecodePins | undefined> {
  const e = settings.mode === 'run' ? decodePinEntry(planned) : undefined
  if (!e || signal.aborted) return undefined
  return holdDecodeHalves(pairOf(e.s).session, e, rec, servers, {...settings, timeoutMs, signal})
}

async function holdDecodeHalves(
  session: RunSession,
  e: Entry,
  rec: Recorder,
  servers: SampledServer[],
  o: HoldOptions,
): Promise<DecodePins> {
  const expected = e.plan!.expected as DecodeReleaseExpectation
  o.say(`${e.s.name}: sending ${expected.pins} decode half(s), prefill's half held back`)
  // Each half stays open until the release wait ends (from the kill, after the held wait), whatever the batch's
  // window: a client that gave up first would end the watch before decode's bound.
  const open = {...o, timeoutMs: Math.max(o.timeoutMs, HELD_WAIT_MS + expected.waitSeconds * 1000 + 10_000)}
  const sent = Array.from({length: expected.pins}, () => sendDecodeHalf(session, rec, e, open))
  const by = now() + HELD_WAIT_MS
  let held: number | undefined
  while (now() < by && !o.signal.aborted) {
    await sampleOnce(rec, servers)
    held = latestHeld(rec)
    if (held !== undefined && held >= expected.pins) break
    await sleep(HELD_POLL_MS, o.signal)
  }
  rec.marker('decode-halves-held', held === undefined ? 'no /v1/loads reading' : `${held} in decode's queues`)
  o.say(`${e.s.name}: decode holds ${held ?? 'an unknown number of'} request(s) in its prealloc + transfer queues`)
  return {
    entry: e,
    expected,
    sent,
    observes: active => active.includes(e),
    async waitReleased(signal) {
      const killedAt = e.lease?.injectedAt ?? now()
      const until = killedAt + expected.waitSeconds * 1000
      o.say(`${e.s.name}: waiting for decode to release its halves (${expected.why}; up to ${expected.waitSeconds} s)`)
      let ended = false
      void Promise.all(sent.map(s => s.done)).then(() => (ended = true))
      while (!ended && now() < until && !signal.aborted) await sleep(Math.min(100, Math.max(1, until - now())), signal)
    },
    async restore(say) {
      const restartMs = await restore(session, rec, sent, say)
      rec.marker('batch-floor', String((expected.heartbeat?.boundSeconds ?? expected.waitSeconds) * 1000 + restartMs))
    },
  }
}

/** How long prefill took to pass its health gate from its restart command (as a restart batch counts it), else 0. */
async function restore(session: RunSession, rec: Recorder, sent: Sent[], say: (l: string) => void): Promise<number> {
  const answered = new Set(
    rec.observations.filter(x => x.kind === 'request-answered').map(x => (x as {rid: string}).rid),
  )
  for (const s of sent.filter(x => !answered.has(x.rid))) {
    await session.decode.abort(s.rid).catch(() => undefined)
    rec.marker('cleanup-abort', s.rid)
  }
  const deployment = session.deployment
  try {
    const r = await coRestart(deployment, session.placement.of('prefill').host, {
      order: ['prefill'],
      targets: roleTargets(deployment, session.placement.of('prefill').host, ['prefill']),
      healthTimeoutS: RESTART_TIMEOUT_S,
      commandTimeoutS: RESTART_TIMEOUT_S,
      canaries: 0,
      watchS: 0,
      sampleS: 1,
      settleS: 0,
      gatesOnly: true,
      onProgress: l => say(`restart prefill: ${l}`),
    })
    for (const x of r.observations) rec.add(x)
    const bad = r.verdicts.filter(v => v.verdict === 'fail')
    rec.marker('prefill-restarted', bad.length ? bad.map(v => v.summary).join('; ') : 'healthy behind its gate')
    await within(Promise.all(sent.map(s => s.done)), 5000)
    if (bad.length === 0) await repairIfStale(session, rec, say)
    const step = r.steps[0]
    return bad.length === 0 && step ? (step.healthyAfterMs ?? 0) : 0
  } catch (error) {
    rec.marker('prefill-restarted', `restart failed: ${oneLine(error)}`)
    say(`restart prefill failed: ${oneLine(error)} (the lease's revert runs the restart command again)`)
    return 0
  }
}

/**
 * A decode whose heartbeat never noticed the kill keeps the dead instance's endpoints (SGLang #34289): the pair does
 * not serve after prefill's restart. One direct request tells; if it fails, decode and the router are restarted behind
 * their gates (decode resolves prefill afresh), so that no exit path leaves the deployment broken. The recovery check
 * still judges what the canaries meet afterwards.
 */
async function repairIfStale(session: RunSession, rec: Recorder, say: (l: string) => void): Promise<void> {
  const probe = sendDirect(session, session.bootstrap, new Recorder(), {role: 'canary', timeoutMs: STALE_PROBE_MS})
  const {status} = await probe.done
  if (status === 200) {
    rec.marker('pair-serves', 'a direct request after the restart succeeded')
    return
  }
  say(
    `after prefill's restart a direct request got ${status ?? 'no answer'}: decode still holds the killed prefill's ` +
      'endpoints (SGLang #34289); co-restarting decode and the router to bring the deployment back',
  )
  rec.marker('pair-stale', `direct request after prefill's restart: ${status ?? 'no answer'}`)
  const deployment = session.deployment
  const r = await coRestart(deployment, role => session.placement.of(role).host, {
    order: ['decode', 'router'],
    healthTimeoutS: RESTART_TIMEOUT_S,
    commandTimeoutS: RESTART_TIMEOUT_S,
    canaries: 0,
    watchS: 0,
    sampleS: 1,
    settleS: 0,
    gatesOnly: true,
    onProgress: l => say(`repair: ${l}`),
  })
  for (const x of r.observations) rec.add(x)
  rec.marker(
    'repaired',
    r.verdicts
      .filter(v => v.verdict === 'fail')
      .map(v => v.summary)
      .join('; ') || 'decode, router',
  )
}
