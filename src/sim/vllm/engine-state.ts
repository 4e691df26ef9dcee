import {family} from './common.js'
import type {VllmTwinConfig} from './config.js'

/**
 * Scheduler gauges and NIXL counters, as vLLM's Prometheus logger exposes them (vllm/v1/metrics/loggers.py
 * `PrometheusStatLogger`; nixl/stats.py). Gauges are copied from the scheduler at the end of each engine step
 * (`SchedulerStats` is made once per step), so between steps /metrics shows the last step's values.
 */
export interface StepStats {
  running: number
  waitingCapacity: number
  waitingDeferred: number
  usedBlocks: number
}

export class EngineCounters {
  expired = 0
  failedTransfers = 0
  failedNotifications = 0
  promptTokens = 0
  generationTokens = 0
  success: Record<string, number> = {length: 0, stop: 0, abort: 0, error: 0}
  /** The last step's snapshot. */
  stats: StepStats = {running: 0, waitingCapacity: 0, waitingDeferred: 0, usedBlocks: 0}
}

export function renderMetrics(c: VllmTwinConfig, k: EngineCounters): string {
  const l = {engine: '0', model_name: c.model}
  const s = k.stats
  return [
    family('vllm:num_requests_running', 'gauge', 'Number of requests in model execution batches.', [[l, s.running]]),
    family('vllm:num_requests_waiting', 'gauge', 'Number of requests waiting to be processed.', [
      [l, s.waitingCapacity + s.waitingDeferred],
    ]),
    family('vllm:num_requests_waiting_by_reason', 'gauge', 'Number of requests waiting, by reason.', [
      [{...l, reason: 'capacity'}, s.waitingCapacity],
      [{...l, reason: 'deferred'}, s.waitingDeferred],
    ]),
    family('vllm:kv_cache_usage_perc', 'gauge', 'KV-cache usage. 1 means 100 percent usage.', [
      [l, Number((s.usedBlocks / c.numBlocks).toFixed(6))],
    ]),
    family('vllm:prompt_tokens', 'counter', 'Number of prefill tokens processed.', [[l, k.promptTokens]]),
    family('vllm:generation_tokens', 'counter', 'Number of generation tokens processed.', [[l, k.generationTokens]]),
    family(
      'vllm:request_success',
      'counter',
      'Count of successfully processed requests.',
      Object.entries(k.success).map(([r, v]) => [{...l, finished_reason: r}, v]),
    ),
    family('vllm:nixl_num_failed_transfers', 'counter', 'Number of failed NIXL KV Cache transfers.', [
      [l, k.failedTransfers],
    ]),
    family('vllm:nixl_num_failed_notifications', 'counter', 'Number of failed NIXL KV Cache notifications.', [
      [l, k.failedNotifications],
    ]),
    family(
      'vllm:nixl_num_kv_expired_reqs',
      'counter',
      'Number of requests that had their KV expire. NOTE: This metric is tracked on the P instance.',
      [[l, k.expired]],
    ),
  ].join('')
}

/** Blocks a request of `tokens` tokens holds. */
export const blocksFor = (c: VllmTwinConfig, tokens: number): number => Math.ceil(tokens / c.blockSize)
