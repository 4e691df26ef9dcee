import type {KvLeaseSettings, LogRelease} from './kv-lease.js'
import type {Outcome} from '../model/verdict.js'

/**
 * "Pinned while renewed" (vLLM, issue 31 item 3, stall-kv): D's READ of P's blocks is stalled on the data path while
 * D stays alive. D keeps the request waiting for its KV and heartbeats it (base_scheduler.py: every request waiting
 * for remote KVs is heartbeated every kv_lease_duration // 6), so P's lease is renewed; nothing in vLLM's
 * `_pop_done_transfers` bounds a READ that NIXL reports `PROC`. Pure: a function of what the run observed.
 * - pass: P's log names the request's release by lease expiry after D stopped holding it (its READ failed: D's leg
 *   answered an error), no earlier than grant + duration and no later than D's stop + extension + step + reaper;
 * - fail "pinned": no release line for it by the bound (grant + 2 x duration + extension + slack), while D still held
 *   it (its leg unanswered, D healthy, D's num_requests_waiting covering it): the blocks stay pinned for as long as D
 *   heartbeats;
 * - fail "freed-early": a release line while D still held the request and heartbeated (its leg unanswered after the
 *   line, and D still counted it waiting): P did not honour the renewals; or a release line whose whole second ends
 *   before P's own last logged renewal of it (DEBUG, nixl/base_worker.py `_handle_heartbeat`) + its extension;
 * - fail "not-renewed": P is known to log at DEBUG (VLLM_LOGGING_LEVEL=DEBUG in its environment, or renewal lines of
 *   other requests of the run), D's heartbeats reached P while D held the request for longer than a heartbeat
 *   interval, yet P logged no renewal of it: P applied none of D's renewals (#53095), whatever the release time;
 * - unverified otherwise, with what would decide it (P not shown at DEBUG: a release that could precede D's last
 *   renewal is unverified, "set VLLM_LOGGING_LEVEL=DEBUG on P").
 */

export interface StalledRequest {
  requestId: string
  /** Epoch ms: P's leg sent and answered (the grant lies between), D's leg sent. */
  sentMs: number
  answeredMs: number
  decodeSentMs: number
  /** D's leg settled before the observation ended (status, or a transport error text), with when. */
  decodeSettled?: {atMs: number; status?: number; error?: string; text?: string}
}

export interface DecodeState {
  /** D's /health at the end of the observation. */
  healthy: boolean
  /** D's vllm:num_requests_waiting at the end of the observation (undefined: not exported). */
  waiting?: number
  /** When it was read (epoch ms). */
  t: number
}

export interface KvPinnedInput {
  requests: StalledRequest[]
  settings: KvLeaseSettings
  /** Release lines from P's log read at the end of the observation (before the revert); undefined: unreadable. */
  logReleases?: LogRelease[]
  /** When the log was read (epoch ms): the observation's end. */
  observedUntilMs: number
  decode: DecodeState
  /** The filter's dropped-packet count at the end of the observation: did any READ meet the stall? */
  matchedPackets?: number
  /**
   * Did D's heartbeats reach P during the stall over a path the filter left open? (Traffic from D into P's side
   * channel while the READ was stalled.) vLLM's heartbeats ride NIXL notifications
   * (docs/design/nixl_kv_cache_lease.md),
   * which may share the stalled path: a release while D held the request is a defect only when they reached P.
   */
  heartbeats?: {reachedP: boolean; evidence: string}
  /** P's vllm:nixl_num_kv_expired_reqs before the requests and at the end, when exported. */
  expiredCounter?: {before: number; after: number}
  /**
   * P's lease renewals as it logs them at DEBUG (nixl/base_worker.py `_handle_heartbeat`: "Heartbeat extended lease
   * for request %s by %ds …"), for this run's requests (stalled and bystanders); undefined: P's log unreadable.
   */
  renewals?: PinnedRenewal[]
  /** P's log level as its environment states it (VLLM_LOGGING_LEVEL, /proc/<pid>/environ), when read. */
  prefillLogLevel?: {debug: boolean; evidence: string}
}

