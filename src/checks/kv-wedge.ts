import type {KvLeaseSettings, KvLeaseVerdict, LogRelease} from './kv-lease.js'

/**
 * The vLLM lease oracle when D stops heartbeating (wedge-rank --side decode, kill-decode; issue 31 item 3). D held
 * each request in WAITING_FOR_REMOTE_KVS (its READ stalled) and heartbeated P's lease until it was stopped; P must
 * then free the blocks by its reaper once the lease runs out. Pure: a function of what the caller observed.
 *
 * The deadline is `max(grant + duration, last renewal + extension)`: P's `_handle_heartbeat` sets
 * `max(old, now + extension)` (nixl/base_worker.py); the reaper (`get_finished`, every engine step) frees at or after
 * it. The last renewal is read from P's log when P logs renewals (DEBUG: "Heartbeat extended lease for request …"),
 * otherwise bounded from the stop: D sends at most once per heartbeat interval, every engine step while it holds the
 * request (nixl/base_scheduler.py `build_connector_meta`), and nothing once stopped, so the last one left in
 * [stop − interval − one D step, stop], and P applies it at its next step. Those two edges then rest on assumptions
 * (D heartbeated at its interval until the stop; a step is within the assumed bound), and a release past an assumed
 * edge is unverified, never fail. The grant edge is firm: P set the deadline between sent and answered.
 */

export interface WedgeRequest {
  requestId: string
  /** Epoch ms the P leg was sent and answered: the grant lies between. */
  sentMs: number
  answeredMs: number
}

/** A renewal P logged (DEBUG), at the log's resolution. */
export interface RenewalLine {
  t: number
  resolutionMs: number
  requestId: string
  line: string
}

export interface KvWedgeInput {
  requests: WedgeRequest[]
  /** P's duration and extension, D's heartbeat interval, the step bound. */
  settings: KvLeaseSettings
  /** The stop of D (SIGSTOP or SIGKILL) took effect between these epoch ms (the command's start and its verify). */
  stop: {startMs: number; endMs: number; what: string}
  logReleases?: LogRelease[]
  /** P's renewal lines; undefined when P does not log them (not at DEBUG), so the heartbeat edges are assumed. */
  renewals?: RenewalLine[]
  observedUntilMs: number
}

interface Edge {
  ms: number
  by: string
  /** Set when this edge rests on an assumption: which. */
  assumed?: string
}

export interface WedgeWindow {
  open: Edge
  close: Edge
  /** sent + duration: the firm part of the open edge (P set the deadline after the request was sent). */
  grantOpenMs: number
}

const iso = (ms: number): string => new Date(ms).toISOString()
const later = (a: Edge, b: Edge): Edge => (b.ms > a.ms ? b : a)

/** The heartbeat edges: from P's last logged renewal, or bounded from the stop. */
function heartbeatEdges(input: KvWedgeInput, r: WedgeRequest, extMs: number): {lo: Edge; hi: Edge} {
  const s = input.settings
  const last = input.renewals?.filter(x => x.requestId === r.requestId).at(-1)
  if (last)
    return {
      lo: {ms: last.t + extMs, by: `P's last logged renewal ${iso(last.t)} + extension`},
      hi: {ms: last.t + last.resolutionMs + extMs, by: `P's last logged renewal ${iso(last.t)} (+1 s) + extension`},
    }
  const intervalMs = (s.heartbeatInterval?.seconds ?? 0) * 1000
  const why = input.renewals === undefined ? 'P does not log renewals (DEBUG)' : "no renewal of it in P's log"
  return {
    lo: {
      ms: input.stop.startMs - intervalMs - s.stepMs! + extMs,
      by: 'stop − heartbeat interval − one D step + extension',
      assumed: `${why}; D heartbeated every interval (${intervalMs} ms) until the stop, a step within ${s.stepMs} ms`,
    },
    hi: {
      ms: input.stop.endMs + s.stepMs! + extMs,
      by: 'stop + one P step + extension',
      assumed: `${why}; a heartbeat in flight at the stop is applied within one P step (${s.stepMs} ms)`,
    },
  }
}

/** The window a release must fall in, each edge with what it rests on. */
export function wedgeWindow(input: KvWedgeInput, r: WedgeRequest): WedgeWindow {
  const s = input.settings
  const dMs = s.duration!.seconds * 1000
  const extMs = (s.extension?.seconds ?? 0) * 1000
  const hb = heartbeatEdges(input, r, extMs)
  const open = later({ms: r.sentMs + dMs, by: 'sent + duration'}, hb.lo)
  const deadline = later({ms: r.answeredMs + dMs, by: 'answered + duration'}, hb.hi)
  const close: Edge = {
    ms: deadline.ms + s.stepMs! + s.reaperMs!,
    by: `${deadline.by} + step + reaper`,
    assumed: [deadline.assumed, s.stepAssumed].filter(Boolean).join('; '),
  }
  if (!close.assumed) delete close.assumed
  return {open, close, grantOpenMs: r.sentMs + dMs}
}

