import type {AbortCoverage, ReleasedFrom} from '../model/run.js'
import type {Observation, Timeline} from '../model/timeline.js'

/**
 * Did an abort trial land inside the transfer window? Only a trial that demonstrably did says anything about how
 * aborts of Transferring requests are handled: one that met the request in another queue, after its answer, or
 * while nothing held the transfer open, proves nothing either way. Pure: everything comes from the timeline (the
 * window the runner recorded before the trials, the widening filter's match count read before the revert, and each
 * request's own answer).
 */

export type TransferWindowObs = Extract<Observation, {kind: 'transfer-window'}>

/** Below this share of the trials landing in the window (and at least one), no abort passes. */
export const MIN_IN_WINDOW_SHARE = 0.5

export const requiredInWindow = (trials: number): number => Math.max(1, Math.ceil(trials * MIN_IN_WINDOW_SHARE))

/** The window recorded for the trial with this rid (each scenario records its own, naming its trials). */
export function windowFor(tl: Timeline, rid: string): TransferWindowObs | undefined {
  return tl.observations.find(
    (o): o is TransferWindowObs => o.kind === 'transfer-window' && o.trials.some(x => x.rid === rid),
  )
}

/**
 * Packets the lease's packet filter matched while in place (the last reading before the revert); undefined if unread.
 */
export function matchedPackets(tl: Timeline, leaseId: string): number | undefined {
  let n: number | undefined
  for (const o of tl.observations) if (o.kind === 'filter-matched' && o.leaseId === leaseId) n = o.packets
  return n
}

/**
 * Where the request's error text says it was released from: the watchdog names the queue; SGLang's prefill answers
 * "Prefill bootstrap failed …" from the bootstrap queue and "Prefill transfer failed …" (or "KV transfer failed")
 * from the inflight queue (disaggregation/prefill.py), "Abort before prefill" from the waiting queue.
 */
export function releasedFromOf(detail: string | undefined): ReleasedFrom {
  if (!detail) return 'unknown'
  const m = /in the (bootstrap|waiting|inflight) queue/i.exec(detail)
  if (m) return m[1]!.toLowerCase() as ReleasedFrom
  if (/bootstrap failed/i.test(detail)) return 'bootstrap'
  if (/Abort before prefill/i.test(detail)) return 'waiting'
  if (/Prefill transfer failed|KV transfer failed/i.test(detail)) return 'inflight'
  return 'unknown'
}

/** The latest offset (ms after send) at which a request is still inside the window. */
export function windowHighMs(w: TransferWindowObs, tl: Timeline): number {
  // Widened, the transfer is held until the watchdog's deadline at the earliest; unwidened, the window is the sweep's
  // own, give or take the spread of the prefill time it was planned from.
  return w.widening === 'none'
    ? w.endMs + tl.calibration.prefillSpreadMs
    : Math.max(w.endMs, tl.contract.deadlineSeconds * 1000)
}

export interface TrialFacts {
  offsetMs: number
  answeredAt?: number
  abortAt: number
  status?: number
  releasedFrom: ReleasedFrom
}

/** Node's timers keep whole milliseconds: an abort planned at the window's edge may fire a fraction of one early. */
const TIMER_SLACK_MS = 1

/** Why a trial's abort did not demonstrably land in the window (undefined: it did). */
export function notInWindow(
  tl: Timeline,
  w: TransferWindowObs | undefined,
  packets: number | undefined,
  t: TrialFacts,
): string | undefined {
  if (!w) return 'the run recorded no transfer window for this trial'
  if (w.widening === 'packet-filter' && packets === undefined)
    return "the widening filter's match count was not read before the revert: nothing shows it held a transfer"
  if (w.widening === 'packet-filter' && packets === 0)
    return 'the widening filter matched 0 packets (it held no KV transfer)'
  const o = t.offsetMs.toFixed(1)
  if (t.offsetMs < w.startMs - TIMER_SLACK_MS)
    return `fired ${o} ms after the send, before the window opens (${w.startMs} ms)`
  const high = windowHighMs(w, tl)
  if (t.offsetMs > high + TIMER_SLACK_MS)
    return `fired ${o} ms after the send, after the window closes (${high.toFixed(1)} ms)`
  if (t.answeredAt !== undefined && t.answeredAt <= t.abortAt)
    return 'the request was answered before its abort was fired'
  if (t.status !== undefined && t.status >= 200 && t.status < 300)
    return 'the request completed (2xx): nothing shows the abort met it in Transferring'
  if (t.releasedFrom === 'bootstrap' || t.releasedFrom === 'waiting')
    return `its answer says it was released from the ${t.releasedFrom} queue, not from Transferring`
  return undefined
}

