import {coverageOf, matchedPackets, notInWindow, releasedFromOf, windowFor} from './abort-coverage.js'
import {entryOf, notEnteredWhy} from './abort-entry.js'
import {PATH_NAMES, releasePathOf} from './abort-path.js'
import {EPSILON_FLOOR_MS, epsilonFor} from './epsilon.js'
import {round, secs} from './eviction.js'
import {attributeRelease} from './release-cause.js'
import type {AbortCoverage, AbortRecord} from '../model/run.js'
import {answerOf, type Observation, type Timeline} from '../model/timeline.js'
import {fail, pass, unverified, type Verdict} from '../model/verdict.js'

/**
 * Aborts fired inside the transfer window: an honoured abort releases the request within one poll (+ ε) of the
 * abort, and passes. A lost abort (the race) fails the abort check however the request ends: when the watchdog then
 * evicts it inside its window, that is the watchdog's pass (an eviction verdict of its own), not the abort's.
 * A pass needs coverage: the trial's abort demonstrably landed in the transfer window, and enough of the scenario's
 * trials did (abort-coverage.ts). Otherwise what would have passed is unverified, with why and how to verify.
 */
export function checkAborts(tl: Timeline): {verdicts: Verdict[]; trials: AbortRecord[]; coverage?: AbortCoverage} {
  const aborts = tl.observations.filter((o): o is Extract<Observation, {kind: 'abort-sent'}> => o.kind === 'abort-sent')
  const byRid = new Map<string, number>()
  const sidesOf = new Map<string, Set<'prefill' | 'decode'>>()
  for (const a of aborts) {
    byRid.set(a.rid, Math.min(byRid.get(a.rid) ?? Number.POSITIVE_INFINITY, a.t))
    if (a.target !== 'prefill' && a.target !== 'decode') continue
    sidesOf.set(a.rid, (sidesOf.get(a.rid) ?? new Set()).add(a.target))
  }
  const end = Math.max(...tl.observations.map(o => o.t))

  const judged: Array<Judged> = []
  for (const [rid, abortAt] of byRid) {
    const sent = tl.observations.find(
      (o): o is Extract<Observation, {kind: 'request-sent'}> => o.kind === 'request-sent' && o.rid === rid,
    )
    if (sent) judged.push(judgeTrial(tl, sent, abortAt, end, [...(sidesOf.get(rid) ?? [])].sort()))
  }
  if (judged.length === 0) return {verdicts: [], trials: []}

  // One scenario's trials share one window and one lease (its view holds no other scenario's trials).
  const w = windowFor(tl, judged[0]!.record.rid)
  const packets = w ? matchedPackets(tl, w.leaseId) : undefined
  for (const j of judged) {
    // A lost trial counts only once its request is shown to have entered prefill before the abort (abort-entry.ts).
    const why =
      notInWindow(tl, w, packets, {
        offsetMs: j.record.offsetMs,
        abortAt: j.record.abortedAt,
        releasedFrom: j.record.releasedFrom,
        ...(j.record.releasedAt === null ? {} : {answeredAt: j.record.releasedAt}),
        ...(j.record.releaseStatus === null ? {} : {status: j.record.releaseStatus}),
      }) ?? (j.record.entry && NOT_ENTERED.includes(j.record.outcome) ? notEnteredWhy(j.record.entry) : undefined)
    j.record.inWindow = why === undefined
    if (why !== undefined) j.record.notInWindow = why
    j.record.plannedOffsetMs = w?.trials.find(x => x.rid === j.record.rid)?.offsetMs ?? null
  }
  const coverage = coverageOf(
    tl,
    w,
    packets,
    judged.map(j => ({
      rid: j.record.rid,
      offsetMs: j.record.offsetMs,
      ...(j.record.notInWindow ? {notInWindow: j.record.notInWindow} : {}),
    })),
  )

  const verdicts: Verdict[] = []
  for (const j of judged) {
    let v = j.verdicts[0]!
    if (v.verdict === 'pass') {
      // A pass that coverage does not back proves nothing: a trial outside the window, or too few trials inside it.
      const why = j.record.notInWindow ?? (coverage.verified ? undefined : coverage.why)
      if (why !== undefined) {
        // The summary names this trial's reason (the gate and the failure lists print only summaries); why gives the
        // coverage.
        const short =
          j.record.notInWindow ??
          `too few aborts landed in the transfer window (${coverage.inWindow}/${coverage.trials}, at ` +
            `least ${coverage.required} needed)`
        v = unverified('abort', v.subject, `${v.summary} — not counted: ${short}`, {
          ...v.evidence,
          inWindow: j.record.inWindow,
          coverage: coverage.summary,
          why: coverage.why ?? `only an abort that lands in the transfer window counts (${coverage.summary})`,
          toVerify: coverage.toVerify ?? 'nothing for this trial: the other trials of this run covered the window',
        })
      }
    }
    j.record.verdict = v.verdict
    j.record.evidence = {...v.evidence, summary: v.summary}
    verdicts.push(v, ...j.verdicts.slice(1))
  }
  return {verdicts, trials: judged.map(j => j.record), coverage}
}

