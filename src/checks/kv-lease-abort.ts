import type {Outcome} from '../model/verdict.js'
import type {KvLeaseSettings, LogRelease} from './kv-lease.js'

/**
 * The vLLM lease after a client abort during D's READ (abort-mid-transfer on vLLM). Pure: a function of what the
 * caller observed.
 *
 * What vLLM does (docs/faults.md "abort-mid-transfer on vLLM" has the sources): the abort reaches D's scheduler
 * (vllm/v1/core/sched/scheduler.py `finish_requests`), which keeps D's blocks while the READ is in flight
 * (`delay_free_blocks` for WAITING_FOR_REMOTE_KVS) and calls the connector's `request_finished`; that stops the
 * request's heartbeats (nixl/base_scheduler.py `_stop_heartbeat`) and sends P nothing, since the read notification
 * rides on the READ itself (nixl/pull_worker.py `_read_blocks`: `make_prepped_xfer("READ", …, notif_msg=notif_id)`).
 * So P frees when the READ completes (its notification; P logs nothing at INFO or above for it) or, if the READ
 * never completes, when the lease runs out unrenewed: `Releasing expired KV blocks for request <id> …`.
 *
 * The window, with the READ held through it: the deadline is max(grant + duration, last renewal + extension). The
 * grant lies in [sent, answered] (P's answer); the last renewal is P's step taking D's last heartbeat, sent no later
 * than D processed the abort (`dAbortBy`: D's waiting gauge seen to drop, else abort + one step, assumed), so it
 * renews to at most dAbortBy + step + extension. The reaper frees at its next pass: + step + reaper. Below, the lease
 * cannot have run out before grant + duration, nor (D heartbeating every interval < extension) before the abort:
 *   [max(abort, sent + duration), max(answered + duration, dAbortBy + step + extension) + step + reaper].
 * Legacy (no lease, no heartbeats): [max(abort, sent + T), answered + T + step + reaper].
 */

export interface AbortEntryEvidence {
  /** deferred: D's vllm:num_requests_waiting_by_reason{reason="deferred"} rose (the READ in flight); waiting: only
   * vllm:num_requests_waiting rose (the READ, or waiting for blocks); none: nothing showed the request in D. */
  by: 'deferred' | 'waiting' | 'none'
  /** Epoch ms of the sample that showed it. */
  atMs?: number
  detail: string
}

export interface AbortedLeaseInput {
  requestId: string
  /** P's leg: sent and answered, epoch ms (the grant lies between). */
  sentMs: number
  answeredMs: number
  /** The client abort of D's leg, epoch ms. */
  abortMs: number
  entry: AbortEntryEvidence
  /** Epoch ms by which D is shown to have processed the abort (its waiting gauge fell back); undefined: not seen. */
  dAbortSeenMs?: number
  /** Whether the READ was held (the stall verified in place) until the window closed. */
  readHeld: {held: boolean; evidence: string}
  settings: KvLeaseSettings
  /** Release lines from P's log; undefined when the log could not be read. */
  logReleases?: LogRelease[]
  /** Until when (epoch ms) the log was read. */
  observedUntilMs: number
}

export interface AbortedLeaseVerdict {
  subject: string
  verdict: Outcome
  summary: string
  evidence: Record<string, unknown>
}

export interface AbortWindow {
  openMs: number
  closeMs: number
  /** D's abort processed by this time, and where that bound came from. */
  dAbortByMs: number
  dAbortBy: string
  text: string
}

/** The window P must free in (see the file's comment), or undefined without the settings it needs. */
export function abortReleaseWindow(i: AbortedLeaseInput): AbortWindow | undefined {
  const s = i.settings
  if (!s.duration || s.stepMs === undefined || s.reaperMs === undefined) return undefined
  const d = s.duration.seconds * 1000
  const slack = s.stepMs + s.reaperMs
  const seen = i.dAbortSeenMs !== undefined
  const dAbortByMs = seen ? i.dAbortSeenMs! : i.abortMs + s.stepMs
  const dAbortBy = seen
    ? `D's waiting gauge fell back at ${new Date(dAbortByMs).toISOString()}`
    : `abort + one step (${s.stepMs} ms, assumed: D's gauge was not seen to fall)`
  const openMs = Math.max(i.abortMs, i.sentMs + d)
  if (s.mode === 'legacy')
    return {
      openMs,
      closeMs: i.answeredMs + d + slack,
      dAbortByMs,
      dAbortBy,
      text: `[max(abort, sent + ${s.duration.seconds} s), answered + ${s.duration.seconds} s + ${slack} ms]`,
    }
  const ext = (s.extension?.seconds ?? 0) * 1000
  return {
    openMs,
    closeMs: Math.max(i.answeredMs + d, dAbortByMs + s.stepMs + ext) + slack,
    dAbortBy,
    dAbortByMs,
    text:
      `[max(abort, sent + ${s.duration.seconds} s), max(answered + ${s.duration.seconds} s, D's abort + step ` +
      `${s.stepMs} ms + extension ${s.extension?.seconds ?? 0} s) + step ${s.stepMs} ms + reaper ${s.reaperMs} ms]`,
  }
}

const unverified = (subject: string, summary: string, why: string, toVerify: string, ev = {}) => ({
  subject,
  verdict: 'unverified' as const,
  summary,
  evidence: {why, toVerify, ...ev},
})

const iso = (t: number) => new Date(t).toISOString()

