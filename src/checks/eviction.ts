import {
  DECODE_PREALLOC_QUEUE,
  DECODE_TRANSFER_QUEUE,
  PREFILL_BOOTSTRAP_QUEUE,
  PREFILL_INFLIGHT_QUEUE,
  WATCHDOG_EVICTED_TOTAL,
} from '../engines/sglang/sglang-metrics.js'
import {edgeOf, epsilonFor, type Edge} from './epsilon.js'
import type {FaultExpectation, StallExpectation} from './expectation.js'
import {attributeRelease, type Attribution, CAUSE_NAMES, type ReleaseCause, releaseCauseOf} from './release-cause.js'
import {
  abandonedOf,
  answerOf,
  metricAt,
  requestsOf,
  type Observation,
  type PinState,
  type Timeline,
} from '../model/timeline.js'
import type {PinRecord} from '../model/run.js'
import {fail, pass, unverified, type Verdict} from '../model/verdict.js'
import type {CompetingTimeout} from '../model/competing.js'

/**
 * The eviction oracle: every pin leaves no earlier than deadline - ε and no later than deadline + poll + ε after
 * it entered the watched queue. The clock is the pin's own answer; its absence is judged with the state it was
 * left in.
 */

export type {PinRecord} from '../model/run.js'

const UNKNOWN_STATE: PinState = {queue: 'unknown', kvPoll: 'unknown'}

export interface EvictionOptions {
  /**
   * The plan's expectation (FaultPlan.expected): names the transport's limits when a transport error releases a pin.
   */
  expected?: FaultExpectation
  /**
   * SGLang's own timeouts that could release these pins, as discovery read them (experiment/competing.ts). A release
   * inside the window that nothing names passes only when each is shown to fire after the pin's window.
   */
  competing?: CompetingTimeout[]
  /** The run was allowed although one of them fires before the window closes: such pins are unverified. */
  competingAllowed?: boolean
  /** Every pin (and abort trial) of the batch: the watchdog's counter names it only by moving for all of them. */
  batchPins?: number
}

/** How a release inside the window was tied to the watchdog: named by the evidence, all else excluded, or not. */
export type ReleasePath =
  | {path: 'named'; by: string}
  | {path: 'excluded'; excluded: string[]}
  | {path: 'unknown'; candidates: string[]}

/**
 * The watchdog's counter as evidence: it moved, between the last sample before the first pin was sent and the first
 * after the last answer, by at least every pin of the batch. A counter never names a request: only a move that covers
 * every pin that could have been evicted names the watchdog for each of them.
 */
function counterNamesWatchdog(tl: Timeline, batchPins: number | undefined): string | undefined {
  const pins = requestsOf(tl, 'pin')
  if (pins.length === 0 || batchPins === undefined || batchPins <= 0) return undefined
  const from = Math.min(...pins.map(p => p.t))
  const answers = pins.map(p => answerOf(tl, p.rid)?.t)
  if (answers.some(t => t === undefined)) return undefined
  const to = Math.max(...(answers as number[]))
  let before: number | undefined
  let after: {t: number; value: number} | undefined
  for (const o of tl.observations) {
    if (o.kind !== 'metric' || o.service !== 'prefill' || o.name !== WATCHDOG_EVICTED_TOTAL) continue
    if (o.t <= from) before = o.value
    if (o.t > to && (!after || o.t < after.t)) after = o
  }
  if (before === undefined || !after) return undefined
  const d = after.value - before
  if (d < batchPins) return undefined
  return (
    `prefill ${WATCHDOG_EVICTED_TOTAL} +${d} from before the first pin to after the last answer: ` +
    `at least one per pin of the batch (${batchPins})`
  )
}

