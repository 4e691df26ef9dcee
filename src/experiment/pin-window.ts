import {now, type Recorder} from '../workload/recorder.js'
import {sendDirect, sendRequest, type SendOptions, type Sent} from '../workload/send.js'
import {sleep, within} from '../util/time.js'
import type {PairInBatch} from './batch-pairs.js'
import type {Entry} from './entry.js'
import type {ObserveContext, WindowKind} from './observe-kind.js'
import type {RunSession} from './session.js'

/**
 * The batch's shared window: every scenario of a window kind (pins, abort trials) sends its requests, then the batch
 * waits (bounded) until they have all ended or the longest window has closed, while the observation delay is measured
 * again (a host busier now than at calibration delays every answer more, and ε must know it).
 */

/** Pause between two observation-delay probes while pins are out: enough samples for a p99, little added load. */
const HOP_PROBE_GAP_MS = 50

export interface WindowTiming {
  windowMs: number
  marginMs: number
  requestTimeoutMs: number
  /** Every pin and trial in flight listens on it: aborted when the window is over. */
  pinSignal: AbortSignal
}

/** Run the window for `active` (each with its kind); every request sent lands in `pins`. The loaded p99, if any. */
export async function runPinWindow(
  active: Array<{e: Entry; kind: WindowKind}>,
  ctx: ObserveContext,
  t: WindowTiming,
  pins: Array<{e: Entry; sent: Sent}>,
): Promise<number | undefined> {
  const {settings, signal} = ctx
  const hops = watchHops(ctx.session, ctx.pairs, ctx.rec)
  let loadedObserveMs: number | undefined
  try {
    settings.say(`sending pins: ${active.map(({e, kind}) => `${e.s.name} ${kind.sends(e)}`).join(', ')}`)
    await Promise.all(active.map(({e, kind}) => kind.send(e, windowSend(e, ctx, t, pins))))
    if (pins.length > 0) {
      const closeAt = Math.max(...pins.map(p => p.sent.sentAt)) + t.windowMs + t.marginMs
      settings.say(`waiting for evictions (window closes in ${((closeAt - now()) / 1000).toFixed(1)}s)`)
      settings.onDeadline?.('window closes', closeAt)
      // within, not a race with sleep: the pins usually end first, and the sleep's timer would then keep the
      // process alive until the window's end (1.7-3.7 s after every inject and suite had printed its verdicts).
      await within(Promise.all(pins.map(p => p.sent.done)), closeAt - now(), signal)
    }
  } finally {
    loadedObserveMs = await hops.stop()
  }
  if (loadedObserveMs !== undefined && loadedObserveMs > ctx.calibration.observeMs) {
    settings.say(
      `observation delay while the pins were out: p99 ${loadedObserveMs.toFixed(1)} ms ` +
        `(idle ${ctx.calibration.observeMs.toFixed(1)} ms); each pin's ε uses the probes around its send ` +
        `and answer`,
    )
  }
  return loadedObserveMs
}

/** How one scenario sends: to its own pair's prefill and decode (and that prefill's bootstrap server). */
function windowSend(e: Entry, ctx: ObserveContext, t: WindowTiming, pins: Array<{e: Entry; sent: Sent}>) {
  const {settings, rec} = ctx
  const own = ctx.pairOf(e.s).session
  const base = {
    role: 'pin' as const,
    fault: e.plan!.fault,
    scenario: e.s.name,
    timeoutMs: t.requestTimeoutMs,
    signal: t.pinSignal,
    promptTokens: settings.promptTokens,
  }
  const send = (o: Partial<SendOptions>): Sent => {
    const all = {...base, ...o} as SendOptions
    return settings.pinPath === 'router'
      ? sendRequest(ctx.session.router, rec, all)
      : sendDirect(own, own.bootstrap, rec, all)
  }
  return {ctx, send, sent: (s: Sent) => pins.push({e, sent: s}), own, stop: ctx.signal}
}

/**
 * The observation delay, measured the way calibration measures it (a router and a prefill round trip on cheap
 * endpoints), over and over until stopped, each probe recorded in the timeline (ε of a pin uses the probes around
 * its send and answer); stop() gives the p99 over the probes that succeeded, or undefined without one. Bounded in
 * count.
 */
function watchHops(
  session: RunSession,
  pairs: PairInBatch[],
  rec: Recorder,
): {stop: () => Promise<number | undefined>} {
  const stopping = new AbortController()
  const hops: number[] = []
  const loop = (async () => {
    for (let i = 0; !stopping.signal.aborted && i < 2000; i++) {
      // Over several pairs, the slowest prefill speaks for the round trip: ε must cover every pair's pins.
      const [a, ...bs] = await Promise.all([
        session.router.liveness(),
        ...pairs.map(p => p.session.prefill.health('/v1/loads')),
      ])
      // A failed probe measured its own timeout, not a delay: counting it would widen ε past any late eviction. Any
      // answer of prefill is a round trip (an SGLang without /v1/loads answers 404, as promptly).
      if (a!.ok && bs.every(b => b.ok || b.status !== undefined)) {
        const ms = a!.ms + Math.max(...bs.map(b => b.ms))
        hops.push(ms)
        rec.add({kind: 'hop', t: now(), ms})
      }
      await sleep(HOP_PROBE_GAP_MS, stopping.signal)
    }
  })()
  return {
    async stop() {
      stopping.abort()
      await loop
      if (hops.length === 0) return undefined
      const sorted = [...hops].sort((a, b) => a - b)
      return sorted[Math.min(sorted.length - 1, Math.ceil(0.99 * sorted.length) - 1)]!
    },
  }
}