/**
 * How late an answer may reach pdchaos after the server let the request go: the slowest answer lag measured at
 * calibration (plus the floor), or without that measurement the whole late side of ε.
 */
function answerLagOf(tl: Timeline, epsHighMs: number): number {
  const a = tl.calibration.lags?.answer
  return a ? EPSILON_FLOOR_MS + a.maxMs : epsHighMs
}

/** Outcomes of a trial whose request was not shown to have entered prefill before its abort. */
const NOT_ENTERED = ['not-landed', 'entry-unknown']

interface Judged {
  verdicts: Verdict[]
  record: AbortRecord
}

type Sent = Extract<Observation, {kind: 'request-sent'}>
type Answer = NonNullable<ReturnType<typeof answerOf>>

/** One trial's timing, what released it and whether its request entered first: what each outcome is judged from. */
interface Trial {
  tl: Timeline
  sent: Sent
  rid: string
  abortAt: number
  sides: Array<'prefill' | 'decode'>
  pollMs: number
  answer: Answer | undefined
  eps: ReturnType<typeof epsilonFor>
  /** An honoured abort releases the request by then (one poll + ε after the abort). */
  honourBy: number
  /** The watchdog's window on the pdchaos clock. */
  windowLow: number
  windowHigh: number
  evidence: Record<string, unknown>
  record: AbortRecord
  released: ReturnType<typeof attributeRelease> | undefined
  entry: ReturnType<typeof entryOf>
  path: Record<string, unknown>
}

/**
 * One trial judged by its timing and what released it (honoured, lost, late, pinned, …), with its record; coverage
 * comes after.
 */
function judgeTrial(
  tl: Timeline,
  sent: Sent,
  abortAt: number,
  end: number,
  sides: Array<'prefill' | 'decode'>,
): Judged {
  const t = trialOf(tl, sent, abortAt, sides)
  const {answer, released} = t
  if (answer && answer.status >= 200 && answer.status < 300) return completed(t, answer)
  if (answer && answer.t <= abortAt) return releasedBeforeAbort(t, answer)
  if (answer && released && answer.t <= t.honourBy && released.cause !== 'watchdog')
    return releasedInAbortBound(t, answer, released)
  if (answer && released && answer.t <= t.windowHigh) return releasedBeforeWindowEnd(t, answer, released)
  return lateOrPinned(t, end)
}