/** Each competing timeout against this pin's window: excluded (fires after it, or not in force) or a candidate. */
function competingFor(competing: CompetingTimeout[], sentAt: number, limit: number) {
  const excluded: string[] = []
  const open: CompetingTimeout[] = []
  for (const c of competing) {
    if (!c.known) open.push(c)
    else if (c.seconds === null) excluded.push(`${c.name}: ${c.source}`)
    // Each starts no earlier than the request reached its server, after the send: it cannot fire before send + T.
    else if (sentAt + c.seconds * 1000 > limit) {
      const by = secs(limit - sentAt)
      excluded.push(`${c.name} ${c.seconds} s (${c.setting}, read from ${c.source}) cannot have fired by ${by}`)
    } else open.push(c)
  }
  return {excluded, open}
}

const candidateText = (c: CompetingTimeout) =>
  c.known
    ? `${c.name} (${c.setting} = ${c.seconds} s, read from ${c.source})`
    : `${c.name} (${c.setting}: not read from the server, ${c.source})`

/** Nothing was read of SGLang's own timeouts (a timeline judged without the plan's discovery): none can be excluded. */
const NOT_ASSESSED: CompetingTimeout[] = [
  {
    cause: 'waiting-timeout',
    name: "SGLang's own timeouts",
    setting: 'SGLANG_DISAGGREGATION_*_TIMEOUT',
    seconds: null,
    source: 'not read: the run did not discover them',
    known: false,
  },
]

/** A transport error (or a transfer failure) before or inside the window: the watchdog was not exercised. */
function transportRelease(
  after: number,
  released: ReturnType<typeof releaseCauseOf>,
  where: 'before' | 'inside',
  expected: StallExpectation | undefined,
) {
  const what =
    released.cause === 'transport-error'
      ? 'a transport error'
      : 'a KV transfer failure (its reason not stated: it came from another TP rank)'
  const toVerify = expected
    ? `raise ${expected.raise.join(' / ')} so that a stall outlasts the watchdog ` +
      `deadline${expected.deadlineSeconds === undefined ? '' : ` (${expected.deadlineSeconds} s)`} ` +
      `(now ${expected.limits}: the transport gives up after about ${expected.afterSeconds ?? '?'} s), or stall ` +
      `the KV over a TCP data path`
    : "raise the transport's stall limit above the watchdog deadline (UCX_RC_MLX5_TIMEOUT / UCX_RC_TIMEOUT and " +
      'UCX_RC_RETRY_COUNT for NIXL over RDMA, MC_TRANSFER_TIMEOUT for Mooncake), or stall the KV over a TCP data path'
  return {
    summary:
      `released by ${what} after ${secs(after)}${where === 'inside' ? ', inside the deadline window' : ''}; ` +
      `the watchdog was not exercised`,
    evidence: {
      why:
        `the pin's answer says the transfer failed (${released.evidence}), not that the watchdog evicted ` +
        `it: ${
          where === 'before'
            ? 'it left before the deadline window, so the watchdog never had ' + 'to act'
            : 'a release by the transport cannot be told from an eviction'
        }`,
      toVerify,
      releasedBy: released.cause,
      ...(expected
        ? {
            expectedOutcome: expected.outcome,
            transportGivesUpAfterSeconds: expected.afterSeconds,
            transportLimits: expected.limits,
          }
        : {}),
    },
  }
}

/** Causes the evidence names that are not the watchdog (transport errors and unexplained transfer failures aside). */
const OTHER_CAUSES: ReleaseCause[] = [
  'bootstrap-timeout',
  'waiting-timeout',
  'heartbeat',
  'abort',
  'decode-abort',
  'revert',
  'timeout',
]