/** Coverage of the scenario's trials: the window, the filter's count, the offsets, and whether enough landed. */
export function coverageOf(
  _tl: Timeline,
  w: TransferWindowObs | undefined,
  packets: number | undefined,
  trials: Array<{rid: string; offsetMs: number; notInWindow?: string}>,
): AbortCoverage {
  const inWindow = trials.filter(t => t.notInWindow === undefined).length
  const required = requiredInWindow(trials.length)
  const verified = inWindow >= required
  const planned = w
    ? trials.map(t => w.trials.find(x => x.rid === t.rid)?.offsetMs).filter((x): x is number => x !== undefined)
    : []
  const fired = trials.map(t => Math.round(t.offsetMs * 10) / 10)
  const held = !w
    ? ''
    : w.widening === 'packet-filter'
      ? `, filter matched ${packets === undefined ? 'an unread number of' : packets} packets`
      : w.widening === 'twin-failpoint'
        ? ", window held by the twin's failure point"
        : ', window not widened (landing judged by timing and answers only)'
  const span = fired.length > 0 ? `; aborts fired ${Math.min(...fired)}..${Math.max(...fired)} ms after send` : ''
  const summary =
    `aborts in window: ${inWindow}/${trials.length}${held}${span}` +
    `${w ? ` (window ${w.startMs}..${w.endMs} ms, ${w.why})` : ''}`
  const cov: AbortCoverage = {
    trials: trials.length,
    inWindow,
    required,
    window: w ? {startMs: w.startMs, endMs: w.endMs, why: w.why, widening: w.widening} : null,
    filterMatchedPackets: w?.widening === 'packet-filter' ? (packets ?? null) : null,
    offsets: {plannedMs: planned, firedMs: fired},
    verified,
    summary,
  }
  if (verified) return cov
  return {...cov, ...unverifiedWhy(w, packets, trials, inWindow, required)}
}

function unverifiedWhy(
  w: TransferWindowObs | undefined,
  packets: number | undefined,
  trials: Array<{notInWindow?: string}>,
  inWindow: number,
  required: number,
): {why: string; toVerify: string} {
  if (!w)
    return {
      why: 'the run recorded no transfer window',
      toVerify: "run abort-mid-transfer through pdchaos's runner (its plan records the window)",
    }
  if (w.widening === 'packet-filter' && packets === 0) {
    return {
      why:
        `the widening filter matched 0 packets while in place: no KV transfer was held, so none of ` +
        `the ${trials.length} aborts demonstrably met a Transferring request`,
      toVerify:
        "make the widening hold the KV data path: check with `ss -tnp` during a request that the rank's transfers " +
        'use the connections pdchaos filtered (name the rank with --gpu), or run on a TCP data path',
    }
  }
  if (w.widening === 'packet-filter' && packets === undefined) {
    return {
      why: "the widening filter's match count was not read before the revert",
      toVerify:
        'let pdchaos list its own rules with their counters (nft -j list table, iptables-save -c) under root or ' +
        'passwordless sudo',
    }
  }
  const reasons = new Map<string, number>()
  for (const t of trials) {
    // Offsets differ per trial: group the reasons by their words.
    const r = t.notInWindow?.replace(/[\d.]+ ms/g, 'N ms')
    if (r) reasons.set(r, (reasons.get(r) ?? 0) + 1)
  }
  const top = [...reasons]
    .sort((a, b) => b[1] - a[1])
    .slice(0, 2)
    .map(([r, n]) => `${n}× ${r}`)
    .join('; ')
  return {
    why:
      `only ${inWindow} of ${trials.length} aborts landed in the transfer window (at least ${required} ` +
      `needed): ${top}`,
    toVerify:
      w.widening === 'none'
        ? 'widen the window (a TCP data path, --gpu N) or run more trials (--trials) on an idle host, so that ' +
          'aborts meet requests in Transferring'
        : 'run more trials (--trials) on a less loaded host, so that the aborts fire inside the held window',
  }
}
