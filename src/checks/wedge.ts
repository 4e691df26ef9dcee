import {round, secs} from './eviction.js'
import type {WedgeExpectation} from './expectation.js'
import {faultWindows, type Observation, observeDelayMs, type Timeline} from '../model/timeline.js'
import {type CheckName, fail, pass, unverified, type Verdict} from '../model/verdict.js'

/**
 * The wedge oracle (wedge-rank): a stopped rank wedges its instance, so its /health must go red within the bound its
 * own health-check timeout sets (detection), and be ok again within that bound after SIGCONT (resumption). The
 * clock is the health probes' own answers (when each arrived). It never judges the watchdog: a wedged instance
 * cannot run it.
 */

export const WATCHDOG_NOT_JUDGED =
  'a wedged instance cannot run its watchdog: this experiment judges detection and recovery only'

/** The check names its verdicts are reported under (detection: did the fault show; resumption: recovery). */
export const WEDGE_CHECKS = {detection: 'fault-effect', resumption: 'recovery'} as const satisfies Record<
  string,
  CheckName
>

/**
 * Without the plan's expectation: SGLang's default health-check timeout (20 s) + 2 × its 1 s tick + a 250 ms sample.
 */
const DEFAULT_BOUND_S = 22.25

type Health = Extract<Observation, {kind: 'health'}>

const healthOf = (tl: Timeline, service: string): Health[] =>
  tl.observations.filter((o): o is Health => o.kind === 'health' && o.service === service).sort((a, b) => a.t - b.t)

const describe = (h: Health): string =>
  h.status === undefined ? `no answer after ${round(h.ms)} ms` : `${h.status} after ${round(h.ms)} ms`

/** A wedge's window, its bounds and what every verdict on it carries. */
interface WedgeCtx {
  tl: Timeline
  expected: WedgeExpectation | undefined
  from: number
  to: number
  end: number
  detectBound: number
  resumeBound: number
  epsMs: number
  base: Record<string, unknown>
}

export function checkWedge(tl: Timeline, expected?: WedgeExpectation): Verdict[] {
  const window = faultWindows(tl)[0]
  if (!window)
    return [
      unverified(WEDGE_CHECKS.detection, 'wedge', 'no wedge was injected: nothing to judge', {
        why: 'the timeline has no fault-injected observation',
        toVerify: 'inject wedge-rank and let it take effect',
        watchdog: WATCHDOG_NOT_JUDGED,
      }),
    ]
  const end = Math.max(...tl.observations.map(o => o.t))
  const from = window.from
  const to = window.to ?? end
  // The wedged side: the plan's, else the one whose health went red while the wedge was held.
  const service =
    expected?.service ??
    (['prefill', 'decode'] as const).find(s => healthOf(tl, s).some(h => !h.ok && h.t >= from && h.t - h.ms < to))
  const epsMs = 5 + 2 * observeDelayMs(tl).ms
  const w: WedgeCtx = {
    tl,
    expected,
    from,
    to,
    end,
    detectBound: expected?.detectWithinSeconds ?? DEFAULT_BOUND_S,
    resumeBound: expected?.resumeWithinSeconds ?? DEFAULT_BOUND_S,
    epsMs,
    base: wedgeBase(expected, epsMs),
  }
  if (!service) return [noWedgedService(w)]
  return [detection(w, service), resumption(w, service, window.to)]
}

function wedgeBase(expected: WedgeExpectation | undefined, epsMs: number): Record<string, unknown> {
  return {
    clock: "the health probes' own answers (arrival time; each was sent its duration earlier)",
    watchdog: WATCHDOG_NOT_JUDGED,
    epsilonMs: round(epsMs),
    ...(expected
      ? {
          healthTimeoutSeconds: expected.healthTimeoutSeconds,
          healthTimeoutSource: expected.healthTimeoutSource,
          probePath: expected.probePath,
          boundWhy: expected.why,
        }
      : {
          boundWhy:
            `no plan expectation: SGLang's default health-check timeout (20 s) + 2 × 1 s + 0.25 s ` +
            `= ${DEFAULT_BOUND_S} s`,
        }),
  }
}