function toVerifyOther(cause: ReleaseCause, deadlineSeconds: number, pollSeconds: number): string {
  const above = `above the watchdog's deadline + poll (${deadlineSeconds + pollSeconds} s)`
  switch (cause) {
    case 'waiting-timeout':
    case 'decode-abort':
      return (
        `raise SGLANG_DISAGGREGATION_WAITING_TIMEOUT in decode's environment ${above}, so that decode does ` +
        `not let go first`
      )
    case 'bootstrap-timeout':
      return `raise SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT in prefill's environment ${above}`
    case 'heartbeat':
      return (
        "keep prefill's bootstrap server answering decode's heartbeat during the fault " +
        '(SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL × HEARTBEAT_MAX_FAILURE on decode)'
      )
    case 'abort':
      return (
        'find who aborted it (the gateway, a client that left, an operator); if the watchdog evicts through ' +
        'an abort, set watchdog.logPattern so that its own log line names the eviction'
      )
    default:
      return 'remove what released the pin before the watchdog could, then run again'
  }
}

/**
 * The watchdog's own clock: the seconds it held the pin, from its log line (watchdog.logPattern), judged against
 * [deadline, deadline + poll] with a slack for the scheduler loop's lateness (the watchdog runs inside the loop): the
 * answer's ε, at least 100 ms and at most half a poll.
 * Not used when it cannot be right: held longer than the request existed.
 */
function serverClock(
  released: Attribution,
  o: {after: number; entryOffsetMs: number; deadlineMs: number; pollMs: number; epsHighMs: number},
) {
  if (released.watchdogHeldSeconds === undefined) return undefined
  const heldMs = released.watchdogHeldSeconds * 1000
  const clock = {
    clock: "the watchdog's own log line (held time, the server's clock)",
    watchdogHeldSeconds: released.watchdogHeldSeconds,
  }
  // Printed to the ms: allow its rounding, never the observation delay (the server measured it, not pdchaos).
  if (heldMs > o.after + 5) return undefined
  // Up to half a poll: a loaded host's loop can run that late, and a watchdog two polls late still shows.
  const slackMs = Math.max(SERVER_SLACK_MIN_MS, Math.min(o.epsHighMs, o.pollMs / 2))
  const verdict = heldMs < o.deadlineMs - 1 ? 'early' : heldMs > o.deadlineMs + o.pollMs + slackMs ? 'late' : 'inside'
  return {
    verdict,
    heldMs,
    slackMs,
    evidence: {...clock, serverSlackMs: Math.round(slackMs), answerClockSeconds: round(o.after / 1000, 3)},
  } as const
}

/** The least slack given to the watchdog's own clock: a loop iteration on a busy host. */
const SERVER_SLACK_MIN_MS = 100

/** One pin as judged: its verdict, when it left (null: it never did), and the bound it sat next to, if any. */
interface Judged {
  verdict: Verdict
  evictedAt: number | null
  edge?: Edge
}

type Sent = ReturnType<typeof requestsOf>[number]
type Answer = NonNullable<ReturnType<typeof answerOf>>

/** A pin's window and what every verdict on it carries: the contract, ε and the state it was expected in. */
interface PinWindow {
  tl: Timeline
  opts: EvictionOptions
  sent: Sent
  state: PinState
  eps: ReturnType<typeof epsilonFor>
  /** The window [low, high] on the pdchaos clock, and the same in seconds after the send. */
  low: number
  high: number
  bounds: [number, number]
  deadlineMs: number
  pollMs: number
  base: Record<string, unknown>
}

export function checkEvictions(tl: Timeline, opts: EvictionOptions = {}): {verdicts: Verdict[]; pins: PinRecord[]} {
  const verdicts: Verdict[] = []
  const pins: PinRecord[] = []
  const end = Math.max(...tl.observations.map(o => o.t))
  for (const sent of requestsOf(tl, 'pin')) {
    const answer = answerOf(tl, sent.rid)
    const w = pinWindow(tl, opts, sent, answer)
    const judged = answer ? judgeAnswered(w, answer) : neverEvicted(w, end)
    const {verdict, pin} = pinRecord(w, judged)
    verdicts.push(verdict)
    pins.push(pin)
  }
  return {verdicts, pins}
}

