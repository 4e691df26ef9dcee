import type {Outcome} from '../model/verdict.js'

/**
 * The vLLM lease oracle: P's KV blocks, held for a request whose D leg never collects them, are released by the
 * lease's reaper no earlier than grant + duration and no later than one engine step plus one reaper pass after it.
 * Pure: a function of what the caller observed. A pass needs a log line naming this request and the expiry path,
 * or a counter move that only this batch's expiries explain (P otherwise idle, shown by its request counters); all
 * else is unverified with what would decide it.
 *
 * The grant's clock: P sets the deadline in `request_finished` before it answers (pull_scheduler.py), so the grant
 * lies in [sent, answered] of the client's own epoch clock; the log's clock is the host's, whole seconds, so a line
 * at T means a release in [T, T + resolution).
 */

export interface LeaseSetting {
  seconds: number
  /** Where it was read: "kv_transfer_config on P's command line", "deployment file"… */
  source: string
}

export interface KvLeaseSettings {
  mode: 'lease' | 'legacy' | 'unknown'
  /** kv_lease_duration (lease) or VLLM_NIXL_ABORT_REQUEST_TIMEOUT (legacy); undefined = not known. */
  duration?: LeaseSetting
  extension?: LeaseSetting
  heartbeatInterval?: LeaseSetting
  /** One engine step (ms) and the reaper's period (ms; vLLM's reaper runs in every step's get_finished). */
  stepMs?: number
  reaperMs?: number
  /** Set when stepMs/reaperMs are an assumed bound, not read from the engine: why they were assumed. */
  stepAssumed?: string
}

export interface LeaseRequest {
  requestId: string
  /** Epoch ms the client sent the request to P and P answered (the grant lies between). */
  sentMs: number
  answeredMs: number
  /** D was sent the request: its heartbeats may have renewed the lease. */
  decodeSent: boolean
}

export interface LogRelease {
  t: number
  resolutionMs: number
  requestId: string
  cause: 'lease-expired' | 'legacy-timeout' | 'unrecognized-notification'
  line: string
}

export interface CounterSample {
  t: number
  value: number
  /** When the scrape was sent (epoch ms): the value was read in [fromT, t]. Absent: t alone. */
  fromT?: number
}

export interface KvLeaseInput {
  requests: LeaseRequest[]
  settings: KvLeaseSettings
  /** Release lines from P's log; undefined when the log could not be read. */
  logReleases?: LogRelease[]
  /** Until when (epoch ms) the log was read: a release after it is not seen. */
  observedUntilMs: number
  /** P's vllm:nixl_num_kv_expired_reqs samples, in time order. */
  expiredCounter?: CounterSample[]
  /**
   * P's own traffic, in time order: what a counter-only pass needs to show that only this batch's expiries can
   * explain the counter's move (the counter names no request). Absent: a counter-only pass is unverified.
   */
  traffic?: TrafficSample[]
}

/** One sample of P's request counters (its /metrics). */
export interface TrafficSample {
  t: number
  /** vllm:request_success summed over finished_reason: the requests P has finished. */
  finished: number
  /** vllm:kv_cache_usage_perc: 0 means P held no blocks, so no earlier request's lease was outstanding. */
  kvUsage?: number
}

export interface KvLeaseVerdict {
  subject: string
  verdict: Outcome
  summary: string
  evidence: Record<string, unknown>
}

const EXPECTED_CAUSE = {lease: 'lease-expired', legacy: 'legacy-timeout'} as const

const unverified = (subject: string, summary: string, why: string, toVerify: string, more = {}): KvLeaseVerdict => ({
  subject,
  verdict: 'unverified',
  summary,
  evidence: {why, toVerify, ...more},
})

/** The window a release must fall in: [sent + duration, answered + duration + step + reaper]. */
export function leaseWindow(r: LeaseRequest, durationS: number, s: KvLeaseSettings): {openMs: number; closeMs: number} {
  return {openMs: r.sentMs + durationS * 1000, closeMs: r.answeredMs + durationS * 1000 + s.stepMs! + s.reaperMs!}
}

/**
 * The counter as evidence for a whole batch: it stood at its first value until the earliest window opened and had
 * risen by exactly the batch's size in a sample taken before the last window closed. It names no request, so it
 * speaks for the batch only on a P otherwise idle (idleOtherwise); `at` is the sample that showed the rise.
 */