const unverified = (subject: string, summary: string, why: string, toVerify: string, more = {}): KvLeaseVerdict => ({
  subject,
  verdict: 'unverified',
  summary,
  evidence: {why, toVerify, ...more},
})

/** Judge every request; each verdict names its window, which edge rests on what, and the evidence. */
export function judgeWedgeLeases(input: KvWedgeInput): KvLeaseVerdict[] {
  return input.requests.map(r => judgeOne(input, r))
}

function judgeOne(input: KvWedgeInput, r: WedgeRequest): KvLeaseVerdict {
  const s = input.settings
  const id = r.requestId
  if (s.mode !== 'lease' || !s.duration || !s.extension)
    return unverified(
      id,
      'lease settings unknown',
      "P's kv_lease_duration (and so its extension) was not read",
      'launch P with kv_connector_extra_config.kv_lease_duration in --kv-transfer-config',
    )
  if (s.stepMs === undefined || s.reaperMs === undefined)
    return unverified(id, 'engine step time unknown', 'the window has no upper bound without the step time', 'state it')
  const w = wedgeWindow(input, r)
  const ev = {
    windowMs: [w.open.ms, w.close.ms],
    window: `[${w.open.by}, ${w.close.by}] = [${iso(w.open.ms)}, ${iso(w.close.ms)}]`,
    edges: {open: w.open, close: w.close},
    stop: `${input.stop.what} between ${iso(input.stop.startMs)} and ${iso(input.stop.endMs)}`,
    clock: "grant and stop: this client's epoch clock; P's log: host local time, whole seconds",
    duration: s.duration,
    extension: s.extension,
    heartbeatInterval: s.heartbeatInterval,
  }
  if (!input.logReleases)
    return unverified(id, "P's log unreadable", 'no line names this release', "read P's log (its WARNING lines)", ev)
  const line = input.logReleases.find(o => o.requestId === id && o.cause !== 'unrecognized-notification')
  if (!line) {
    if (input.observedUntilMs < w.close.ms + 1000)
      return unverified(id, 'window not yet closed', 'the log was read before the window closed', 'read it later', ev)
    return {
      subject: id,
      verdict: 'fail',
      summary: "never released: no expiry line for it after its window closed, though D's heartbeats had stopped",
      evidence: {...ev, failure: 'never', logReadUntil: iso(input.observedUntilMs)},
    }
  }
  return judgeLine(id, line, w, ev)
}

function judgeLine(id: string, line: LogRelease, w: WedgeWindow, ev: Record<string, unknown>): KvLeaseVerdict {
  const at = {...ev, line: line.line, releasedIn: [line.t, line.t + line.resolutionMs], cause: line.cause}
  if (line.cause !== 'lease-expired')
    return {subject: id, verdict: 'fail', summary: `released by ${line.cause}, not the lease's reaper`, evidence: at}
  const end = line.t + line.resolutionMs
  if (end <= w.open.ms && end > w.grantOpenMs && w.open.assumed)
    return unverified(
      id,
      `released ${w.open.ms - end} ms or more before an assumed heartbeat edge`,
      `the open edge (${w.open.by}) rests on an assumption: ${w.open.assumed}; D may have stopped heartbeating earlier`,
      'run P at VLLM_LOGGING_LEVEL=DEBUG so that its renewals are logged, and judge again',
      {...at, earlyByMs: w.open.ms - end},
    )
  if (end <= w.open.ms) {
    // Before the grant edge, or before a firm (logged) heartbeat edge: early whatever D did.
    const by = w.open.assumed ? {ms: w.grantOpenMs, by: 'sent + duration'} : w.open
    return {
      subject: id,
      verdict: 'fail',
      summary: `released early: by ${iso(end)}, window opens ${iso(by.ms)} (${by.by})`,
      evidence: {...at, failure: 'early', earlyByMs: by.ms - end},
    }
  }
  if (line.t > w.close.ms && w.close.assumed)
    return unverified(
      id,
      `released ${line.t - w.close.ms} ms or more past a window closed by an assumed edge`,
      `the close edge (${w.close.by}) rests on an assumption: ${w.close.assumed}`,
      "read P's renewals (DEBUG log) and its step time, and judge again",
      {...at, lateByMs: line.t - w.close.ms},
    )
  if (line.t > w.close.ms)
    return {
      subject: id,
      verdict: 'fail',
      summary: `released late: at ${iso(line.t)} or after, window closed ${iso(w.close.ms)}`,
      evidence: {...at, failure: 'late', lateByMs: line.t - w.close.ms},
    }
  return {
    subject: id,
    verdict: 'pass',
    summary: "released by the lease's reaper in its window after D's heartbeats stopped",
    evidence: at,
  }
}