function trialOf(tl: Timeline, sent: Sent, abortAt: number, sides: Array<'prefill' | 'decode'>): Trial {
  const rid = sent.rid
  const pollMs = tl.contract.pollSeconds * 1000
  const deadlineMs = tl.contract.deadlineSeconds * 1000
  const answer = answerOf(tl, rid)
  const eps = epsilonFor(tl, 'inflight', {sentAt: sent.t, answeredAt: answer?.t})
  const honourBy = abortAt + pollMs + eps.highMs
  const windowLow = sent.t + eps.entryOffsetMs + deadlineMs - eps.lowMs
  const windowHigh = sent.t + eps.entryOffsetMs + deadlineMs + pollMs + eps.highMs
  const releasedFrom = releasedFromOf(answer?.detail)
  const evidence = {
    clock: "the request's own answer",
    abortOffsetMs: round(abortAt - sent.t),
    epsilonMs: round(eps.highMs),
    epsilonWhy: eps.why,
    status: answer?.status,
    detail: answer?.detail,
    releasedFrom,
  }
  const record: AbortRecord = {
    rid,
    ...(sent.fault === undefined ? {} : {fault: sent.fault}),
    sentAt: sent.t,
    abortedAt: abortAt,
    offsetMs: round(abortAt - sent.t),
    plannedOffsetMs: null,
    releasedAt: answer?.t ?? null,
    releaseStatus: answer?.status ?? null,
    targeted: sent.expectedState ?? {queue: 'inflight', kvPoll: 'Transferring'},
    releasedFrom,
    ...(sides.length > 0 ? {sides} : {}),
    bounds: {
      honourBySeconds: round((pollMs + eps.highMs) / 1000, 3),
      watchdog: [round((windowLow - sent.t) / 1000, 3), round((windowHigh - sent.t) / 1000, 3)],
    },
    inWindow: false,
    verdict: 'unverified',
    outcome: '',
    evidence: {},
  }
  // What released it (logs naming the rid, the answer's text, counters): timing alone cannot tell an honoured abort
  // from a watchdog eviction when one poll after the abort reaches into the watchdog's window.
  const failed = answer && !(answer.status >= 200 && answer.status < 300) && answer.t > abortAt
  const released = failed ? attributeRelease(tl, rid, answer) : undefined
  record.releasedBy = releasePathOf(answer, released)
  const entry = entryOf(tl, {
    sentAt: sent.t,
    abortAt,
    ...(answer ? {answer} : {}),
    ...(released ? {released} : {}),
    answerLagMs: answerLagOf(tl, eps.highMs),
  })
  record.entry = entry
  const path = {releasePath: record.releasedBy.path, entry: entry.shown, entryEvidence: entry.evidence}
  const common = {tl, sent, rid, abortAt, sides, pollMs, answer, eps, honourBy, windowLow, windowHigh}
  return {...common, evidence, record, released, entry, path}
}

function out(t: Trial, outcome: string, ...verdicts: Verdict[]): Judged {
  t.record.outcome = outcome
  return {verdicts, record: t.record}
}

/** A lost abort counts only once the request is shown to have entered prefill before it; otherwise it did not land. */
function lost(t: Trial, outcome: string, v: Verdict, ...more: Verdict[]): Judged {
  const {entry, path, rid} = t
  if (entry.shown === 'before') return out(t, outcome, {...v, evidence: {...v.evidence, ...path}}, ...more)
  const after = entry.shown === 'after'
  const was = after ? 'its abort having arrived first' : 'after its abort was fired'
  const renamed = more.map(m => ({...m, summary: m.summary.replace(/after its abort was lost$/, was)}))
  const because = after
    ? 'not landed: the abort arrived before the request entered prefill'
    : 'not shown to have entered prefill before its abort'
  const summary = `${v.summary.replace(/^abort lost/, 'abort not shown lost')} — ${because}`
  return out(
    t,
    after ? 'not-landed' : 'entry-unknown',
    unverified('abort', rid, summary, {
      ...v.evidence,
      ...path,
      outcome: after ? 'not-landed' : 'entry-unknown',
      why: `${notEnteredWhy(entry)!}; SGLang drops an abort for a rid it does not know yet`,
      toVerify:
        'abort later after the send (a longer transfer window), read /v1/loads?include=disagg, or give the ' +
        "deployment file the services' logs (logs:, watchdog.logPattern) so the entry is shown",
    }),
    ...renamed,
  )
}

