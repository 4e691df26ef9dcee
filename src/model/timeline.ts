import type {MeasuredLags} from './lags.js'

/**
 * The Timeline: everything pdchaos observed during one experiment, each with its time (epoch ms, fractional).
 * Faults and workloads append to it; checks read it and nothing else, so every verdict is reproducible from
 * the journal alone.
 */

/** trip: a request sent through the gateway to open a breaker (trip-breaker); probe: one sent at the open breaker, or
 * after the revert to turn it half-open and close it. */
export type RequestRole = 'pin' | 'load' | 'canary' | 'baseline' | 'trip' | 'probe'

/** Where a pinned request sits, as SGLang names it: the prefill queue and the KVPoll state. */
export interface PinState {
  queue: 'bootstrap' | 'waiting' | 'inflight' | 'unknown'
  kvPoll: 'Bootstrapping' | 'WaitingForInput' | 'Transferring' | 'unknown'
}

export type Observation =
  /**
   * path 'direct': sent to prefill and decode once, as the gateway sends it but without retries; else through the
   * router.
   */
  | {
      kind: 'request-sent'
      t: number
      rid: string
      role: RequestRole
      fault?: string
      scenario?: string
      expectedState?: PinState
      /** direct: both halves sent by pdchaos once; decode-half: decode's half alone (kill-prefill's decode pins). */
      path?: 'direct' | 'decode-half'
    }
  | {kind: 'request-answered'; t: number; rid: string; status: number; detail?: string}
  /** The request's client gave up (our own deadline): the request never answered. */
  | {kind: 'request-abandoned'; t: number; rid: string; detail: string}
  | {kind: 'abort-sent'; t: number; rid: string; target: 'prefill' | 'decode'; status?: number}
  | {kind: 'fault-injected'; t: number; fault: string; leaseId: string; verified: boolean; evidence: string}
  | {kind: 'fault-reverted'; t: number; fault: string; leaseId: string; verifiedClean: boolean; evidence: string}
  /**
   * instance: the server's path in the deployment file (services.prefill[1]), where a batch spans several instance
   * pairs.
   */
  | {
      kind: 'metric'
      t: number
      service: 'prefill' | 'decode' | 'router'
      name: string
      value: number
      instance?: string
    }
  | {kind: 'log'; t: number; service: string; line: string; rid?: string}
  | {kind: 'marker'; t: number; name: string; detail?: string}
  /**
   * One health probe of a service (wedge-rank): t = when its answer arrived (or the probe gave up), ms = how long it
   * took, so it was sent at t - ms; ok = a 2xx answer; status absent when no answer came (refused, timed out).
   */
  | {kind: 'health'; t: number; service: 'prefill' | 'decode' | 'router'; ok: boolean; status?: number; ms: number}
  /**
   * One observation-delay probe while pins were out (a router and a prefill round trip on cheap endpoints, as in
   * calibration): it completed at t and took ms, so it spanned [t - ms, t].
   */
  | {kind: 'hop'; t: number; ms: number}
  /**
   * A line of a service's own log that names a pin, read from the deployment file's `logs:` source for the run's
   * time range (after the window). t = when it was read: the line's own stamp (SGLang prints no zone) stays in the
   * text. watchdog: the line matched the deployment's watchdog.logPattern, with the rid and the seconds held as the
   * server measured them (the server's clock).
   */
  | {
      kind: 'log-line'
      t: number
      service: LogService
      source: string
      line: string
      rid?: string
      watchdog?: {rid: string; heldSeconds: number}
    }
  /** One read of a service's log: how much was read, or why it could not be (a check then says so, never guesses). */
  | {
      kind: 'log-read'
      t: number
      service: LogService
      source: string
      ok: boolean
      lines: number
      truncated: boolean
      detail: string
      instance?: string
    }
  /**
   * Abort trials of one scenario are about to be sent: the window they sweep (ms after each send), the offsets
   * planned, and what holds the window open (the abort check judges whether each abort landed in it).
   */
  | {
      kind: 'transfer-window'
      t: number
      scenario: string
      leaseId: string
      startMs: number
      endMs: number
      why: string
      widening: 'packet-filter' | 'twin-failpoint' | 'none'
      trials: Array<{rid: string; offsetMs: number}>
    }
  /**
   * One read of the gateway's circuit breaker of one worker (smg_worker_cb_state, labelled by the worker's URL): role
   * as pdchaos matched the URL to the deployment's services; transitions: smg_worker_cb_transitions_total so far.
   */
  | {
      kind: 'breaker'
      t: number
      worker: string
      role: 'prefill' | 'decode' | 'other'
      state: 'closed' | 'open' | 'half_open'
      transitions: {toOpen: number; toHalfOpen: number; toClosed: number}
    }
  /**
   * A lease's packet-filter rules, read once more just before the revert: how many packets they matched while in place.
   */
  | {kind: 'filter-matched'; t: number; leaseId: string; packets: number; evidence: string}

/** The services whose logs name a pin's release: prefill's (the pin itself) and decode's (its half of the request). */
export type LogService = 'prefill' | 'decode'

export interface Timeline {
  /** The watchdog contract the run is judged by. */
  contract: {scope: 'all' | 'inflight' | 'off'; deadlineSeconds: number; pollSeconds: number}
  /**
   * Measured on unfaulted requests before the fault: how long a request takes from send to entering the prefill
   * inflight queue (prefillMs), and the spread of that and of one observation round trip (the error pdchaos must
   * allow).
   */
  calibration: Calibration
  observations: Observation[]
}