function counterCovers(input: KvLeaseInput, durationS: number): {by: string; at: number} | undefined {
  const c = input.expiredCounter
  if (!c || c.length < 2 || input.requests.length === 0) return undefined
  const wins = input.requests.map(r => leaseWindow(r, durationS, input.settings))
  const open = Math.min(...wins.map(w => w.openMs))
  const close = Math.max(...wins.map(w => w.closeMs))
  const base = c[0]!
  if (base.t > Math.min(...input.requests.map(r => r.sentMs))) return undefined
  const lastBefore = [...c].reverse().find(x => x.t < open)
  if (!lastBefore || lastBefore.value !== base.value) return undefined
  const atClose = [...c].reverse().find(x => x.t <= close)
  if (!atClose || atClose.value - base.value !== input.requests.length) return undefined
  const by =
    `vllm:nixl_num_kv_expired_reqs ${base.value} until ${new Date(lastBefore.t).toISOString()} (before the first ` +
    `window), +${atClose.value - base.value} by ${new Date(atClose.t).toISOString()}: one per request of the batch`
  return {by, at: atClose.t}
}

const IDLE_TO_VERIFY =
  'read P\'s log (its WARNING "Releasing expired KV blocks for request <id>" lines name each request), or sample ' +
  "P's vllm:request_success and vllm:kv_cache_usage_perc before the batch and after the windows"

/**
 * Whether only this batch can explain the counter's move by `atMs`: P held no blocks when the batch was sent (no
 * earlier lease outstanding) and finished no request but ours up to a sample at or after `atMs` (a lease starts only
 * when its request finishes). Returns the evidence, or why it is not shown.
 */
function idleOtherwise(input: KvLeaseInput, atMs: number): {idle: string} | {why: string} {
  const tr = input.traffic ?? []
  const first = tr[0]
  const firstSent = Math.min(...input.requests.map(r => r.sentMs))
  if (!first || first.t > firstSent) return {why: "P's request counters were not sampled before the batch was sent"}
  if (first.kvUsage !== 0)
    return {why: `P held blocks before the batch (vllm:kv_cache_usage_perc ${first.kvUsage ?? 'not read'})`}
  const last = [...tr].reverse().find(x => x.t >= atMs)
  if (!last) return {why: "P's request counters were not sampled after the counter's rise"}
  const rise = last.finished - first.finished
  if (rise !== input.requests.length)
    return {why: `P finished ${rise} request(s) meanwhile, the batch has ${input.requests.length}: other traffic`}
  return {
    idle:
      `P otherwise idle: kv_cache_usage_perc 0 at ${new Date(first.t).toISOString()}, request_success ` +
      `+${rise} (the batch) by ${new Date(last.t).toISOString()}`,
  }
}

/** A counter-only verdict: pass on an otherwise idle P, else unverified (the counter names no request). */
function byCounter(input: KvLeaseInput, id: string, ev: Record<string, unknown>): KvLeaseVerdict | undefined {
  const c = counterCovers(input, input.settings.duration!.seconds)
  if (!c) return undefined
  const idle = idleOtherwise(input, c.at)
  if ('idle' in idle)
    return {
      subject: id,
      verdict: 'pass',
      summary: 'released by the expiry path (counter, P otherwise idle)',
      evidence: {...ev, by: c.by, idle: idle.idle},
    }
  return unverified(
    id,
    'the expiry counter moved by the batch, but it names no request',
    `another request's expiry on P could stand in for this one: ${idle.why}`,
    IDLE_TO_VERIFY,
    {...ev, by: c.by},
  )
}

/** Judge every request; each verdict names its clock, window and evidence. */
export function judgeKvLeases(input: KvLeaseInput): KvLeaseVerdict[] {
  return input.requests.map(r => judgeOne(input, r))
}

function judgeOne(input: KvLeaseInput, r: LeaseRequest): KvLeaseVerdict {
  const s = input.settings
  const id = r.requestId
  if (s.mode === 'unknown' || !s.duration)
    return unverified(
      id,
      'lease settings unknown',
      'neither kv_lease_duration nor VLLM_NIXL_ABORT_REQUEST_TIMEOUT was read',
      "read P's --kv-transfer-config (kv_connector_extra_config.kv_lease_duration) or its environment",
    )
  if (s.stepMs === undefined || s.reaperMs === undefined)
    return unverified(id, 'engine step time unknown', 'the window has no upper bound without the step time', 'state it')
  if (r.decodeSent && s.mode === 'lease')
    return unverified(
      id,
      'D was sent this request: heartbeats may have renewed the lease',
      'the deadline is max(grant + duration, last heartbeat + extension) and no heartbeat was observed',
      "judge requests whose D leg was dropped, or read P's heartbeat renewals",
    )
  const win = leaseWindow(r, s.duration.seconds, s)
  const clock = {
    grant:
      `client epoch clock: sent ${new Date(r.sentMs).toISOString()}, ` +
      `answered ${new Date(r.answeredMs).toISOString()}`,
    log: "P's log, host local time, whole seconds",
  }
  const ev = {
    clock,
    windowMs: [win.openMs, win.closeMs],
    window:
      `[sent + ${s.duration.seconds} s, answered + ${s.duration.seconds} s + step ${s.stepMs} ms + ` +
      `reaper ${s.reaperMs} ms]`,
    duration: s.duration,
    mode: s.mode,
  }
  if (!input.logReleases)
    return (
      byCounter(input, id, ev) ??
      unverified(id, "P's log unreadable", 'no line names this release', "read P's log (its WARNING lines)", ev)
    )
  return judgeByLog(input, r, win, ev)
}

