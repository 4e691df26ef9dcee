import {abandonedOf, answerOf, type Observation, type Timeline} from '../../model/timeline.js'
import {
  ABORTED_REQUESTS_TOTAL,
  BOOTSTRAP_FAILED_TOTAL,
  DECODE_PREALLOC_QUEUE,
  DECODE_TRANSFER_QUEUE,
  LOADS_DECODE_PREALLOC_QUEUE,
  LOADS_DECODE_TRANSFER_QUEUE,
  LOADS_PREFILL_BOOTSTRAP_QUEUE,
  LOADS_PREFILL_INFLIGHT_QUEUE,
  LOADS_RUNNING_REQS,
  LOADS_USED_TOKENS,
  LOADS_WAITING_REQS,
  PREFILL_BOOTSTRAP_QUEUE,
  PREFILL_INFLIGHT_QUEUE,
  QUEUE_REQS,
  RUNNING_REQS,
  TOKEN_USAGE,
  TRANSFER_FAILED_TOTAL,
  WATCHDOG_EVICTED_TOTAL,
} from './sglang-metrics.js'

/**
 * When each reading pdchaos judges from is fresh: one row per source, the rule in code that docs/freshness.md states in
 * words (with SGLang's file and line). A check reads a source only when its row says the reading is fresh at that
 * moment; a leak or a drain that only a possibly stale reading shows is unverified, never a failure.
 */

export type Refresh =
  /** Moves at the event itself (a Prometheus counter incremented where the request fails). */
  | 'live'
  /** Written when a batch runs (report_prefill_stats / report_decode_stats) and by the idle refresh: stale between. */
  | 'per-batch'
  /** The /v1/loads snapshot: published with each batch result and on every idle iteration, so fresh once idle. */
  | 'idle-snapshot'

export interface FreshnessRow {
  names: readonly string[]
  endpoint: '/metrics' | '/v1/loads?include=disagg'
  refresh: Refresh
  /** The rule, as evidence names it. */
  rule: string
  /** Where SGLang writes it (file and function), for the evidence and the docs table. */
  upstream: string
}

/**
 * SGLang's idle refresh: a fully idle scheduler rewrites the per-batch gauges when this long has passed since their
 * last write (managers/scheduler.py on_idle; it returns early while a queue holds a request).
 */
export const IDLE_REFRESH_S = 30

const PER_BATCH_UPSTREAM =
  'report_prefill_stats (called by disaggregation/prefill.py process_batch_result_disagg_prefill) and ' +
  'report_decode_stats (managers/scheduler_metrics_mixin.py; scheduler_components/metrics_reporter.py in later ' +
  'releases); idle ' +
  'refresh in managers/scheduler.py on_idle'

export const FRESHNESS_ROWS: readonly FreshnessRow[] = [
  {
    names: [BOOTSTRAP_FAILED_TOTAL, TRANSFER_FAILED_TOTAL, ABORTED_REQUESTS_TOTAL, WATCHDOG_EVICTED_TOTAL],
    endpoint: '/metrics',
    refresh: 'live',
    rule: 'a counter moves where the request fails: fresh at any moment',
    upstream: 'observability/metrics_collector.py (counters), incremented in disaggregation/prefill.py and decode.py',
  },
  {
    names: [
      PREFILL_BOOTSTRAP_QUEUE,
      PREFILL_INFLIGHT_QUEUE,
      DECODE_PREALLOC_QUEUE,
      DECODE_TRANSFER_QUEUE,
      RUNNING_REQS,
      QUEUE_REQS,
      TOKEN_USAGE,
    ],
    endpoint: '/metrics',
    refresh: 'per-batch',
    rule:
      'written with each prefill batch result, every decode_log_interval (40) decode batches, and every 30 s by ' +
      'the idle ' +
      'refresh only while the scheduler is fully idle: a reading counts whatever was in flight at the last write',
    upstream: PER_BATCH_UPSTREAM,
  },
  {
    names: [
      LOADS_PREFILL_BOOTSTRAP_QUEUE,
      LOADS_PREFILL_INFLIGHT_QUEUE,
      LOADS_DECODE_PREALLOC_QUEUE,
      LOADS_DECODE_TRANSFER_QUEUE,
      LOADS_USED_TOKENS,
      LOADS_RUNNING_REQS,
      LOADS_WAITING_REQS,
    ],
    endpoint: '/v1/loads?include=disagg',
    refresh: 'idle-snapshot',
    rule:
      'published with each batch result and on every idle iteration: fresh once the server is idle (nothing of ' +
      'pdchaos in ' +
      'flight, and the snapshot itself shows nothing running, waiting or queued)',
    upstream:
      'managers/scheduler.py publish_load_snapshot (process_batch_result; on_idle with force=True), served by ' +
      'entrypoints/v1_loads.py',
  },
]

