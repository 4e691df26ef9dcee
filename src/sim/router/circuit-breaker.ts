/**
 * sgl-model-gateway's per-worker circuit breaker (sgl-model-gateway/src/core/circuit_breaker.rs; docs/twin.md,
 * "Router"). Closed → Open after failure_threshold CONSECUTIVE failures (any success resets the count; the configured
 * window, --cb-window-duration-secs, is carried but never consulted upstream); Open → HalfOpen lazily, the first time
 * the state is read once timeout_duration has passed since it opened; in HalfOpen every request is let through, any
 * failure reopens it and success_threshold consecutive successes close it. --disable-circuit-breaker sets the failure
 * threshold to u32::MAX (RouterConfig::effective_circuit_breaker_config), so it never opens.
 */

export type CircuitState = 'closed' | 'open' | 'half_open'

/** smg_worker_cb_state's encoding (CircuitState::to_int). */
export const CB_STATE_CODE: Record<CircuitState, number> = {closed: 0, open: 1, half_open: 2}

export interface CircuitBreakerSettings {
  /** --cb-failure-threshold */
  failureThreshold: number
  /** --cb-success-threshold */
  successThreshold: number
  /** --cb-timeout-duration-secs: how long it stays open before the next look turns it half-open. */
  timeoutDurationS: number
  /** --cb-window-duration-secs: accepted and shown, unused by the counting (as upstream). */
  windowDurationS: number
  /** --disable-circuit-breaker */
  disabled: boolean
}

/** config/types.rs CircuitBreakerConfig::default() and the launcher's defaults. */
export const CB_DEFAULTS: CircuitBreakerSettings = {
  failureThreshold: 10,
  successThreshold: 3,
  timeoutDurationS: 60,
  windowDurationS: 120,
  disabled: false,
}

/** u32::MAX, the threshold --disable-circuit-breaker puts in place. */
const U32_MAX = 4_294_967_295

export interface BreakerEvents {
  transition?: (from: CircuitState, to: CircuitState) => void
  /** After every recorded outcome and transition: the counters the gauges publish. */
  counts?: (consecutiveFailures: number, consecutiveSuccesses: number) => void
}

export class CircuitBreaker {
  private current: CircuitState = 'closed'
  private failures = 0
  private successes = 0
  private changedAt: number
  private readonly failureThreshold: number

  constructor(
    private readonly settings: CircuitBreakerSettings,
    private readonly events: BreakerEvents = {},
    private readonly clock: () => number = () => performance.now(),
  ) {
    this.failureThreshold = settings.disabled ? U32_MAX : settings.failureThreshold
    this.changedAt = clock()
  }

  /** The state; an open breaker whose timeout has passed turns half-open here (check_and_update_state_returning). */
  state(): CircuitState {
    if (this.current === 'open' && this.clock() - this.changedAt >= this.settings.timeoutDurationS * 1000) {
      this.current = 'half_open'
      this.changedAt = this.clock()
      this.failures = 0
      this.successes = 0
      this.events.transition?.('open', 'half_open')
      this.publish()
    }
    return this.current
  }

  /** can_execute: closed and half-open let requests through, open does not. */
  canExecute(): boolean {
    return this.state() !== 'open'
  }

  get consecutiveFailures(): number {
    return this.failures
  }

  get consecutiveSuccesses(): number {
    return this.successes
  }

  /** record_outcome: success or failure of one request to this worker. */
  record(success: boolean): void {
    if (success) {
      this.failures = 0
      this.successes++
      if (this.current === 'half_open' && this.successes >= this.settings.successThreshold) this.transition('closed')
    } else {
      this.successes = 0
      this.failures++
      if (this.current === 'closed' && this.failures >= this.failureThreshold) this.transition('open')
      else if (this.current === 'half_open') this.transition('open')
    }
    this.publish()
  }

  private transition(to: CircuitState): void {
    const from = this.current
    if (from === to) return
    this.current = to
    this.changedAt = this.clock()
    if (to === 'closed' || to === 'half_open') this.failures = 0
    this.successes = 0
    this.events.transition?.(from, to)
  }

  private publish(): void {
    this.events.counts?.(this.failures, this.successes)
  }
}