function pinWindow(tl: Timeline, opts: EvictionOptions, sent: Sent, answer: Answer | undefined): PinWindow {
  const {deadlineSeconds, pollSeconds, scope} = tl.contract
  const deadlineMs = deadlineSeconds * 1000
  const pollMs = pollSeconds * 1000
  const state = sent.expectedState ?? UNKNOWN_STATE
  const eps = epsilonFor(tl, state.queue, {sentAt: sent.t, answeredAt: answer?.t})
  const entry = sent.t + eps.entryOffsetMs
  const low = entry + deadlineMs - eps.lowMs
  const high = entry + deadlineMs + pollMs + eps.highMs
  const bounds: [number, number] = [(low - sent.t) / 1000, (high - sent.t) / 1000]
  const base = {
    clock: "the request's own answer",
    contract: {scope, deadlineSeconds, pollSeconds},
    epsilonMs: {low: round(eps.lowMs), high: round(eps.highMs)},
    epsilonWhy: eps.why,
    entry: eps.entryOffsetMs === 0 ? 'send time' : `send + ${round(eps.entryOffsetMs)} ms (calibrated)`,
    expectedState: state,
  }
  return {tl, opts, sent, state, eps, low, high, bounds, deadlineMs, pollMs, base}
}

/** The verdict as reported (at the edge: judged as it is, but said, so the risk is visible) and the pin's record. */
function pinRecord(w: PinWindow, {verdict: judged, evictedAt, edge}: Judged): {verdict: Verdict; pin: PinRecord} {
  const {sent, bounds} = w
  const verdict = edge
    ? {...judged, summary: `${judged.summary} (at the edge)`, evidence: {...judged.evidence, atEdge: edge}}
    : judged
  const pin: PinRecord = {
    rid: sent.rid,
    fault: sent.fault,
    sentAt: sent.t,
    evictedAt,
    evictionSeconds: evictedAt === null ? null : round((evictedAt - sent.t) / 1000, 3),
    bounds: [round(bounds[0], 3), round(bounds[1], 3)],
    verdict: verdict.verdict,
    evidence: verdict.evidence,
    ...(edge ? {atEdge: {bound: edge.bound, marginMs: edge.marginMs}} : {}),
  }
  return {verdict, pin}
}

/** A pin that was answered: completed (the fault did not hold it), released by a named cause, or evicted. */
function judgeAnswered(w: PinWindow, answer: Answer): Judged {
  const {tl, sent, base, low, high} = w
  if (answer.status >= 200 && answer.status < 300) {
    const took = secs(answer.t - sent.t)
    const summary = `not pinned: completed with ${answer.status} after ${took} — the fault did not hold it`
    const evidence = {...base, status: answer.status, answeredAfterSeconds: round((answer.t - sent.t) / 1000, 3)}
    return {verdict: fail('fault-effect', sent.rid, summary, evidence), evictedAt: null}
  }
  const after = answer.t - sent.t
  const released = attributeRelease(tl, sent.rid, answer)
  const evidence: Record<string, unknown> = {
    ...base,
    status: answer.status,
    detail: answer.detail,
    evictedAfterSeconds: round(after / 1000, 3),
    ...(released.cause === 'unknown'
      ? {}
      : {releasedBy: released.cause, releaseEvidence: released.evidence.join(' | ')}),
    ...(released.logsUnread.length > 0 ? {logsUnread: released.logsUnread} : {}),
  }
  const a: Released = {answer, after, released, evidence}
  const notWatchdog = releasedByTransport(w, a) ?? releasedByOther(w, a)
  if (notWatchdog) return {verdict: notWatchdog, evictedAt: answer.t}
  // A pass needs positive evidence: the watchdog named (its log line or its words in the answer, or its counter
  // moving for every pin), or every other path that could release the pin there excluded by the settings read
  // from the servers. "It may be the watchdog's own" is not evidence.
  let releasePath: ReleasePath | undefined
  if (released.cause === 'watchdog') {
    releasePath = {path: 'named', by: released.evidence[0] ?? "the watchdog's words"}
  } else if (answer.t <= high) {
    const path = releasePathInWindow(w, a)
    if ('verdict' in path) return {verdict: path.verdict, evictedAt: answer.t}
    releasePath = path
  }
  if (releasePath) evidence.releasePath = releasePath
  const byServer = judgeByServerClock(w, a)
  if (byServer) return {verdict: byServer, evictedAt: answer.t}
  return judgeByAnswerClock(w, a, low)
}