export interface Calibration {
  /** Median time from send until the request reaches the prefill inflight queue (bootstrap + forward), ms. */
  prefillMs: number
  /** Spread (p99 - p1) of prefillMs across the calibration requests, ms. */
  prefillSpreadMs: number
  /**
   * p99 of the observation delay: from the server's decision to pdchaos seeing the answer (an unfaulted round trip's
   * overhead), ms.
   */
  observeMs: number
  /** Calibration requests behind these figures. */
  samples: number
  /** p99 of the same delay measured again while the pins were out (a busier host answers later), ms. */
  loadedObserveMs?: number
  /**
   * Entry and answer lag measured on held requests (model/lags.ts); absent: not measured (older journals, hold mode).
   */
  lags?: MeasuredLags
}

/** How far around a pin's send and answer the probes that speak for its delays are looked for, ms. */
export const HOP_NEAR_MS = 300

/**
 * The observation delay to allow. For a pin, with probes recorded while it was out: the larger of the idle
 * calibration and the slowest probe that overlapped its send or its answer (a host slow at that moment delays that
 * pin; a hiccup elsewhere does not). Without probes near it: the larger of idle and the whole window's p99.
 */
export function observeDelayMs(
  tl: Timeline,
  pin?: {sentAt: number; answeredAt?: number},
): {ms: number; source: 'idle' | 'window' | 'near'; probes?: number} {
  const c = tl.calibration
  const idle = Math.max(c.observeMs, 1)
  if (pin) {
    const spans = [
      [pin.sentAt - HOP_NEAR_MS, pin.sentAt + HOP_NEAR_MS],
      ...(pin.answeredAt === undefined ? [] : [[pin.answeredAt - HOP_NEAR_MS, pin.answeredAt + HOP_NEAR_MS]]),
    ]
    const near = tl.observations.filter(
      (o): o is Extract<Observation, {kind: 'hop'}> =>
        o.kind === 'hop' && spans.some(([a, b]) => o.t >= a! && o.t - o.ms <= b!),
    )
    if (near.length > 0) {
      const worst = Math.max(...near.map(h => h.ms))
      return worst > idle
        ? {ms: worst, source: 'near', probes: near.length}
        : {ms: idle, source: 'idle', probes: near.length}
    }
  }
  return c.loadedObserveMs !== undefined && c.loadedObserveMs > idle
    ? {ms: c.loadedObserveMs, source: 'window'}
    : {ms: idle, source: 'idle'}
}

export function sentOf(tl: Timeline, rid: string) {
  return tl.observations.find(
    (o): o is Extract<Observation, {kind: 'request-sent'}> => o.kind === 'request-sent' && o.rid === rid,
  )
}

export function answerOf(tl: Timeline, rid: string) {
  return tl.observations.find(
    (o): o is Extract<Observation, {kind: 'request-answered'}> => o.kind === 'request-answered' && o.rid === rid,
  )
}

export function abandonedOf(tl: Timeline, rid: string) {
  return tl.observations.find(
    (o): o is Extract<Observation, {kind: 'request-abandoned'}> => o.kind === 'request-abandoned' && o.rid === rid,
  )
}

export function requestsOf(tl: Timeline, role: RequestRole) {
  return tl.observations.filter(
    (o): o is Extract<Observation, {kind: 'request-sent'}> => o.kind === 'request-sent' && o.role === role,
  )
}

export function faultWindows(tl: Timeline): Array<{fault: string; leaseId: string; from: number; to?: number}> {
  const out: Array<{fault: string; leaseId: string; from: number; to?: number}> = []
  for (const o of tl.observations) {
    if (o.kind === 'fault-injected') out.push({fault: o.fault, leaseId: o.leaseId, from: o.t})
    if (o.kind === 'fault-reverted') {
      const w = out.find(x => x.leaseId === o.leaseId && x.to === undefined)
      if (w) w.to = o.t
    }
  }
  return out
}

/**
 * The value of a metric series at the last sample at or before t (undefined before its first sample); of one
 * instance's server where `instance` is given (a batch over several pairs), else of any.
 */
export function metricAt(
  tl: Timeline,
  service: string,
  name: string,
  t: number,
  instance?: string,
): number | undefined {
  let v: number | undefined
  for (const o of tl.observations) {
    if (
      o.kind === 'metric' &&
      o.service === service &&
      o.name === name &&
      o.t <= t &&
      (instance === undefined || o.instance === instance)
    )
      v = o.value
  }
  return v
}

/**
 * The instances whose servers of `service` were sampled ([undefined]: samples not labelled by instance, one pair's).
 */
export function sampledInstances(tl: Timeline, service: string): Array<string | undefined> {
  const seen = new Set<string>()
  for (const o of tl.observations)
    if (o.kind === 'metric' && o.service === service && o.instance !== undefined) seen.add(o.instance)
  return seen.size > 0 ? [...seen] : [undefined]
}

/** The log lines that name a rid, in the order they were read (a service's lines keep their order in its log). */
export function logLinesOf(tl: Timeline, rid: string) {
  return tl.observations.filter(
    (o): o is Extract<Observation, {kind: 'log-line'}> =>
      o.kind === 'log-line' && (o.rid === rid || o.watchdog?.rid === rid),
  )
}

/** The last read of a service's log (undefined: its log was never read, e.g. the deployment file names none). */
export function logReadOf(tl: Timeline, service: LogService) {
  return tl.observations
    .filter((o): o is Extract<Observation, {kind: 'log-read'}> => o.kind === 'log-read' && o.service === service)
    .at(-1)
}
