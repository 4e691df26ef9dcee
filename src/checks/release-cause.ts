import {
  BOOTSTRAP_FAILED_TOTAL,
  TRANSFER_FAILED_TOTAL,
  WATCHDOG_EVICTED_TOTAL,
} from '../engines/sglang/sglang-metrics.js'
import type {ReleaseText} from '../engines/engine.js'
import {CAUSE_NAMES, type ReleaseCause, SGLANG_RELEASE_TEXTS} from '../engines/sglang/release-texts.js'
import {logLinesOf, logReadOf, type Timeline} from '../model/timeline.js'

/**
 * What released a pin, read from its answer's error text (the prefill's 500 body, passed on by the router) or a log
 * line. The texts are the engine's (engines/sglang/release-texts.ts, where each is cited upstream), taken as data.
 */

export type {ReleaseCause}
export {CAUSE_NAMES}

export function releaseCauseOf(
  detail: string | undefined,
  texts: readonly ReleaseText<ReleaseCause>[] = SGLANG_RELEASE_TEXTS,
): {cause: ReleaseCause; evidence: string} {
  const text = detail ?? ''
  const quote = (m: RegExpExecArray) => `"${text.slice(Math.max(0, m.index - 40), m.index + m[0].length + 80).trim()}"`
  if (!text) return {cause: 'unknown', evidence: 'the answer carried no error text'}
  for (const t of texts) {
    const m = t.re.exec(text)
    if (!m) continue
    // The state the text names picks a more precise cause (SGLang's KVPoll.<state>); another state keeps `cause`.
    const state = m[1]
    const byState = t.byState && state !== undefined && Object.hasOwn(t.byState, state) ? t.byState[state] : undefined
    return {cause: byState ?? t.cause, evidence: quote(m)}
  }
  return {cause: 'unknown', evidence: `"${text.slice(0, 160)}"`}
}

/** What released one pin, with every piece of evidence it rests on, and what could not be read. */
export interface Attribution {
  cause: ReleaseCause
  /** What the cause rests on, strongest first: log lines (service and source), the answer's text, counter changes. */
  evidence: string[]
  /** The watchdog's own log line for the pin: the seconds it held it, by the server's clock. */
  watchdogHeldSeconds?: number
  /** Logs that could not be read, and why (the cause is then what the rest shows, and says so). */
  logsUnread: string[]
}

/** Counters that move with each cause, on the service that counts it. */
const CAUSE_COUNTERS: Partial<Record<ReleaseCause, Array<['prefill' | 'decode', string]>>> = {
  watchdog: [['prefill', WATCHDOG_EVICTED_TOTAL]],
  'bootstrap-timeout': [['prefill', BOOTSTRAP_FAILED_TOTAL]],
  'waiting-timeout': [
    ['decode', TRANSFER_FAILED_TOTAL],
    ['prefill', TRANSFER_FAILED_TOTAL],
  ],
  heartbeat: [
    ['decode', TRANSFER_FAILED_TOTAL],
    ['prefill', TRANSFER_FAILED_TOTAL],
  ],
  'decode-abort': [
    ['decode', TRANSFER_FAILED_TOTAL],
    ['prefill', TRANSFER_FAILED_TOTAL],
  ],
  'transport-error': [['prefill', TRANSFER_FAILED_TOTAL]],
  'transfer-failed': [['prefill', TRANSFER_FAILED_TOTAL]],
  abort: [['prefill', TRANSFER_FAILED_TOTAL]],
}

/** Causes decode states in its own line, more precise than prefill's "aborted by decode". */
const DECODE_CAUSES: ReleaseCause[] = ['waiting-timeout', 'heartbeat', 'transport-error', 'abort']

/**
 * What released a pin that was answered with an error: (a) the services' log lines naming its rid (the watchdog's
 * own line first: it also gives the server's clock), (b) the answer's error text, and, when prefill's words only say
 * that decode let go, decode's line for the same rid; (c) the counter that moves with that cause, around the answer,
 * as corroboration (a counter counts every request: it never names one). A log that could not be read is named.
 */