/** No side's health went red while the wedge was held (and the plan names none): never detected, or not sampled. */
function noWedgedService({tl, from, to, base}: WedgeCtx): Verdict {
  const sampled = (['prefill', 'decode'] as const).filter(s =>
    healthOf(tl, s).some(h => h.t >= from && h.t - h.ms < to),
  )
  if (sampled.length === 0) {
    return unverified(
      WEDGE_CHECKS.detection,
      'health: detection',
      'no health sample while the wedge was held: detection unverified',
      {
        ...base,
        why: 'the timeline has no health observation inside the fault window',
        toVerify: 'sample /health of prefill and decode every 250 ms while the wedge is held and after the revert',
      },
    )
  }
  return fail(
    WEDGE_CHECKS.detection,
    'health: detection',
    `never detected: ${sampled.join(' and ')} /health stayed ok for the ${secs(to - from)} the wedge was held`,
    {...base, heldSeconds: round((to - from) / 1000, 3)},
  )
}

/** Detection: the wedged side's /health went red within the bound while the wedge was held. */
function detection(w: WedgeCtx, service: 'prefill' | 'decode'): Verdict {
  const {tl, from, to, base, detectBound, epsMs} = w
  const samples = healthOf(tl, service)
  const other = service === 'prefill' ? 'decode' : 'prefill'
  const others = healthOf(tl, other).filter(h => h.t >= from && h.t - h.ms < to)
  const otherSeen = others.length
    ? {otherService: other, otherSamples: others.length, otherRed: others.filter(h => !h.ok).length}
    : {}
  const subjectD = `${service} health: detection`
  const before = samples.filter(h => h.t < from)
  const during = samples.filter(h => h.t >= from && h.t - h.ms < to)
  const red = during.find(h => !h.ok)
  const boundMs = detectBound * 1000
  if (before.length && !before.at(-1)!.ok)
    return unverified(
      WEDGE_CHECKS.detection,
      subjectD,
      `${service} was already unhealthy before the wedge (${describe(before.at(-1)!)}): detection cannot be told`,
      {
        ...base,
        ...otherSeen,
        why: 'the last health sample before the wedge was not ok',
        toVerify: 'start from a healthy deployment (`pdchaos status`), then inject',
      },
    )
  if (red) {
    const after = red.t - from
    const ev = {
      ...base,
      ...otherSeen,
      detectedAfterSeconds: round(after / 1000, 3),
      boundSeconds: detectBound,
      firstRed: describe(red),
      samplesWhileHeld: during.length,
    }
    return after <= boundMs + epsMs
      ? pass(
          WEDGE_CHECKS.detection,
          subjectD,
          `detected: ${service} /health went red ${secs(after)} after the wedge (${describe(red)}; ` +
            `bound ${detectBound} s); the watchdog is not judged`,
          ev,
        )
      : fail(
          WEDGE_CHECKS.detection,
          subjectD,
          `detected late: ${service} /health went red only ${secs(after)} after the wedge (bound ${detectBound} s)`,
          ev,
        )
  }
  return notDetected(w, service, during.length, otherSeen)
}

/** The wedged side's /health stayed ok (or was not sampled) while the wedge was held. */
function notDetected(w: WedgeCtx, service: string, samplesWhileHeld: number, otherSeen: object): Verdict {
  const {from, to, base, detectBound, expected} = w
  const subjectD = `${service} health: detection`
  const heldMs = to - from
  if (samplesWhileHeld === 0)
    return unverified(
      WEDGE_CHECKS.detection,
      subjectD,
      `no ${service} health sample while the wedge was held: detection unverified`,
      {
        ...base,
        ...otherSeen,
        why: `no health observation of ${service} inside the fault window`,
        toVerify: `sample ${service} /health every 250 ms while the wedge is held`,
      },
    )
  if (heldMs < detectBound * 1000)
    return unverified(
      WEDGE_CHECKS.detection,
      subjectD,
      `${service} /health stayed ok, but the wedge was held only ${secs(heldMs)}, less than the detection ` +
        `bound ${detectBound} s`,
      {
        ...base,
        ...otherSeen,
        why: 'the wedge ended before the deployment was due to notice it',
        toVerify: `hold the wedge at least ${expected?.holdSeconds ?? Math.ceil(detectBound + 3)} s`,
      },
    )
  return fail(
    WEDGE_CHECKS.detection,
    subjectD,
    `never detected: ${service} /health stayed ok for the ${secs(heldMs)} the wedge was held ` +
      `(bound ${detectBound} s)`,
    {
      ...base,
      ...otherSeen,
      heldSeconds: round(heldMs / 1000, 3),
      boundSeconds: detectBound,
      samplesWhileHeld,
    },
  )
}