/** One renewal line of P's log, at the log's resolution, with the extension it states. */
export interface PinnedRenewal {
  t: number
  resolutionMs: number
  requestId: string
  extensionS?: number
  line: string
}

export interface KvPinnedVerdict {
  subject: string
  verdict: Outcome
  summary: string
  evidence: Record<string, unknown>
}

/** The observation's bound for one request: answered + 2 x duration + extension + step + reaper + the log's second. */
export function pinnedBoundMs(r: StalledRequest, s: KvLeaseSettings): number {
  return (
    r.answeredMs +
    (2 * s.duration!.seconds + (s.extension?.seconds ?? 0)) * 1000 +
    (s.stepMs ?? 0) +
    (s.reaperMs ?? 0) +
    1000
  )
}

/** The heartbeat interval in words (kv_lease_duration // 6 is 0 below 6 s: every scheduler step). */
const every = (s: KvLeaseSettings): string => {
  const i = s.heartbeatInterval?.seconds
  return i === undefined ? 'at an unread interval' : i === 0 ? 'every engine step' : `every ${i} s`
}

const iso = (t: number): string => new Date(t).toISOString()

const unverified = (subject: string, summary: string, why: string, toVerify: string, more = {}): KvPinnedVerdict => ({
  subject,
  verdict: 'unverified',
  summary,
  evidence: {why, toVerify, ...more},
})

export function judgeKvPinned(input: KvPinnedInput): KvPinnedVerdict[] {
  const outstanding = input.requests.filter(r => !r.decodeSettled).length
  return input.requests.map(r => judgeOne(input, r, outstanding))
}

function baseEvidence(input: KvPinnedInput, r: StalledRequest): Record<string, unknown> {
  const s = input.settings
  return {
    clock:
      `client epoch clock: P answered ${iso(r.answeredMs)}, D's leg sent ${iso(r.decodeSentMs)}; ` +
      "P's log: host local time, whole seconds",
    duration: s.duration,
    extension: s.extension,
    heartbeatInterval: s.heartbeatInterval,
    boundMs: pinnedBoundMs(r, s),
    bound:
      `answered + 2 x ${s.duration!.seconds} s + extension ${s.extension?.seconds ?? 0} s + step ${s.stepMs} ms + ` +
      `reaper ${s.reaperMs} ms + the log's 1 s`,
    decodeLeg: r.decodeSettled
      ? {settledAt: iso(r.decodeSettled.atMs), status: r.decodeSettled.status, error: r.decodeSettled.error}
      : 'unanswered at the end of the observation',
    decode: input.decode,
    ...(input.matchedPackets === undefined ? {} : {filterDropped: input.matchedPackets}),
    ...(input.expiredCounter ? {expiredCounter: input.expiredCounter} : {}),
  }
}

function judgeOne(input: KvPinnedInput, r: StalledRequest, outstanding: number): KvPinnedVerdict {
  const s = input.settings
  const id = r.requestId
  if (s.mode !== 'lease' || !s.duration)
    return unverified(
      id,
      'not a lease-era P',
      `mode ${s.mode}: without D's heartbeats a stalled READ is drop-dest-info's case`,
      'launch P with kv_lease_duration in --kv-transfer-config and judge again',
    )
  const ev = baseEvidence(input, r)
  if (r.decodeSettled?.status === 200)
    return unverified(
      id,
      'the READ was not stalled',
      "D answered 200 during the stall: it read P's blocks",
      'check that the filter covers the READ path',
      ev,
    )
  if (!input.logReleases)
    return unverified(
      id,
      "P's log unreadable",
      'no line can name a release of this request',
      "give services.prefill.logs.file and read P's WARNING lines",
      ev,
    )
  const line = input.logReleases.find(o => o.requestId === id && o.cause === 'lease-expired')
  if (line) return judgeReleased(input, r, line, ev, outstanding)
  return judgeUnreleased(input, r, ev, outstanding)
}

