/**
 * What a fault's plan says the deployment will do, in a form the checks read (FaultPlan.expected). Plain JSON, so it
 * travels in the journal with the plan. Faults state it; checks use it to word an unverified verdict precisely or to
 * bound a health judgement; neither ever changes a verdict's clock.
 */

import type {DecodeReleaseExpectation} from './decode-release.js'

export type {DecodeReleaseExpectation} from './decode-release.js'

/**
 * A KV stall: does the transport give up before the watchdog deadline? 'transport-error' when it surely does,
 * 'watchdog' when it surely does not, 'either' when its give-up time straddles the deadline.
 */
export interface StallExpectation {
  kind: 'stall'
  outcome: 'transport-error' | 'watchdog' | 'either'
  /**
   * About when the transport fails a stalled transfer, seconds after it stalls (null: it never does, or is not
   * modelled).
   */
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

/**
 * trip-breaker: the gateway's breaker of one prefill worker opened by failing its requests, then requests sent at it.
 * Each must be refused (503) within refuseWithinMs without a decode-only dispatch; after openSeconds the breaker must
 * turn half-open and close on successThreshold successes. From the gateway's settings as `status` reads them.
 */
export interface BreakerExpectation {
  kind: 'breaker'
  role: 'prefill'
  /** The deployment's URLs of the worker whose breaker is tripped and of the decode worker. */
  workerUrl: string
  decodeUrl: string
  failureThreshold: number
  successThreshold: number
  openSeconds: number
  /** Attempts per client request (the retry loop): each failed attempt counts once. */
  attempts: number
  /** Requests sent through the gateway to open it: enough attempts for the threshold, and two more. */
  tripRequests: number
  /** How long each tripping request may take before pdchaos gives up on it (a gateway that awaits decode holds it). */
  tripTimeoutMs: number
  /** Requests sent at the open breaker. */
  probes: number
  /** Each probe's bound: every attempt refused at selection, with the worst backoff between them, plus a margin. */
  refuseWithinMs: number
  /** After the revert, the breaker must have closed within this long of its opening (openSeconds plus a margin). */
  closeWithinSeconds: number
  /** Where the figures came from (the gateway's command line, or its defaults). */
  settingsSource: string
  why: string
}

export type FaultExpectation = StallExpectation | WedgeExpectation | BreakerExpectation | DecodeReleaseExpectation
