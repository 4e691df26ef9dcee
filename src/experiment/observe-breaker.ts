import {checkBreakerTrip} from '../checks/breaker-trip.js'
import type {BreakerExpectation} from '../checks/expectation.js'
import {type BreakerTrial, tripAndProbe, watchBreakerClose} from './breaker-trial.js'
import type {AloneKind} from './observe-kind.js'

/**
 * `observe: 'breaker'`: a fault that opens the gateway's circuit breaker of one worker (its plan's `expected`, a
 * BreakerExpectation). With the fault in place the kind trips the breaker and sends requests at it; after the revert
 * it watches the breaker half-open and close (breaker-trial.ts); checkBreakerTrip judges. It runs alone (its footprint
 * is exclusive).
 */
const breakerOf = (e: {plan?: {expected?: {kind: string}}}): BreakerExpectation | undefined =>
  e.plan?.expected?.kind === 'breaker' ? (e.plan.expected as BreakerExpectation) : undefined

export const observeBreaker: AloneKind = {
  share: 'alone',
  countsEvictions: false,
  async watch(e, ctx) {
    const x = breakerOf(e)
    const session = ctx.pairOf(e.s).session
    const on = {
      fault: e.s.fault,
      promptTokens: ctx.settings.promptTokens,
      scenario: e.s.name,
      signal: ctx.signal,
      say: ctx.settings.say,
    }
    let trial: BreakerTrial | undefined
    return {
      async hold() {
        if (x) trial = await tripAndProbe(session, ctx.rec, x, on)
      },
      async afterRevert() {
        if (x && trial) await watchBreakerClose(session, ctx.rec, x, trial, on)
      },
      stop: async () => {},
    }
  },
  judge(run, e) {
    run.verdicts.push(...checkBreakerTrip(run.timeline!, breakerOf(e)))
  },
}