/** D still held the request at `t`: its leg unanswered then, and D healthy and counting every such request waiting. */
function heldAt(input: KvPinnedInput, r: StalledRequest, t: number, outstanding: number): string | undefined {
  if (r.decodeSettled && r.decodeSettled.atMs <= t) return undefined
  const d = input.decode
  if (!d.healthy || d.waiting === undefined || d.waiting < outstanding || r.decodeSettled) return undefined
  return (
    `D's leg unanswered at ${iso(t)} and still at the end (${iso(d.t)}), D healthy with ` +
    `vllm:num_requests_waiting ${d.waiting} >= ${outstanding} unanswered stalled request(s)`
  )
}

function judgeReleased(
  input: KvPinnedInput,
  r: StalledRequest,
  line: LogRelease,
  ev: Record<string, unknown>,
  outstanding: number,
): KvPinnedVerdict {
  const s = input.settings
  const id = r.requestId
  const at = {...ev, line: line.line, releasedIn: [line.t, line.t + line.resolutionMs]}
  const logged = beforeLoggedRenewal(input, r, line, at)
  if (logged) return logged
  const held = heldAt(input, r, line.t + line.resolutionMs, outstanding)
  if (held && !input.heartbeats?.reachedP)
    return unverified(
      id,
      "released while D held the request; D's heartbeats were not seen reaching P",
      "P may have freed correctly: the stall may have cut D's heartbeats too " +
        `(${input.heartbeats?.evidence ?? 'not measured'})`,
      "stall only the READ's lane, or read P's lease renewals (its debug log), and judge again",
      {...at, held},
    )
  if (held)
    return {
      subject: id,
      verdict: 'fail',
      summary: `freed while D renewed: P released the blocks by lease expiry while D still held the request`,
      evidence: {
        ...at,
        failure: 'freed-early',
        held,
        renewal: `D heartbeats ${every(s)}, each extending by ${s.extension?.seconds} s`,
        heartbeats: input.heartbeats!.evidence,
      },
    }
  const open = r.sentMs + s.duration!.seconds * 1000
  if (line.t + line.resolutionMs <= open)
    return {
      subject: id,
      verdict: 'fail',
      summary: `released early: before grant + ${s.duration!.seconds} s`,
      evidence: {...at, failure: 'early'},
    }
  const none = noRenewalApplied(input, r, line, at)
  if (none) return none
  if (!r.decodeSettled)
    return unverified(
      id,
      "released while D's hold is unknown",
      "D's leg was unanswered but D's waiting gauge did not cover it",
      "read D's /metrics (vllm:num_requests_waiting)",
      at,
    )
  const renewed = beforeLastRenewal(input, r, line, at)
  if (renewed) return renewed
  const close =
    Math.max(r.answeredMs + s.duration!.seconds * 1000, r.decodeSettled.atMs + (s.extension?.seconds ?? 0) * 1000) +
    (s.stepMs ?? 0) +
    (s.reaperMs ?? 0)
  if (line.t > close)
    return unverified(
      id,
      `released ${line.t - close} ms past its window`,
      `the window's upper edge rests on an assumed step bound (${s.stepAssumed ?? 'none'})`,
      "read P's step time and judge again",
      {...at, windowMs: [open, close]},
    )
  return {
    subject: id,
    verdict: 'pass',
    summary: 'released by lease expiry after D stopped (its READ failed)',
    evidence: {...at, windowMs: [open, close], stoppedBy: r.decodeSettled.error ?? r.decodeSettled.status},
  }
}

/**
 * D renewed the lease until it stopped holding the request (its leg answered the READ's failure): P's deadline was
 * then at least D's last renewal + extension, that renewal no earlier than settled − heartbeat interval − one step.
 * A release whose log second ends before that edge came before D's last renewal ran out; the edge rests on the
 * assumed step and interval, so unverified (as kv-wedge's assumed heartbeat edge), never pass.
 */