function judgeByLog(
  input: KvLeaseInput,
  r: LeaseRequest,
  win: {openMs: number; closeMs: number},
  ev: Record<string, unknown>,
): KvLeaseVerdict {
  const id = r.requestId
  const mode = input.settings.mode as 'lease' | 'legacy'
  const line = input.logReleases!.find(o => o.requestId === id && o.cause !== 'unrecognized-notification')
  if (!line) {
    const counted = byCounter(input, id, ev)
    if (counted) return counted
    if (input.observedUntilMs < win.closeMs + 1000)
      return unverified(id, 'window not yet closed', 'the log was read before the window closed', 'read it later', ev)
    return {
      subject: id,
      verdict: 'fail',
      summary: 'never released: no expiry line for it after its window closed',
      evidence: {...ev, failure: 'never', logReadUntil: new Date(input.observedUntilMs).toISOString()},
    }
  }
  const at = {...ev, line: line.line, releasedIn: [line.t, line.t + line.resolutionMs], cause: line.cause}
  Object.assign(at, sampledEvidence(input, id, line))
  if (line.cause !== EXPECTED_CAUSE[mode])
    return {subject: id, verdict: 'fail', summary: `released by ${line.cause}, not the ${mode} path`, evidence: at}
  if (line.t + line.resolutionMs <= win.openMs)
    return {
      subject: id,
      verdict: 'fail',
      summary:
        `released early: by ${new Date(line.t + line.resolutionMs).toISOString()}, ` +
        `window opens ${new Date(win.openMs).toISOString()}`,
      evidence: {...at, failure: 'early', earlyByMs: win.openMs - (line.t + line.resolutionMs)},
    }
  if (line.t > win.closeMs && input.settings.stepAssumed)
    // Past an assumed bound is not shown late: a slower engine step than assumed puts the same release in its window.
    return unverified(
      id,
      `released ${line.t - win.closeMs} ms or more past a window closed by an assumed step bound`,
      `the upper edge rests on an assumption (${input.settings.stepAssumed}), not on the engine's own step time`,
      "read P's step time (its vllm:iteration or step-duration metrics, or the log's step timing) and judge again",
      {...at, lateByMs: line.t - win.closeMs},
    )
  if (line.t > win.closeMs)
    return {
      subject: id,
      verdict: 'fail',
      summary:
        `released late: at ${new Date(line.t).toISOString()} or after, ` +
        `window closed ${new Date(win.closeMs).toISOString()}`,
      evidence: {...at, failure: 'late', lateByMs: line.t - win.closeMs},
    }
  return {subject: id, verdict: 'pass', summary: `released by the ${mode} expiry path in its window`, evidence: at}
}

/**
 * The expiry counter as a finer clock than the log's second, on a P shown otherwise idle (idleOtherwise): leases of
 * one duration expire in grant order, and when each request of the batch was answered before the next was sent, the
 * k-th rise of the counter is the k-th request's release. It happened after the scrape before the rise was sent and
 * before the scrape that showed it answered. Empty when P is not shown idle or the requests overlap.
 */
export function sampledReleases(input: KvLeaseInput): Map<string, [number, number]> {
  const out = new Map<string, [number, number]>()
  const c = input.expiredCounter
  const rs = [...input.requests].sort((a, b) => a.sentMs - b.sentMs)
  if (!c || c.length < 2 || rs.length === 0 || c[0]!.t > rs[0]!.sentMs) return out
  if (rs.some((r, i) => i > 0 && r.sentMs < rs[i - 1]!.answeredMs)) return out
  for (const [k, r] of rs.entries()) {
    const i = c.findIndex(x => x.value >= c[0]!.value + k + 1)
    if (i <= 0 || !('idle' in idleOtherwise(input, c[i]!.t))) break
    out.set(r.requestId, [c[i - 1]!.fromT ?? c[i - 1]!.t, c[i]!.t])
  }
  return out
}

/**
 * The release time from the counter's samples, on the client's clock (the log's second is on the host's): evidence
 * only, the verdict stays on the log's line. `sampledMeetsLogSecond` false: the clocks or the attribution disagree.
 */
function sampledEvidence(input: KvLeaseInput, id: string, line: LogRelease): Record<string, unknown> {
  const s = sampledReleases(input).get(id)
  if (!s) return {}
  return {
    releasedInSampled: s,
    sampledMeetsLogSecond: s[0] < line.t + line.resolutionMs && s[1] >= line.t,
    sampledHow:
      "between two scrapes of P's vllm:nixl_num_kv_expired_reqs (client clock), P otherwise idle: the counter's " +
      'k-th rise is the k-th grant (one lease duration, requests one after another)',
  }
}
