import {requestsOf, type Timeline} from '../model/timeline.js'
import {fail, type Verdict} from '../model/verdict.js'

/**
 * A pin the watchdog cannot see by construction: reported as exactly that, so an operator reads "out of scope"
 * rather than "the watchdog is broken" (or, worse, a pass).
 */
export function checkScope(tl: Timeline): Verdict[] {
  const {scope} = tl.contract
  const out: Verdict[] = []
  for (const pin of requestsOf(tl, 'pin')) {
    const state = pin.expectedState
    if (scope === 'off') {
      out.push(
        fail('scope', pin.rid, "the watchdog is off: nothing evicts a pin before SGLang's own timeouts", {
          scope,
          expectedState: state,
        }),
      )
    } else if (scope === 'inflight' && state && state.queue !== 'inflight' && state.queue !== 'unknown') {
      out.push(
        fail(
          'scope',
          pin.rid,
          `pin outside the watchdog's scope: held in the ${state.queue} queue (${state.kvPoll}) while the watchdog ` +
            `watches only the inflight queue`,
          {scope, expectedState: state, fault: pin.fault},
        ),
      )
    }
  }
  return out
}