function beforeLastRenewal(
  input: KvPinnedInput,
  r: StalledRequest,
  line: LogRelease,
  at: Record<string, unknown>,
): KvPinnedVerdict | undefined {
  const s = input.settings
  if (!r.decodeSettled || !input.heartbeats?.reachedP || s.stepMs === undefined) return undefined
  const edge =
    r.decodeSettled.atMs - (s.heartbeatInterval?.seconds ?? 0) * 1000 - s.stepMs + (s.extension?.seconds ?? 0) * 1000
  const end = line.t + line.resolutionMs
  if (end > edge) return undefined
  return unverified(
    r.requestId,
    `released ${edge - end} ms or more before D's last renewal ran out`,
    `D heartbeated ${every(s)} until its leg answered at ${iso(r.decodeSettled.atMs)} ` +
      `(${input.heartbeats.evidence}), so P's lease ran to about then + extension ${s.extension?.seconds ?? 0} s; ` +
      `the edge (settled − interval − step ${s.stepMs} ms + extension) rests on ${s.stepAssumed ?? 'the step bound'}`,
    "set VLLM_LOGGING_LEVEL=DEBUG on P so that its renewals are logged (P's own last renewal + extension is the " +
      'edge), and judge again',
    {...at, renewalEdgeMs: edge, earlyByMs: edge - end, prefillLogLevel: input.prefillLogLevel?.evidence ?? 'not read'},
  )
}

/**
 * P's own last logged renewal of the request, at or before the release line: P's deadline was then at least that
 * renewal + its extension (`max(old, now + extension)`). Both stamps are P's log: the release is early when its whole
 * second ends before the renewal's second starts + extension (as kv-wedge's logged edge). Firm: fail.
 */
function beforeLoggedRenewal(
  input: KvPinnedInput,
  r: StalledRequest,
  line: LogRelease,
  at: Record<string, unknown>,
): KvPinnedVerdict | undefined {
  const mine = (input.renewals ?? []).filter(x => x.requestId === r.requestId && x.t <= line.t)
  if (mine.length === 0) return undefined
  const last = mine.reduce((a, b) => (b.t > a.t ? b : a))
  const extS = last.extensionS ?? input.settings.extension?.seconds ?? 0
  const edge = last.t + extS * 1000
  const end = line.t + line.resolutionMs
  if (end > edge) return undefined
  return {
    subject: r.requestId,
    verdict: 'fail',
    summary: `freed early: released ${edge - end} ms or more before P's own last renewal (+${extS} s) ran out`,
    evidence: {
      ...at,
      failure: 'freed-early',
      lastRenewal: last.line,
      renewalsLogged: mine.length,
      renewalEdgeMs: edge,
      earlyByMs: edge - end,
      renewal:
        `P logged the renewal at ${iso(last.t)} (its second) extending by ${extS} s: its deadline was then at ` +
        `least ${iso(edge)}; the release's second ends ${iso(end)}`,
    },
  }
}

/** What shows P logs its renewals (DEBUG): its environment, or its renewal lines for other requests of the run. */
function renewalsLogged(input: KvPinnedInput, id: string): string | undefined {
  if (!input.renewals) return undefined
  if (input.prefillLogLevel?.debug) return input.prefillLogLevel.evidence
  const other = input.renewals.find(x => x.requestId !== id)
  return other ? `P logged renewals of other requests of this run at DEBUG ("${other.line}")` : undefined
}

/**
 * No renewal line for the request though P logs renewals and D's heartbeats reached P while D held the request long
 * enough to heartbeat it (D tracks it from arrival, nixl/base_scheduler.py `on_new_request`, and sends at most once
 * per interval, `build_connector_meta`): P applied none of D's renewals (the no-renew defect, #53095).
 */
