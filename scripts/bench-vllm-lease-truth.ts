/**
 * The vLLM twin's own verdict on one request's lease, from its truth logs (DIR/truth/prefill.jsonl), and pdchaos's
 * release time from a verdict's evidence: pure, for scripts/bench-vllm-experiments.ts (a benchmark, not a test).
 *
 * The deadline a correct P holds the blocks to (nixl/base_worker.py: `request_finished` sets now + kv_lease_duration,
 * `_handle_heartbeat` sets max(old, now + extension), the reaper frees at its first step at or after it):
 *   deadline = max(granted.t + duration, every `heartbeat`'s detail.toMs, every `heartbeat-dropped`'s t + extension).
 * The grant edge uses the nominal duration, not `granted.detail.expiryMs` (which `expire-early` halves: the bug); a
 * `heartbeat-dropped` (the `no-renew` bug) is a renewal a correct P would have applied. Truth verdict:
 *   pass iff `freed` with cause lease-expired and deadline − tol <= freed.t <= deadline + step + overhead + tol;
 *   otherwise fail: "never" (no `freed` before the log was read), "early", "late", or "other-path" (freed by a
 *   notification: cause read-notified / abort-notified).
 * For stall-kv on a default twin the finding is "pinned": `pinnedTruth` — P received D's renewals and logged no
 * `freed` for the request before the filter was lifted (the lease's revertedAt).
 */

export interface TruthEvent {
  t: number
  rid: string
  event: string
  detail?: {cause?: string; expiryMs?: number; toMs?: number; fromMs?: number}
}

export interface LeaseTruthOptions {
  durationMs: number
  extensionMs: number
  /** The twin's step as run: its timer + the round trip to its workers. */
  stepMs: number
  tolMs: number
}

export interface LeaseTruth {
  verdict: 'pass' | 'fail'
  /** Why (fail), or the edge the deadline came from. */
  why: string
  deadlineMs?: number
  /** Which edge set the deadline: grant, a renewal P applied, or a renewal P dropped. */
  deadlineBy?: 'grant' | 'heartbeat' | 'heartbeat-dropped'
  freedMs?: number
  freedCause?: string
  /** freed − deadline (ms). */
  lateMs?: number
  renewals: number
}

/** The twin's verdict on `rid`'s release by the lease path (see the file's comment). */
export function leaseTruth(events: readonly TruthEvent[], rid: string, o: LeaseTruthOptions): LeaseTruth {
  const mine = events.filter(e => e.rid === rid)
  const granted = mine.find(e => e.event === 'granted')
  const renewals = mine.filter(e => e.event === 'heartbeat' || e.event === 'heartbeat-dropped').length
  if (!granted) return {verdict: 'fail', why: 'no grant in the truth log', renewals}
  let deadlineMs = granted.t + o.durationMs
  let deadlineBy: LeaseTruth['deadlineBy'] = 'grant'
  for (const e of mine) {
    const to =
      e.event === 'heartbeat' ? e.detail?.toMs : e.event === 'heartbeat-dropped' ? e.t + o.extensionMs : undefined
    if (to !== undefined && to > deadlineMs) {
      deadlineMs = to
      deadlineBy = e.event as 'heartbeat' | 'heartbeat-dropped'
    }
  }
  const freed = mine.find(e => e.event === 'freed')
  const base = {deadlineMs, deadlineBy, renewals}
  if (!freed) return {...base, verdict: 'fail', why: 'never'}
  const at = {...base, freedMs: freed.t, freedCause: freed.detail?.cause, lateMs: freed.t - deadlineMs}
  if (freed.detail?.cause !== 'lease-expired') return {...at, verdict: 'fail', why: 'other-path'}
  if (freed.t < deadlineMs - o.tolMs) return {...at, verdict: 'fail', why: 'early'}
  if (freed.t > deadlineMs + o.stepMs + o.tolMs) return {...at, verdict: 'fail', why: 'late'}
  return {...at, verdict: 'pass', why: `freed at the deadline (${deadlineBy})`}
}

export interface PinnedTruth {
  /** pinned: renewed and not freed before the revert; else released (freed before it) or unrenewed. */
  pinned: boolean
  why: string
  renewals: number
  freedMs?: number
  freedCause?: string
}

/** The twin's "pinned" finding for a stalled request: renewals reached P and nothing freed it before the revert. */
export function pinnedTruth(events: readonly TruthEvent[], rid: string, revertedAtMs: number): PinnedTruth {
  const mine = events.filter(e => e.rid === rid)
  const renewals = mine.filter(e => e.event === 'heartbeat' && e.t < revertedAtMs).length
  const freed = mine.find(e => e.event === 'freed')
  const at = freed ? {freedMs: freed.t, freedCause: freed.detail?.cause} : {}
  if (freed && freed.t < revertedAtMs)
    return {pinned: false, why: `freed (${freed.detail?.cause}) before the revert`, renewals, ...at}
  if (renewals === 0) return {pinned: false, why: 'no renewal reached P before the revert', renewals, ...at}
  return {pinned: true, why: `${renewals} renewals applied, no freed before the revert`, renewals, ...at}
}

/** pdchaos's point estimate of the release time: the middle of its finest interval (sampled, else the log's second). */
export function releaseEstimate(evidence: {
  releasedIn?: [number, number]
  releasedInSampled?: [number, number]
}): {ms: number; from: 'sampled' | 'log-second'; interval: [number, number]} | undefined {
  const iv = evidence.releasedInSampled ?? evidence.releasedIn
  if (!iv) return undefined
  return {ms: (iv[0] + iv[1]) / 2, from: evidence.releasedInSampled ? 'sampled' : 'log-second', interval: iv}
}
