/**
 * What a fault's plan says the deployment will do, in a form the checks read (FaultPlan.expected). Plain JSON, so it
 * travels in the journal with the plan. Faults state it; checks use it to word an unverified verdict precisely or to
 * bound a health judgement; neither ever changes a verdict's clock.
 */

/**
 * A KV stall: does the transport give up before the watchdog deadline? 'transport-error' when it surely does,
 * 'watchdog' when it surely does not, 'either' when its give-up time straddles the deadline.
 */
export interface StallExpectation {
  kind: 'stall'
  outcome: 'transport-error' | 'watchdog' | 'either'
  /** About when the transport fails a stalled transfer, seconds after it stalls (null: it never does, or is not modelled). */
  afterSeconds: number | null
  /** The give-up time's range where the implementations differ ([low, high] seconds). */
  afterSecondsRange?: [number, number]
  /** The watchdog deadline it was compared with. */
  deadlineSeconds?: number
  /** What sets the transport's limit, as read (e.g. "UCX_RC_MLX5_TIMEOUT=1s (qp 1.074 s), retry count 7 (default)"). */
  limits: string
  /** The settings to raise so that a stall outlasts the watchdog deadline and the watchdog is exercised. */
  raise: string[]
  why: string
}

/**
 * A wedged instance (wedge-rank): its /health must go red within detectWithinSeconds of the wedge and come back
 * within resumeWithinSeconds of the revert. Derived from the deployment's own health-check timeout.
 */
export interface WedgeExpectation {
  kind: 'wedge'
  /** The wedged instance; the other one is reported, not judged. */
  service: 'prefill' | 'decode'
  healthTimeoutSeconds: number
  /** Where the timeout came from (the variable, the twin's statement, SGLang's default). */
  healthTimeoutSource: string
  detectWithinSeconds: number
  resumeWithinSeconds: number
  /** The path to probe: /health, or /health_generate where /health does not generate. */
  probePath: '/health' | '/health_generate'
  /** How often the runner samples each service's health (one probe in flight per service at a time). */
  sampleIntervalMs: number
  /** How long the runner holds the wedge before the revert: the detection bound plus a margin. */
  holdSeconds: number
  why: string
}

export type FaultExpectation = StallExpectation | WedgeExpectation