function completed(t: Trial, answer: Answer): Judged {
  const {sent, abortAt, rid, evidence} = t
  const before = answer.t <= abortAt
  return out(
    t,
    'completed',
    pass(
      'abort',
      rid,
      before
        ? `completed before the abort (${secs(answer.t - sent.t)}): the abort missed the transfer window`
        : `completed with ${answer.status} ${secs(answer.t - abortAt)} after the abort: the transfer won the race`,
      evidence,
    ),
  )
}

/**
 * Released (not completed) before any abort was fired: something else let it go, and the abort had nothing to act on.
 */
function releasedBeforeAbort(t: Trial, answer: Answer): Judged {
  return out(
    t,
    'released-before-abort',
    unverified(
      'abort',
      t.rid,
      `released with ${answer.status} ${secs(t.abortAt - answer.t)} before its abort was fired`,
      {
        ...t.evidence,
        outcome: 'released-before-abort',
        why: 'the request was released before its abort was fired: the abort had nothing to act on',
        toVerify: 'a trial whose request is still held when its abort fires (a held window: a TCP data path, --gpu N)',
      },
    ),
  )
}

/** Released within one poll (+ ε) of the abort, by something other than the watchdog: honoured, or not shown so. */
function releasedInAbortBound(t: Trial, answer: Answer, released: NonNullable<Trial['released']>): Judged {
  const {abortAt, rid, evidence, path, sides} = t
  if (released.cause === 'decode-abort' && !sides.includes('decode')) {
    // The abort went to prefill alone, yet decode's ABORT released it: decode let go for its own reasons (a
    // timeout, a lost peer); prefill's own abort path is not what was shown to work.
    const summary =
      `released ${secs(answer.t - abortAt)} after an abort sent to prefill alone, but by decode's ABORT, ` +
      "not prefill's own abort path"
    return out(
      t,
      'rescued-by-decode',
      unverified('abort', rid, summary, {
        ...evidence,
        ...path,
        outcome: 'rescued-by-decode',
        releaseEvidence: released.evidence,
        why:
          "the answer names decode's ABORT: prefill's own abort may have been lost, and decode let go at the " +
          'same time',
        toVerify:
          'a decode whose waiting timeout and heartbeat fire well after the window ' +
          "(SGLANG_DISAGGREGATION_WAITING_TIMEOUT), or the services' logs (logs:)",
      }),
    )
  }
  if (answer.t >= t.windowLow && released.cause !== 'abort') {
    return out(
      t,
      'ambiguous',
      unverified(
        'abort',
        rid,
        `released ${secs(answer.t - abortAt)} after the abort, inside both one poll of it and the watchdog's ` +
          `window; nothing names the abort`,
        {
          ...evidence,
          outcome: 'ambiguous',
          releasedBy: released.cause,
          releaseEvidence: released.evidence,
          why:
            "the release falls inside both the abort's bound (one poll + ε) and the watchdog's window, and " +
            'neither the answer nor a log line says the abort released it',
          toVerify:
            'abort earlier than the deadline minus one poll (a longer deadline or a shorter poll), or give the ' +
            "deployment file the services' logs (logs:) so the release is named",
        },
      ),
    )
  }
  const summary =
    `abort honoured: released ${secs(answer.t - abortAt)} after the abort by ` +
    `${PATH_NAMES[t.record.releasedBy!.path]} (bound one poll + ε = ${secs(t.pollMs + t.eps.highMs)})`
  return out(t, 'honoured', pass('abort', rid, summary, {...evidence, ...path, outcome: 'honoured'}))
}