export function attributeRelease(tl: Timeline, rid: string, answer: {t: number; detail?: string}): Attribution {
  const evidence: string[] = []
  const lines = logLinesOf(tl, rid)
  const quote = (l: {service: string; source: string; line: string}) =>
    `${l.service} log (${l.source}): "${l.line.length > 400 ? `${l.line.slice(0, 400)}…` : l.line}"`
  const logsUnread = (['prefill', 'decode'] as const).flatMap(s => {
    const r = logReadOf(tl, s)
    if (!r) return [`${s}'s log was not read`]
    return r.ok ? [] : [`${s}'s log could not be read: ${r.detail}`]
  })
  let cause: ReleaseCause
  let watchdogHeldSeconds: number | undefined
  const wd = lines.find(l => l.watchdog?.rid === rid)
  const text = releaseCauseOf(answer.detail)
  if (wd) {
    cause = 'watchdog'
    watchdogHeldSeconds = wd.watchdog!.heldSeconds
    evidence.push(quote(wd))
  } else {
    cause = text.cause
    // Prefill's own line for the rid says more than a 500 cut short, or one from another rank.
    const prefillLine = lines.find(l => l.service === 'prefill' && releaseCauseOf(l.line).cause !== 'unknown')
    if (prefillLine && (cause === 'unknown' || cause === 'transfer-failed'))
      cause = releaseCauseOf(prefillLine.line).cause
    if (prefillLine) evidence.push(quote(prefillLine))
  }
  if (answer.detail) evidence.push(`the answer: ${text.evidence}`)
  if (cause === 'decode-abort' || cause === 'transfer-failed') {
    // An unexplained prefill failure is decode's doing only by decode's own timeout or heartbeat: an abort on decode
    // after prefill failed is pdchaos (or the gateway) letting go of decode's half.
    const allowed: ReleaseCause[] = cause === 'decode-abort' ? DECODE_CAUSES : ['waiting-timeout', 'heartbeat']
    const decodeLine = lines
      .filter(l => l.service === 'decode')
      .map(l => ({l, c: releaseCauseOf(l.line).cause}))
      .filter(x => allowed.includes(x.c))
      .sort((a, b) => DECODE_CAUSES.indexOf(a.c) - DECODE_CAUSES.indexOf(b.c))[0]
    if (decodeLine) {
      cause = decodeLine.c === 'abort' ? 'decode-abort' : decodeLine.c
      evidence.push(quote(decodeLine.l))
    } else if (cause === 'decode-abort') {
      const unread = logsUnread.find(u => u.startsWith('decode'))
      evidence.push(unread ? `decode's reason unknown: ${unread}` : "decode's log names no failure of this rid")
    }
  }
  // Answered only after the fault was taken out, with nothing else named: the revert let it go.
  const reverted = tl.observations.find(o => o.kind === 'fault-reverted' && o.t <= answer.t)
  if (reverted && (cause === 'unknown' || cause === 'transfer-failed')) {
    cause = 'revert'
    evidence.push(`answered ${((answer.t - reverted.t) / 1000).toFixed(3)} s after the fault was reverted`)
  }
  for (const [service, name] of CAUSE_COUNTERS[cause] ?? []) {
    const d = counterChange(tl, service, name, answer.t)
    if (d) evidence.push(d)
  }
  return {cause, evidence, ...(watchdogHeldSeconds === undefined ? {} : {watchdogHeldSeconds}), logsUnread}
}

/** How a counter changed between the last sample before t and the first after it (undefined: not sampled around t). */
export function counterChange(tl: Timeline, service: string, name: string, t: number): string | undefined {
  let before: {t: number; value: number} | undefined
  let after: {t: number; value: number} | undefined
  for (const o of tl.observations) {
    if (o.kind !== 'metric' || o.service !== service || o.name !== name) continue
    if (o.t <= t && (!before || o.t >= before.t)) before = o
    if (o.t > t && (!after || o.t < after.t)) after = o
  }
  if (!before || !after) return undefined
  const d = after.value - before.value
  return (
    `${service} ${name} ${d >= 0 ? '+' : ''}${d} between ${((before.t - t) / 1000).toFixed(1)} s and ` +
    `+${((after.t - t) / 1000).toFixed(1)} s of the answer (a count of every request, not of this one)`
  )
}