/** An answered pin that was not a success: how long after the send, what released it, and the evidence so far. */
interface Released {
  answer: Answer
  after: number
  released: Attribution
  evidence: Record<string, unknown>
}

/**
 * A transport error released it (before or inside the window), or a transfer failure whose reason nothing shows
 * released it before the window: either way not the watchdog. (Inside the window an unexplained transfer failure
 * passes only with positive evidence: releasePathInWindow.)
 */
function releasedByTransport(w: PinWindow, {answer, after, released, evidence}: Released): Verdict | undefined {
  const {sent, low, high, opts} = w
  if (
    !(
      (released.cause === 'transport-error' && answer.t <= high) ||
      (released.cause === 'transfer-failed' && answer.t < low)
    )
  )
    return undefined
  const stallExpected = opts.expected?.kind === 'stall' ? opts.expected : undefined
  const text = releaseCauseOf(answer.detail)
  const byText = {cause: released.cause, evidence: released.evidence.join(' | ') || text.evidence}
  const r = transportRelease(after, byText, answer.t < low ? 'before' : 'inside', stallExpected)
  return unverified('eviction', sent.rid, r.summary, {...evidence, ...r.evidence})
}

/**
 * Released by something named that is not the watchdog (a timeout, decode letting go, a heartbeat failure, an abort
 * pdchaos did not send) before the window closed: what it was, never a watchdog pass. (An abort before the window
 * stays a false timeout: a watchdog may evict through an abort.)
 */
function releasedByOther(w: PinWindow, {answer, after, released, evidence}: Released): Verdict | undefined {
  const {sent, low, high, tl} = w
  if (!(OTHER_CAUSES.includes(released.cause) && answer.t <= high && (answer.t >= low || released.cause !== 'abort')))
    return undefined
  const where = answer.t < low ? 'before the deadline window' : 'inside the deadline window'
  return unverified(
    'eviction',
    sent.rid,
    `released by ${CAUSE_NAMES[released.cause]} after ${secs(after)}, ${where}: not a watchdog eviction; ` +
      `the watchdog was not exercised`,
    {
      ...evidence,
      why: `the evidence names ${CAUSE_NAMES[released.cause]}, not the watchdog: ${released.evidence.join(' | ')}`,
      toVerify: toVerifyOther(released.cause, tl.contract.deadlineSeconds, tl.contract.pollSeconds),
    },
  )
}

/**
 * A release by no named cause, no later than the window's end: the watchdog named by its counter, every competitor
 * excluded, or else an unverified verdict that says what could have released it. Inside the window every competitor
 * firing before its end is a candidate; before it, one that could have fired by the answer (a timeout that early
 * makes an unexplained early release no proof of a false timeout).
 */
function releasePathInWindow(w: PinWindow, a: Released): ReleasePath | {verdict: Verdict} {
  const {tl, opts, sent, low, high, eps} = w
  const early = a.answer.t < low
  const counter = counterNamesWatchdog(tl, opts.batchPins)
  const limit = early ? a.answer.t + eps.highMs : high
  const {excluded, open} = competingFor(opts.competing ?? NOT_ASSESSED, sent.t, limit)
  if (counter && !(opts.competingAllowed && open.length > 0)) return {path: 'named', by: counter}
  if (open.length === 0 && (early || !opts.competingAllowed)) return {path: 'excluded', excluded}
  return {verdict: releasedByUnknownPath(w, a, early, open, excluded)}
}