/** Released past the abort's bound (or by the watchdog), no later than the watchdog's window closes. */
function releasedBeforeWindowEnd(t: Trial, answer: Answer, released: NonNullable<Trial['released']>): Judged {
  const {sent, abortAt, rid, evidence, windowLow} = t
  if (answer.t >= windowLow) return releasedInWindow(t, answer, released)
  const watchdog = released.cause === 'watchdog'
  const v = fail(
    'abort',
    rid,
    watchdog
      ? `abort lost; released by the watchdog ${secs(answer.t - sent.t)} after the send, before its window ` +
          `opens (${secs(windowLow - sent.t)})`
      : `released ${secs(answer.t - abortAt)} after the abort: later than one poll, earlier than the watchdog ` +
          `deadline — neither an honoured abort nor an eviction`,
    {...evidence, outcome: 'unexplained', releasedBy: released.cause, releaseEvidence: released.evidence},
  )
  return watchdog ? lost(t, 'unexplained', v) : out(t, 'unexplained', v)
}

/** Released inside the watchdog's window after the abort: an eviction, and the abort raced or lost. */
function releasedInWindow(t: Trial, answer: Answer, released: NonNullable<Trial['released']>): Judged {
  const {sent, abortAt, rid, evidence, windowLow, windowHigh, eps} = t
  const by = released.cause === 'watchdog' ? 'the watchdog' : 'something other than the abort'
  const eviction = pass(
    'eviction',
    rid,
    `evicted after ${secs(answer.t - sent.t)}, inside ` +
      `[${secs(windowLow - sent.t)}, ${secs(windowHigh - sent.t)}], after its abort was fired`,
    {...evidence, releasedBy: released.cause},
  )
  if (released.cause === 'watchdog' && answer.t - abortAt <= eps.highMs) {
    // The watchdog's release was seen within one observation delay of the abort: the abort may have reached the
    // server only after the watchdog had acted, so it was not shown lost.
    return out(
      t,
      'raced',
      unverified(
        'abort',
        rid,
        `released by the watchdog ${secs(answer.t - abortAt)} after the abort was fired, within the ` +
          `observation delay (ε ${secs(eps.highMs)}): the abort may have arrived after the eviction`,
        {
          ...evidence,
          outcome: 'raced',
          releasedBy: released.cause,
          releaseEvidence: released.evidence,
          why:
            'the watchdog released the request within one observation delay of the abort, so whether the ' +
            'abort reached the server first is unknown',
          toVerify:
            'abort earlier in the window (well before the watchdog deadline), on a less loaded host (a smaller ε)',
        },
      ),
      eviction,
    )
  }
  const past = answer.t > t.honourBy ? `, past one poll + ε = ${secs(t.pollMs + eps.highMs)}` : ''
  return lost(
    t,
    'lost-then-evicted',
    fail(
      'abort',
      rid,
      `abort lost; released by ${by} after ${secs(answer.t - sent.t)} (${secs(answer.t - abortAt)} after the ` +
        `abort${past})`,
      {
        ...evidence,
        outcome: 'lost-then-evicted',
        releasedBy: released.cause,
        releaseEvidence: released.evidence,
      },
    ),
    {...eviction, summary: eviction.summary.replace(/was fired$/, 'was lost')},
  )
}

/** Released only past the watchdog's window, or never: the abort was lost and nothing let the pin go in time. */
function lateOrPinned(t: Trial, end: number): Judged {
  const {sent, answer, rid, evidence, windowHigh} = t
  const heldFor = (answer?.t ?? end) - sent.t
  const outcome = answer ? 'late' : 'pinned'
  return lost(
    t,
    outcome,
    fail(
      'abort',
      rid,
      answer
        ? `abort lost and the pin was released only after ${secs(heldFor)}, past deadline + poll + ε ` +
            `(${secs(windowHigh - sent.t)})`
        : `abort lost and the pin is still held after ${secs(heldFor)}: nothing released it`,
      {...evidence, outcome, heldSeconds: round(heldFor / 1000, 3)},
    ),
  )
}
