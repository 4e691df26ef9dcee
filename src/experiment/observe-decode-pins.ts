import {decodeVerdicts, holdHalves} from './decode-pins.js'
import type {AloneKind} from './observe-kind.js'

/**
 * `observe: 'decode-pins'`: decode's halves of requests, held in decode's transfer queue when the fault takes prefill
 * away (experiment/decode-pins.ts). The halves are sent before the injection and shown held; with the fault in place
 * the kind waits for decode to release them (within the expectation's window), then aborts what decode still holds and
 * brings prefill back behind its health gate before the lease's revert verifies it. checks/decode-release.ts judges.
 * It runs alone (its footprint is exclusive).
 */
export const observeDecodePins: AloneKind = {
  share: 'alone',
  countsEvictions: false,
  async watch(e, ctx) {
    const {settings} = ctx
    const halves = await holdHalves([e], ctx.pairOf, ctx.rec, ctx.servers, settings, ctx.requestTimeoutMs, ctx.signal)
    return {
      async hold() {
        if (!halves) return
        await halves.waitReleased(ctx.signal)
        await halves.restore(settings.say)
      },
      afterRevert: async () => {},
      stop: async () => {},
    }
  },
  judge(run, e) {
    if (e.plan) run.verdicts.push(...decodeVerdicts(run.timeline!, e.plan))
  },
}