/** Resumption: after SIGCONT, the first ok answer after which nothing is red again, within the bound. */
function resumption(w: WedgeCtx, service: 'prefill' | 'decode', revertedAt: number | undefined): Verdict {
  const {tl, base, resumeBound, epsMs} = w
  const subjectR = `${service} health: resumption`
  if (revertedAt === undefined)
    return unverified(WEDGE_CHECKS.resumption, subjectR, 'the wedge was not reverted: resumption unverified', {
      ...base,
      why: 'no fault-reverted observation',
      toVerify: 'revert the lease (SIGCONT) and keep sampling health',
    })
  const afterRevert = healthOf(tl, service).filter(h => h.t >= revertedAt)
  let lastRed = -1
  afterRevert.forEach((h, i) => {
    if (!h.ok) lastRed = i
  })
  const okAt = afterRevert.slice(lastRed + 1)[0]
  if (!okAt) return notResumed(w, service, afterRevert, revertedAt)
  const after = okAt.t - revertedAt
  const ev = {
    ...base,
    resumedAfterSeconds: round(after / 1000, 3),
    boundSeconds: resumeBound,
    samplesAfterRevert: afterRevert.length,
    redAfterRevert: afterRevert.filter(h => !h.ok).length,
  }
  return after <= resumeBound * 1000 + epsMs
    ? pass(
        WEDGE_CHECKS.resumption,
        subjectR,
        `resumed: ${service} /health ok ${secs(after)} after SIGCONT and stayed ok (bound ${resumeBound} s)`,
        ev,
      )
    : fail(
        WEDGE_CHECKS.resumption,
        subjectR,
        `resumed late: ${service} /health ok only ${secs(after)} after SIGCONT (bound ${resumeBound} s)`,
        ev,
      )
}

/** No ok answer after SIGCONT that stayed ok: not sampled, sampling stopped too soon, or never resumed. */
function notResumed(w: WedgeCtx, service: string, afterRevert: Health[], revertedAt: number): Verdict {
  const {base, resumeBound, end} = w
  const subjectR = `${service} health: resumption`
  const watched = end - revertedAt
  if (afterRevert.length === 0)
    return unverified(
      WEDGE_CHECKS.resumption,
      subjectR,
      `no ${service} health sample after SIGCONT: resumption unverified`,
      {
        ...base,
        why: 'no health observation after the revert',
        toVerify: `keep sampling ${service} /health after the revert for ${resumeBound} s`,
      },
    )
  if (watched < resumeBound * 1000)
    return unverified(
      WEDGE_CHECKS.resumption,
      subjectR,
      `${service} /health still red when sampling stopped ${secs(watched)} after SIGCONT, before the ` +
        `bound ${resumeBound} s`,
      {
        ...base,
        why: 'sampling stopped before the deployment was due to recover',
        toVerify: `keep sampling ${service} /health for ${resumeBound} s after the revert`,
      },
    )
  return fail(
    WEDGE_CHECKS.resumption,
    subjectR,
    `never resumed: ${service} /health still red ${secs(watched)} after SIGCONT (bound ${resumeBound} s; ` +
      `last: ${describe(afterRevert.at(-1)!)})`,
    {
      ...base,
      watchedSeconds: round(watched / 1000, 3),
      boundSeconds: resumeBound,
      samplesAfterRevert: afterRevert.length,
    },
  )
}
