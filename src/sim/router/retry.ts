/**
 * sgl-model-gateway's retry policy (docs/twin.md, "Router"): which statuses are retried, how long to wait between
 * attempts, and what --disable-retries does. Upstream: sgl-model-gateway/src/core/retry.rs (is_retryable_status,
 * BackoffCalculator::calculate_delay, RetryExecutor::execute_response_with_retry) and src/config/types.rs
 * (RetryConfig::default, RouterConfig::effective_retry_config).
 */

export interface RetrySettings {
  /** --retry-max-retries: the number of ATTEMPTS in all (upstream loops while attempt + 1 < max(max_retries, 1)). */
  maxRetries: number
  /** --retry-initial-backoff-ms */
  initialBackoffMs: number
  /** --retry-max-backoff-ms */
  maxBackoffMs: number
  /** --retry-backoff-multiplier */
  backoffMultiplier: number
  /** --retry-jitter-factor (clamped to 0..1 when used, as upstream does) */
  jitterFactor: number
  /** --disable-retries: one attempt (effective_retry_config sets max_retries = 1). */
  disabled: boolean
}

/** RetryConfig::default() and the launcher's defaults. */
export const RETRY_DEFAULTS: RetrySettings = {
  maxRetries: 5,
  initialBackoffMs: 50,
  maxBackoffMs: 30_000,
  backoffMultiplier: 1.5,
  jitterFactor: 0.2,
  disabled: false,
}

/** 408, 429, 500, 502, 503, 504 (retry.rs is_retryable_status). A transport error reaches it as the 502 it becomes. */
export function isRetryableStatus(status: number): boolean {
  return status === 408 || status === 429 || status === 500 || status === 502 || status === 503 || status === 504
}

/** How many attempts a request gets: max(max_retries, 1), or 1 with --disable-retries. */
export function attemptsAllowed(s: RetrySettings): number {
  return s.disabled ? 1 : Math.max(Math.floor(s.maxRetries), 1)
}

/**
 * The wait after the failed attempt `attempt` (0-based), as calculate_delay computes it: initial × multiplier^attempt
 * in
 * f32, truncated to whole ms and capped at the maximum; then a jitter scale drawn uniformly from [-j, j], the jitter
 * rounded to whole ms and added, never below 0. `random` returns [0, 1) (Math.random by default).
 */
export function backoffDelayMs(s: RetrySettings, attempt: number, random: () => number = Math.random): number {
  const f = Math.fround
  const pow = f(f(s.backoffMultiplier) ** attempt)
  const delay = Math.min(Math.trunc(f(f(s.initialBackoffMs) * pow)), s.maxBackoffMs)
  const jitter = Math.min(Math.max(s.jitterFactor, 0), 1)
  if (jitter <= 0) return delay
  const scale = -jitter + 2 * jitter * random()
  // f32::round rounds half away from zero (Math.round would round -2.5 to -2).
  const product = f(delay * scale)
  const jitterMs = Math.max(Math.sign(product) * Math.round(Math.abs(product)), -delay)
  return Math.max(delay + Math.trunc(jitterMs), 0)
}
