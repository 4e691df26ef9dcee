import {checkEvictions} from '../checks/eviction.js'
import {checkScope} from '../checks/scope.js'
import {sleep} from '../util/time.js'
import type {WindowKind} from './observe-kind.js'

/**
 * `observe: 'pins'`: each scenario sends its pins (requests its fault holds where the fault's `pins` says), paced
 * `burst` at a time `gapMs` apart, in the batch's shared window; the eviction check judges each pin by the watchdog's
 * contract, and the scope check that nothing else was held.
 */
export const observePins: WindowKind = {
  share: 'window',
  countsEvictions: true,
  sends: e => `${e.s.pins} pin(s)`,
  async send(e, o) {
    const {pinPacing} = o.ctx.settings
    const pinState = e.scenario!.fault.pins
    const expectedState = pinState === 'trials' ? undefined : pinState
    for (let i = 0; i < e.s.pins && !o.stop.aborted; i++) {
      if (i > 0 && i % pinPacing.burst === 0) await sleep(pinPacing.gapMs, o.stop)
      if (o.stop.aborted) break
      o.sent(o.send({expectedState}))
    }
  },
  judge(run, e, j) {
    const ev = checkEvictions(run.timeline!, {
      expected: e.plan!.expected,
      ...(e.competing ? {competing: e.competing} : {}),
      competingAllowed: e.competingAllowed === true,
      batchPins: j.batchPins,
    })
    run.verdicts.push(...ev.verdicts)
    run.pins = ev.pins
    run.verdicts.push(...checkScope(run.timeline!))
  },
}
