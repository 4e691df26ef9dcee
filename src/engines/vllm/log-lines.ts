/**
 * vLLM's log lines that name a release of P's KV blocks, parsed into observations. Pure: text in, observations out.
 *
 * Line format (vllm/logger.py: `_FORMAT = "%(levelname)s %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s"`,
 * `_DATE_FORMAT = "%m-%d %H:%M:%S"`), prefixed in the engine core's process by `(EngineCore_DP0 pid=N) `, e.g. as
 * quoted in vLLM issues: `(EngineCore_DP0 pid=3747544) WARNING 09-24 16:35:21 [nixl_connector.py:1048] Releasing
 * expired KV blocks for request cmpl-…-0 which were retrieved by 0 decode worker(s) within 120 seconds.`
 * The timestamp is the host's local time, whole seconds (strftime truncates), with neither year nor zone: the
 * reader supplies both (`year` near a reference time, the host's UTC offset) and every time carries a 1 s resolution.
 */

export type ReleaseLineCause = 'lease-expired' | 'legacy-timeout' | 'unrecognized-notification'

export interface ReleaseObservation {
  /** Epoch ms of the log's timestamp (the start of its second): the event happened in [t, t + resolutionMs). */
  t: number
  resolutionMs: number
  requestId: string
  cause: ReleaseLineCause
  /** Remote workers that read the blocks, as the line states. */
  retrievedBy?: number
  line: string
}

/** The log clock: whole seconds (vllm/logger.py `_DATE_FORMAT` has no `%f`, and the format no `%(msecs)`). */
export const VLLM_LOG_RESOLUTION_MS = 1000

/** Level and `%m-%d %H:%M:%S` anywhere (after `VLLM_LOGGING_PREFIX` or a process prefix), an optional fraction (some
 * forks append milliseconds), then `[file:line]` (older vLLM: `file:line]`) and the message. */
const HEAD = new RegExp(
  String.raw`\b(DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+(\d\d)-(\d\d)\s+(\d\d):(\d\d):(\d\d)` +
    String.raw`(?:[.,](\d{1,6}))?\s+\[?[^\s\]]+\]\s+(.*)$`,
)
/** ColoredFormatter's ANSI colours (vllm/logging_utils), when VLLM_LOGGING_COLOR forces them into a file. */
const ANSI = /\x1b\[[0-9;]*m/g
/** The lease's reaper (PR #41383): base_worker.py `_reap_expired_send_leases`. */
const LEASE = new RegExp(
  String.raw`^Releasing expired KV blocks for request (\S+) which were retrieved by (\d+) remote worker\(s\)` +
    String.raw` before lease expired\.?$`,
)
/** The legacy timeout: nixl_connector.py `NixlConnectorWorker.get_finished` (VLLM_NIXL_ABORT_REQUEST_TIMEOUT). */
const LEGACY = new RegExp(
  String.raw`^Releasing expired KV blocks for request (\S+) which were retrieved by (\d+) decode worker\(s\)` +
    String.raw` within (\d+) seconds\.?$`,
)
/** A read notification for a request P no longer holds (worker `_get_new_notifs`); the wording varies by version. */
const UNRECOGNIZED = /^Potentially invalid KV blocks for unrecognized request (\S+) were retrieved by/

export interface LogClock {
  /** The year the log's month-day belongs to is the one that puts it nearest this epoch ms. */
  nearMs: number
  /** The host's offset from UTC in minutes (UTC+2 is 120); default: this process's own zone at that time. */
  utcOffsetMin?: number
}

function epochOf(clock: LogClock, mo: number, d: number, h: number, mi: number, s: number): number {
  const near = new Date(clock.nearMs)
  let best = Number.NaN
  for (const y of [near.getUTCFullYear() - 1, near.getUTCFullYear(), near.getUTCFullYear() + 1]) {
    const off = clock.utcOffsetMin ?? -new Date(y, mo - 1, d, h, mi, s).getTimezoneOffset()
    const t = Date.UTC(y, mo - 1, d, h, mi, s) - off * 60_000
    if (Number.isNaN(best) || Math.abs(t - clock.nearMs) < Math.abs(best - clock.nearMs)) best = t
  }
  return best
}

/** One line → a release observation, or undefined when the line names no release. */
export function parseReleaseLine(line: string, clock: LogClock): ReleaseObservation | undefined {
  const text = line.replace(ANSI, '').trimEnd()
  const m = HEAD.exec(text)
  if (!m) return undefined
  const msg = m[8]!
  const frac = m[7]
  const fracMs = frac === undefined ? 0 : Number(`0.${frac}`) * 1000
  const at = (): number => epochOf(clock, +m[2]!, +m[3]!, +m[4]!, +m[5]!, +m[6]!) + fracMs
  const resolutionMs = frac === undefined ? VLLM_LOG_RESOLUTION_MS : 1000 / 10 ** frac.length
  const base = {resolutionMs, line: text}
  let r = LEASE.exec(msg)
  if (r) return {...base, t: at(), requestId: r[1]!, cause: 'lease-expired', retrievedBy: +r[2]!}
  r = LEGACY.exec(msg)
  if (r) return {...base, t: at(), requestId: r[1]!, cause: 'legacy-timeout', retrievedBy: +r[2]!}
  r = UNRECOGNIZED.exec(msg)
  if (r) return {...base, t: at(), requestId: r[1]!, cause: 'unrecognized-notification'}
  return undefined
}

/** Every release a log text names, in the log's order. Lines that are not vLLM's format are skipped. */
export function parseReleaseLog(text: string, clock: LogClock): ReleaseObservation[] {
  const out: ReleaseObservation[] = []
  for (const line of text.split('\n')) {
    const o = parseReleaseLine(line, clock)
    if (o) out.push(o)
  }
  return out
}

/** Any vLLM log line's time and message (issue 31 wedge-rank reads P's DEBUG renewals); undefined when not vLLM's. */
export function parseLogLine(
  line: string,
  clock: LogClock,
): {t: number; resolutionMs: number; msg: string; line: string} | undefined {
  const text = line.replace(ANSI, '').trimEnd()
  const m = HEAD.exec(text)
  if (!m) return undefined
  const frac = m[7]
  const t =
    epochOf(clock, +m[2]!, +m[3]!, +m[4]!, +m[5]!, +m[6]!) + (frac === undefined ? 0 : Number(`0.${frac}`) * 1000)
  const resolutionMs = frac === undefined ? VLLM_LOG_RESOLUTION_MS : 1000 / 10 ** frac.length
  return {t, resolutionMs, msg: m[8]!, line: text}
}