function noRenewalApplied(
  input: KvPinnedInput,
  r: StalledRequest,
  line: LogRelease,
  at: Record<string, unknown>,
): KvPinnedVerdict | undefined {
  const s = input.settings
  if (!input.heartbeats?.reachedP || s.heartbeatInterval === undefined || s.stepMs === undefined) return undefined
  if (input.renewals?.some(x => x.requestId === r.requestId)) return undefined
  const debug = renewalsLogged(input, r.requestId)
  if (!debug) return undefined
  // D held it from its leg's send until its leg answered (or the release): one interval, one step, the log's second.
  const heldUntil = Math.min(r.decodeSettled?.atMs ?? Number.POSITIVE_INFINITY, line.t)
  const due = r.decodeSentMs + s.heartbeatInterval.seconds * 1000 + s.stepMs + 1000
  if (due > heldUntil) return undefined
  return {
    subject: r.requestId,
    verdict: 'fail',
    summary: "not renewed: P logged no renewal of the request though D's heartbeats reached it; P freed at its lease",
    evidence: {
      ...at,
      failure: 'not-renewed',
      debug,
      noRenewal: `no "Heartbeat extended lease for request ${r.requestId}" line in P's log`,
      heartbeats: input.heartbeats.evidence,
      held:
        `D held the request from ${iso(r.decodeSentMs)} until ${iso(heldUntil)}, past one heartbeat interval ` +
        `(${every(s)}) + step ${s.stepMs} ms + 1 s`,
    },
  }
}

function judgeUnreleased(
  input: KvPinnedInput,
  r: StalledRequest,
  ev: Record<string, unknown>,
  outstanding: number,
): KvPinnedVerdict {
  const s = input.settings
  const id = r.requestId
  const bound = pinnedBoundMs(r, s)
  if (input.observedUntilMs < bound)
    return unverified(
      id,
      'observation ended before the bound',
      `read at ${iso(input.observedUntilMs)}, bound ${iso(bound)}`,
      'observe until the bound',
      ev,
    )
  if (r.decodeSettled) {
    const close = r.decodeSettled.atMs + (s.extension?.seconds ?? 0) * 1000 + (s.stepMs ?? 0) + (s.reaperMs ?? 0) + 1000
    if (input.observedUntilMs < close)
      return unverified(
        id,
        'D stopped too late to judge',
        'the lease D last renewed had not run out when the log was read',
        'observe longer',
        ev,
      )
    return {
      subject: id,
      verdict: 'fail',
      summary: "never released after D stopped: no expiry line though D's READ failed and its lease ran out",
      evidence: {...ev, failure: 'never'},
    }
  }
  const held = heldAt(input, r, input.observedUntilMs, outstanding)
  if (!held)
    return unverified(
      id,
      "no release, and D's hold of the request is unknown",
      `D healthy ${input.decode.healthy}, num_requests_waiting ${input.decode.waiting ?? 'not exported'}`,
      "read D's /health and /metrics during the stall",
      ev,
    )
  const hb = input.heartbeats?.reachedP ? 'D heartbeated' : 'D held the request'
  const pinnedS = ((input.observedUntilMs - r.answeredMs) / 1000).toFixed(1)
  const pastS = ((input.observedUntilMs - r.answeredMs) / 1000 - s.duration!.seconds).toFixed(1)
  return {
    subject: id,
    verdict: 'fail',
    summary:
      `pinned: P held the blocks ${pinnedS} s (${pastS} s past the ${s.duration!.seconds} s lease) while ${hb}; ` +
      'no READ deadline freed them',
    evidence: {
      ...ev,
      failure: 'pinned',
      pinnedMs: input.observedUntilMs - r.answeredMs,
      held,
      noRelease: `no "Releasing expired KV blocks" line for ${id} in P's log read at ${iso(input.observedUntilMs)}`,
      heartbeats:
        `${input.heartbeats?.evidence ?? 'not measured'}; D heartbeats each request waiting for remote KVs ` +
        `${every(s)} (nixl/base_scheduler.py on_new_request, build_connector_meta)`,
    },
  }
}