function releasedByUnknownPath(
  w: PinWindow,
  {after, released, evidence}: Released,
  early: boolean,
  open: CompetingTimeout[],
  excluded: string[],
): Verdict {
  const {opts, sent, high, bounds} = w
  const candidates = open.map(candidateText)
  const toDecide = [
    'set logs: for prefill and decode in the deployment file (their lines name what released each rid)',
    "set watchdog.logPattern so that the watchdog's own line names its evictions",
    `export ${WATCHDOG_EVICTED_TOTAL} from prefill (it must move by every pin)`,
    ...open.map(
      c =>
        `or raise ${c.setting} above ${secs(high - sent.t)} in the ` +
        `${c.cause === 'bootstrap-timeout' ? 'prefill' : 'decode'} server's environment`,
    ),
  ]
  const path: ReleasePath = {path: 'unknown', candidates}
  const where = `${early ? 'before' : 'inside'} [${bounds[0].toFixed(3)}s, ${bounds[1].toFixed(3)}s]`
  const could = candidates.length > 0 ? open.map(c => c.name).join(' or ') : 'something other than the watchdog'
  const says =
    released.cause === 'unknown'
      ? 'the answer says nothing of its cause'
      : `the evidence says only ${CAUSE_NAMES[released.cause]}`
  const unread = released.logsUnread.length > 0 ? `; ${released.logsUnread.join('; ')}` : ''
  const fires =
    candidates.length > 0
      ? `${candidates.join('; ')} can fire ${early ? 'by then' : 'inside the window'}` +
        (opts.competingAllowed ? ' (run with --allow-competing-timeout)' : '')
      : 'the run was allowed with a competing timeout'
  const summary =
    `released after ${secs(after)}, ${where}, by a path nothing names: ` + `it could be ${could}, not only the watchdog`
  return unverified('eviction', sent.rid, summary, {
    ...evidence,
    releasePath: path,
    why: `no evidence names the watchdog (${says}${unread}), and ${fires}`,
    toVerify: toDecide.join('; '),
    ...(excluded.length > 0 ? {excluded} : {}),
  })
}

/** Judged by the watchdog's own clock (its log line's held time), where it has one that can be right. */
function judgeByServerClock(w: PinWindow, {after, released, evidence}: Released): Verdict | undefined {
  const {sent, eps, deadlineMs, pollMs, tl} = w
  const clocked = serverClock(released, {
    after,
    entryOffsetMs: eps.entryOffsetMs,
    deadlineMs,
    pollMs,
    epsHighMs: eps.highMs,
  })
  if (!clocked) return undefined
  const e = {...evidence, ...clocked.evidence}
  if (clocked.verdict === 'early')
    return fail(
      'eviction',
      sent.rid,
      `evicted early: the watchdog held it ${secs(clocked.heldMs)} by its own clock, before the deadline ` +
        `(${tl.contract.deadlineSeconds}s) — a false timeout`,
      e,
    )
  if (clocked.verdict === 'late')
    return fail(
      'eviction',
      sent.rid,
      `evicted late: the watchdog held it ${secs(clocked.heldMs)} by its own clock, past deadline + poll ` +
        `(${secs(deadlineMs + pollMs)}) + ${Math.round(clocked.slackMs)} ms`,
      e,
    )
  return pass(
    'eviction',
    sent.rid,
    `evicted after ${secs(clocked.heldMs)} by the watchdog's own clock, inside ` +
      `[${secs(deadlineMs)}, ${secs(deadlineMs + pollMs)}] (+${Math.round(clocked.slackMs)} ms); ` +
      `answered ${secs(after)} after send`,
    e,
  )
}

