/**
 * SGLang's metric names, spelled once. Two sources on a PD server:
 * - GET /metrics (Prometheus), defined in SGLang's python/sglang/srt/observability/metrics_collector.py: counters move
 * at
 * once; the queue gauges are written per batch or every 30 s when idle, so they can be stale while a request is
 * stuck.
 * - GET /v1/loads?include=disagg&format=prometheus, from python/sglang/srt/entrypoints/v1_loads.py: a snapshot
 * published
 *   on each batch result and when fully idle; fresher than the gauges (absent in older releases).
 * When each is fresh, and what a check may conclude from it: freshness.ts (docs/freshness.md).
 * The twin (src/sim) spells them on its own: it is a separate world and imports nothing from here.
 */

// Counters of /metrics (metrics_collector.py).
/** Prefill bootstrap failures, timeouts and bootstrap-queue aborts, plus decode handshake failures. */
export const BOOTSTRAP_FAILED_TOTAL = 'sglang:num_bootstrap_failed_reqs_total'
/** Prefill inflight transfers that ended Failed (aborts included), plus decode transfer failures. */
export const TRANSFER_FAILED_TOTAL = 'sglang:num_transfer_failed_reqs_total'
/** Requests aborted through the tokenizer's abort_request. */
export const ABORTED_REQUESTS_TOTAL = 'sglang:num_aborted_requests_total'
/** Requests the pin watchdog evicted. Not in SGLang: pdchaos's proposal, which the twin implements. */
export const WATCHDOG_EVICTED_TOTAL = 'sglang:num_watchdog_evicted_reqs_total'

// Gauges of /metrics (metrics_collector.py); the four PD queues can lag by up to about 30 s.
export const PREFILL_BOOTSTRAP_QUEUE = 'sglang:num_prefill_bootstrap_queue_reqs'
export const PREFILL_INFLIGHT_QUEUE = 'sglang:num_prefill_inflight_queue_reqs'
export const DECODE_PREALLOC_QUEUE = 'sglang:num_decode_prealloc_queue_reqs'
export const DECODE_TRANSFER_QUEUE = 'sglang:num_decode_transfer_queue_reqs'
export const RUNNING_REQS = 'sglang:num_running_reqs'
export const QUEUE_REQS = 'sglang:num_queue_reqs'
/** The fraction of the KV pool in use. */
export const TOKEN_USAGE = 'sglang:token_usage'

// The /v1/loads?include=disagg snapshot in its Prometheus form (v1_loads.py).
export const LOADS_PREFILL_BOOTSTRAP_QUEUE = 'sglang_disagg_prefill_bootstrap_queue_reqs'
export const LOADS_PREFILL_INFLIGHT_QUEUE = 'sglang_disagg_prefill_inflight_queue_reqs'
export const LOADS_DECODE_PREALLOC_QUEUE = 'sglang_disagg_decode_prealloc_queue_reqs'
export const LOADS_DECODE_TRANSFER_QUEUE = 'sglang_disagg_decode_transfer_queue_reqs'
/** KV tokens in use (a count, not a fraction as TOKEN_USAGE is). */
export const LOADS_USED_TOKENS = 'sglang_num_used_tokens'
export const LOADS_RUNNING_REQS = 'sglang_num_running_reqs'
export const LOADS_WAITING_REQS = 'sglang_num_waiting_reqs'

/** sgl-model-gateway: a worker's circuit breaker, 0 closed, 1 open, 2 half-open (observability/metrics.rs). */
export const ROUTER_CB_STATE = 'smg_worker_cb_state'

/** The counters of a failed or aborted PD request, as discovery and the sampler read them. */
export const PD_COUNTERS = [
  BOOTSTRAP_FAILED_TOTAL,
  TRANSFER_FAILED_TOTAL,
  ABORTED_REQUESTS_TOTAL,
  WATCHDOG_EVICTED_TOTAL,
] as const

/** Each PD queue: the server that holds it, its /v1/loads name (fresh once idle) and its /metrics gauge (stale). */
export const PD_QUEUES = [
  {service: 'prefill', loads: LOADS_PREFILL_BOOTSTRAP_QUEUE, gauge: PREFILL_BOOTSTRAP_QUEUE},
  {service: 'prefill', loads: LOADS_PREFILL_INFLIGHT_QUEUE, gauge: PREFILL_INFLIGHT_QUEUE},
  {service: 'decode', loads: LOADS_DECODE_PREALLOC_QUEUE, gauge: DECODE_PREALLOC_QUEUE},
  {service: 'decode', loads: LOADS_DECODE_TRANSFER_QUEUE, gauge: DECODE_TRANSFER_QUEUE},
] as const satisfies ReadonlyArray<{service: 'prefill' | 'decode'; loads: string; gauge: string}>

/** The four PD queue gauges of /metrics, prefill's first. */
export const PD_QUEUE_GAUGES = PD_QUEUES.map(q => q.gauge)
/** The four PD queues of /v1/loads, prefill's first. */
export const PD_QUEUE_LOADS = PD_QUEUES.map(q => q.loads)