/** Judge the aborted request's release on P; the verdict names its clocks, its window and its evidence. */
export function judgeAbortedLease(i: AbortedLeaseInput): AbortedLeaseVerdict {
  const s = i.settings
  const id = i.requestId
  if ((s.mode !== 'lease' && s.mode !== 'legacy') || !s.duration || (s.mode === 'lease' && !s.extension))
    return unverified(
      id,
      'lease settings unknown',
      'kv_lease_duration (and its extension) or VLLM_NIXL_ABORT_REQUEST_TIMEOUT was not read',
      "read P's --kv-transfer-config (kv_connector_extra_config.kv_lease_duration) or its environment",
    )
  const win = abortReleaseWindow(i)
  if (!win) return unverified(id, 'engine step time unknown', 'the window has no upper bound', 'state the step bound')
  const ev = {
    clock: {
      grant: `client epoch clock: P's leg sent ${iso(i.sentMs)}, answered ${iso(i.answeredMs)}`,
      abort: `client epoch clock: D's leg aborted ${iso(i.abortMs)}`,
      log: "P's log, host local time, whole seconds",
    },
    abortedAt: i.abortMs,
    entry: i.entry,
    dAbortBy: win.dAbortBy,
    readHeld: i.readHeld,
    windowMs: [win.openMs, win.closeMs],
    window: win.text,
    duration: s.duration,
    ...(s.extension ? {extension: s.extension} : {}),
    mode: s.mode,
  }
  if (i.entry.by === 'none')
    return unverified(
      id,
      "abort not shown inside D's READ",
      `nothing showed the request in D before the abort (${i.entry.detail}); an abort before it proves nothing`,
      'read D\'s /metrics vllm:num_requests_waiting_by_reason{reason="deferred"} while the READ is held',
      ev,
    )
  if (!i.logReleases)
    return unverified(id, "P's log unreadable", 'no line names this release', "read P's log (its WARNING lines)", ev)
  const line = i.logReleases.find(o => o.requestId === id && o.cause !== 'unrecognized-notification')
  if (!line) return judgeNoLine(i, win, ev)
  return judgeLine(i, line, win, ev)
}

function judgeNoLine(i: AbortedLeaseInput, win: AbortWindow, ev: Record<string, unknown>): AbortedLeaseVerdict {
  const id = i.requestId
  if (i.observedUntilMs < win.closeMs + 1000)
    return unverified(id, 'window not yet closed', 'the log was read before the window closed', 'read it later', ev)
  if (!i.readHeld.held)
    return unverified(
      id,
      'no expiry line, and the READ was not shown held through the window',
      `the READ may have completed and P freed on its notification, which P does not log (${i.readHeld.evidence})`,
      "hold the READ until the window closes (the stall verified in place), or read P's DEBUG log",
      ev,
    )
  if (i.entry.by !== 'deferred')
    return unverified(
      id,
      'no expiry line, and the abort may have come before the READ',
      'only vllm:num_requests_waiting showed the request: waiting for blocks, D notifies P at once at the abort ' +
        '(pull_scheduler.py request_finished) and P logs nothing for it',
      'read vllm:num_requests_waiting_by_reason{reason="deferred"} on D (a vLLM that exports it)',
      ev,
    )
  return {
    subject: id,
    verdict: 'fail',
    summary: 'never released: no expiry line for it after its window closed, the READ held throughout',
    evidence: {...ev, failure: 'never', logReadUntil: iso(i.observedUntilMs)},
  }
}

function judgeLine(
  i: AbortedLeaseInput,
  line: LogRelease,
  win: AbortWindow,
  ev: Record<string, unknown>,
): AbortedLeaseVerdict {
  const id = i.requestId
  const mode = i.settings.mode as 'lease' | 'legacy'
  const at = {...ev, line: line.line, releasedIn: [line.t, line.t + line.resolutionMs], cause: line.cause}
  const want = mode === 'lease' ? 'lease-expired' : 'legacy-timeout'
  if (line.cause !== want)
    return {subject: id, verdict: 'fail', summary: `released by ${line.cause}, not the ${mode} path`, evidence: at}
  const by = line.t + line.resolutionMs
  if (by <= i.abortMs)
    return {
      subject: id,
      verdict: 'fail',
      summary: `released before the abort (by ${iso(by)}, abort ${iso(i.abortMs)}): early, or not the abort's path`,
      evidence: {...at, failure: 'early', beforeAbort: true, earlyByMs: win.openMs - by},
    }
  if (by <= win.openMs)
    return {
      subject: id,
      verdict: 'fail',
      summary: `released early: by ${iso(by)}, before grant + duration (${iso(win.openMs)})`,
      evidence: {...at, failure: 'early', beforeAbort: false, earlyByMs: win.openMs - by},
    }
  if (line.t > win.closeMs && i.settings.stepAssumed)
    return unverified(
      id,
      `released ${line.t - win.closeMs} ms or more past a window closed by an assumed step bound`,
      `the upper edge rests on an assumption (${i.settings.stepAssumed}), not on the engine's own step time`,
      "read P's step time and judge again",
      {...at, lateByMs: line.t - win.closeMs},
    )
  if (line.t > win.closeMs)
    return {
      subject: id,
      verdict: 'fail',
      summary: `released late: at ${iso(line.t)} or after, window closed ${iso(win.closeMs)}`,
      evidence: {...at, failure: 'late', lateByMs: line.t - win.closeMs},
    }
  return {
    subject: id,
    verdict: 'pass',
    summary: `released by the ${mode} expiry path in its window after the abort`,
    evidence: at,
  }
}