/** The pin's own answer is the clock: within ε of a bound the verdict rests on ε (checks/epsilon.ts edgeOf). */
function judgeByAnswerClock(w: PinWindow, {answer, after, released, evidence}: Released, low: number): Judged {
  const {sent, high, eps, bounds, pollMs} = w
  const edge = edgeOf(answer.t, low, high, eps)
  const judged = (verdict: Verdict, at?: Edge): Judged => ({verdict, evictedAt: answer.t, edge: at})
  const window = `[${bounds[0].toFixed(3)}s, ${bounds[1].toFixed(3)}s]`
  if (answer.t < low) {
    const summary = `evicted early: after ${secs(after)}, before the deadline window ${window} — a false timeout`
    return judged(fail('eviction', sent.rid, summary, evidence), edge)
  }
  if (answer.t > high) {
    const by = OTHER_CAUSES.includes(released.cause)
      ? `; released by ${CAUSE_NAMES[released.cause]}, not the watchdog`
      : ''
    const summary = `evicted late: after ${secs(after)}, past deadline + poll + ε (${bounds[1].toFixed(3)}s)${by}`
    return judged(fail('eviction', sent.rid, summary, evidence), edge)
  }
  if (eps.highMs >= pollMs) {
    // Answers reach pdchaos as late as a poll interval: a watchdog one poll late (or a little early) looks the
    // same as a punctual one answered late. Only clearly early or clearly late evictions can be judged.
    return judged(
      unverified(
        'eviction',
        sent.rid,
        `evicted after ${secs(after)}, inside ${window} only because ε is a whole poll wide (` +
          `${Math.round(eps.highMs)} ms)`,
        {
          ...evidence,
          why:
            `answers reached pdchaos up to ${Math.round(eps.highMs)} ms late (${eps.why}), as long as the ` +
            `poll interval (${pollMs} ms): an eviction one poll late cannot be told from a punctual one ` +
            `answered late`,
          toVerify:
            'run again when the host (and the machine pdchaos runs on) is less loaded, or from a machine ' +
            'nearer the servers; the observation delay must stay well under the poll interval; or set ' +
            "watchdog.logPattern so that the watchdog's own log line gives the held time",
        },
      ),
    )
  }
  return judged(pass('eviction', sent.rid, `evicted after ${secs(after)}, inside ${window}`, evidence), edge)
}

/** No answer: still held when pdchaos stopped watching (or its own client deadline ran out). */
function neverEvicted(w: PinWindow, end: number): Judged {
  const {tl, sent, base, bounds, state} = w
  const gaveUp = abandonedOf(tl, sent.rid)
  const heldFor = (gaveUp?.t ?? end) - sent.t
  const signals = stateSignals(tl, gaveUp?.t ?? end)
  const verdict = fail(
    'eviction',
    sent.rid,
    `never evicted: still held after ${secs(heldFor)} (window ended at ${bounds[1].toFixed(3)}s), in ` +
      `the ${state.queue} queue (${state.kvPoll})`,
    {
      ...base,
      heldSeconds: round(heldFor / 1000, 3),
      leftIn: state,
      deploymentSignals: signals,
      stoppedWatching: gaveUp?.detail ?? 'end of observation',
    },
  )
  return {verdict, evictedAt: null}
}

/** What the deployment itself said about its queues at time t (gauges may be stale: reported, never the clock). */
function stateSignals(tl: Timeline, t: number): Record<string, number | undefined> {
  const names = [PREFILL_BOOTSTRAP_QUEUE, PREFILL_INFLIGHT_QUEUE, DECODE_TRANSFER_QUEUE, DECODE_PREALLOC_QUEUE]
  const out: Record<string, number | undefined> = {}
  for (const n of names) {
    const service = n.includes('decode') ? 'decode' : 'prefill'
    const v = metricAt(tl, service, n, t)
    if (v !== undefined) out[n] = v
  }
  return out
}

export function round(v: number, digits = 1): number {
  const f = 10 ** digits
  return Math.round(v * f) / f
}

export function secs(ms: number): string {
  return `${(ms / 1000).toFixed(3)}s`
}

export type {Observation}
