import {BOOTSTRAP_FAILED_TOTAL, TRANSFER_FAILED_TOTAL, WATCHDOG_EVICTED_TOTAL} from '../engines/sglang/sglang-metrics.js'
import {logLinesOf, logReadOf, type Timeline} from '../model/timeline.js'

/**
 * What released a pin, read from its answer's error text (the prefill's 500 body, passed on by the router). The
 * texts are SGLang's and the twin's own:
 * - SGLang, python/sglang/srt/disaggregation/prefill.py handle_inflight_transfer_failure: "Prefill transfer failed
 *   for request rank=N req.rid='…' req.bootstrap_room=… with exception KVTransferError(bootstrap_room=…): <reason>";
 *   the reason is the backend's: NIXL "NIXL transfer encountered ERR room=…" (nixl/conn.py transfer_worker),
 *   Mooncake "Failed to send kv chunk of … to …" (mooncake/conn.py), an abort "Aborted by AbortReq."
 *   (common/conn.py), a timeout "… timed out after Xs in KVPoll.…", or just "KV transfer failed" when the failure
 *   came from another TP rank (the answer is written by rank 0, which only saw the all-reduced Failed).
 * - sgl-model-gateway: "No available servers: …" (code server_selection_failed) when no worker could be picked.
 * - the twin: the same sentence, its transport errors carrying "transport error (UCX Endpoint timeout: Transport
 *   retry count exceeded …)"; its watchdog "Request … evicted by the disaggregation watchdog after …".
 * - decode letting go: decode's receiver sends ABORT to the prefill ranks on its waiting timeout or its own abort
 *   (common/conn.py CommonKVReceiver._check_waiting_timeout, abort, _send_abort_notification); the prefill rank then
 *   fails the room with "Request R was aborted by decode." (nixl/conn.py, after #30352) or, in later versions,
 *   "Aborted by decode-side abort notification." / "Aborted by peer notification.". Which of decode's reasons it was
 *   only decode's own line says: "Decode transfer failed for request rank=N decode_req.req.rid='…'
 *   decode_req.req.bootstrap_room=R with exception KVTransferError(bootstrap_room=R): Request R timed out after Xs in
 *   KVPoll.WaitingForInput" (disaggregation/decode.py pop_transferred), or "Lost connection with prefill instance
 *   (bootstrap_addr: …)" after heartbeat failures (common/conn.py _handle_node_failure).
 */

export type ReleaseCause =
  | 'watchdog'
  | 'bootstrap-timeout'
  | 'waiting-timeout'
  | 'heartbeat'
  | 'transport-error'
  | 'transfer-failed'
  | 'abort'
  | 'decode-abort'
  | 'revert'
  | 'timeout'
  | 'gateway'
  | 'unknown'

/** How a report names each cause. */
export const CAUSE_NAMES: Record<ReleaseCause, string> = {
  watchdog: 'the watchdog',
  'bootstrap-timeout': "SGLang's bootstrap timeout (prefill, SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT)",
  'waiting-timeout': "decode's waiting timeout (SGLANG_DISAGGREGATION_WAITING_TIMEOUT)",
  heartbeat: "decode's heartbeat failure (it lost the prefill instance)",
  'transport-error': 'a transport error',
  'transfer-failed': 'a KV transfer failure (its reason not stated: it came from another TP rank)',
  abort: 'an abort (/abort_request)',
  'decode-abort': "decode letting go of its half (its ABORT reached prefill; decode's own reason not shown)",
  revert: 'the revert of the fault',
  timeout: 'an SGLang timeout',
  gateway: 'the gateway (no worker available)',
  unknown: 'an unknown cause',
}

const TRANSPORT = [
  /NIXL transfer encountered ERR/i,
  /transport error/i,
  /Transport retry count exceeded/i,
  /Endpoint timeout/i,
  /UCS_ERR_\w+/,
  /IBV_WC_\w+_ERR/,
  /Failed to send kv chunk/i,
  /KVSender failed to (post|create) transfer/i,
  /Failed to (post|create) sliced KV transfer/i,
]

export function releaseCauseOf(detail: string | undefined): {cause: ReleaseCause; evidence: string} {
  const text = detail ?? ''
  const quote = (m: RegExpExecArray) => `"${text.slice(Math.max(0, m.index - 40), m.index + m[0].length + 80).trim()}"`
  if (!text) return {cause: 'unknown', evidence: 'the answer carried no error text'}
  // The gateway's own 503 when no worker is available (unhealthy, or its circuit breaker open): the final attempt
  // reached no worker (sgl-model-gateway pd_router.rs handle_server_selection_error).
  let m = /server_selection_failed|No available servers/.exec(text)
  if (m) return {cause: 'gateway', evidence: quote(m)}
  m = /evicted by the disaggregation watchdog|watchdog/i.exec(text)
  if (m) return {cause: 'watchdog', evidence: quote(m)}
  m = /Aborted by AbortReq/i.exec(text)
  if (m) return {cause: 'abort', evidence: quote(m)}
  m = /was aborted by decode|Aborted by decode-side abort notification|Aborted by peer notification/i.exec(text)
  if (m) return {cause: 'decode-abort', evidence: quote(m)}
  m = /timed out after [\d.]+\s*s in KVPoll\.(\w+)/i.exec(text)
  if (m)
    return {
      cause:
        m[1] === 'Bootstrapping' ? 'bootstrap-timeout' : m[1] === 'WaitingForInput' ? 'waiting-timeout' : 'timeout',
      evidence: quote(m),
    }
  m = /Lost connection with prefill instance/i.exec(text)
  if (m) return {cause: 'heartbeat', evidence: quote(m)}
  for (const re of TRANSPORT) {
    m = re.exec(text)
    if (m) return {cause: 'transport-error', evidence: quote(m)}
  }
  m = /(Prefill|Decode) transfer failed|KV transfer failed|KVTransferError/i.exec(text)
  if (m) return {cause: 'transfer-failed', evidence: quote(m)}
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