/** A name's row; a name no row lists is treated as per-batch (the cautious reading). */
export function freshnessOf(name: string): FreshnessRow {
  return FRESHNESS_ROWS.find(r => r.names.includes(name)) ?? FRESHNESS_ROWS[1]!
}

type Metric = Extract<Observation, {kind: 'metric'}>

/** The samples of one series (of one instance's server where given), in time order. */
export function readingsOf(tl: Timeline, service: string, name: string, instance?: string): Metric[] {
  return tl.observations.filter(
    (o): o is Metric =>
      o.kind === 'metric' &&
      o.service === service &&
      o.name === name &&
      (instance === undefined || o.instance === instance),
  )
}

/** Each of pdchaos's requests: when it was sent and when it ended (answered or let go; undefined: never). */
function requestSpans(tl: Timeline): Array<{sent: number; ended?: number}> {
  const ended = new Map<string, number>()
  for (const o of tl.observations) {
    if ((o.kind === 'request-answered' || o.kind === 'request-abandoned') && !ended.has(o.rid)) ended.set(o.rid, o.t)
  }
  return tl.observations
    .filter(o => o.kind === 'request-sent')
    .map(o => ({sent: o.t, ended: ended.get((o as {rid: string}).rid)}))
}

/**
 * How many of pdchaos's own requests were in flight at t: sent at or before it, neither answered nor let go by then.
 */
export function inFlightAt(tl: Timeline, t: number, spans = requestSpans(tl)): number {
  return spans.filter(r => r.sent <= t && (r.ended === undefined || r.ended > t)).length
}

/**
 * When every request sent before `t` had ended (answered or let go); the end of observation when one never did. Reads
 * after this moment can show what the fault left behind, and nothing it still held.
 */
export function settledAfter(tl: Timeline, t: number, end: number): number {
  let at = t
  for (const o of tl.observations) {
    if (o.kind !== 'request-sent' || o.t > t) continue
    at = Math.max(at, answerOf(tl, o.rid)?.t ?? abandonedOf(tl, o.rid)?.t ?? end)
  }
  return at
}

const IDLE_LOADS = [
  LOADS_RUNNING_REQS,
  LOADS_WAITING_REQS,
  LOADS_PREFILL_BOOTSTRAP_QUEUE,
  LOADS_PREFILL_INFLIGHT_QUEUE,
  LOADS_DECODE_PREALLOC_QUEUE,
  LOADS_DECODE_TRANSFER_QUEUE,
]

/**
 * The /v1/loads readings of a series taken while the server was idle: pdchaos had nothing in flight, and the same
 * snapshot shows nothing running, waiting or in a PD queue. SGLang republishes the snapshot on every idle iteration,
 * so such a reading is the server's state at that moment, not at its last batch.
 */
export function idleSnapshotReadings(tl: Timeline, service: string, name: string, instance?: string): Metric[] {
  if (freshnessOf(name).refresh !== 'idle-snapshot') return []
  const spans = requestSpans(tl)
  return readingsOf(tl, service, name, instance).filter(r => {
    if (inFlightAt(tl, r.t, spans) > 0) return false
    const same = tl.observations.filter(
      (o): o is Metric =>
        o.kind === 'metric' &&
        o.t === r.t &&
        o.service === service &&
        o.instance === r.instance &&
        IDLE_LOADS.includes(o.name),
    )
    return same.length > 0 && same.every(o => o.value === 0)
  })
}

/**
 * The first moment from which a per-batch reading of this series is shown to have been written after `since`:
 * on prefill, the first success of a request sent after it (every prefill batch writes the gauges, and that request ran
 * one); on decode (written only every decode_log_interval batches), the first reading of any series written with it
 * (SGLang writes them all in one report) whose value differs from its value at `since`: only a write changes it.
 * Undefined: no write after `since` is shown.
 */
export function writtenSince(
  tl: Timeline,
  service: string,
  name: string,
  since: number,
  instance?: string,
): {at: number; by: string} | undefined {
  if (service === 'prefill') {
    let first: {at: number; by: string} | undefined
    for (const o of tl.observations) {
      if (o.kind !== 'request-sent' || o.t < since) continue
      const a = answerOf(tl, o.rid)
      if (a && a.status >= 200 && a.status <= 299 && (first === undefined || a.t < first.at))
        first = {at: a.t, by: `request ${o.rid} sent after it succeeded`}
    }
    return first
  }
  const row = freshnessOf(name)
  const together = FRESHNESS_ROWS.filter(r => r.endpoint === row.endpoint && r.refresh !== 'live').flatMap(r => r.names)
  let first: {at: number; by: string} | undefined
  for (const n of together) {
    const rs = readingsOf(tl, service, n, instance)
    const before = rs.filter(r => r.t <= since).at(-1)
    const changed = rs.find(r => r.t > since && (before === undefined || r.value !== before.value))
    if (changed && (first === undefined || changed.t < first.at))
      first = {at: changed.t, by: `${n} changed from ${before?.value ?? 'none'} to ${changed.value}`}
  }
  return first
}
