import type {WedgeExpectation} from '../checks/expectation.js'
import {checkWedge} from '../checks/wedge.js'
import {serviceClients} from '../engines/sglang/deployment/clients.js'
import {sleep} from '../util/time.js'
import {now, type Recorder} from '../workload/recorder.js'
import type {AloneKind} from './observe-kind.js'
import type {RunSession} from './session.js'

/**
 * `observe: 'health'`: a fault whose expected outcome is a wedged instance (its plan's `expected`, a
 * WedgeExpectation) holds no pin and runs no watchdog. The kind watches prefill's and decode's health from before the
 * injection, holds the fault for the detection bound, and after the revert waits for the wedged service to answer
 * healthy again; checkWedge judges the samples. It runs alone (its footprint is exclusive).
 */
const wedgeOf = (e: {plan?: {expected?: {kind: string}}}): WedgeExpectation | undefined =>
  e.plan?.expected?.kind === 'wedge' ? (e.plan.expected as WedgeExpectation) : undefined

export const observeHealth: AloneKind = {
  share: 'alone',
  countsEvictions: false,
  async watch(e, ctx) {
    const x = wedgeOf(e)
    if (!x) return {hold: async () => {}, afterRevert: async () => {}, stop: async () => {}}
    const health = await startHealthWatch(ctx.pairOf(e.s).session, ctx.rec, x)
    const {say, onDeadline} = ctx.settings
    return {
      async hold() {
        const hold = x.holdSeconds * 1000
        say(`holding the wedge for ${(hold / 1000).toFixed(1)}s, sampling health`)
        onDeadline?.('wedge held', now() + hold)
        await sleep(hold, ctx.signal)
      },
      async afterRevert() {
        say('waiting for the wedged instance to answer healthy again')
        await health.resumed(ctx.signal)
      },
      stop: () => health.stop(),
    }
  },
  judge(run, e) {
    run.verdicts.push(...checkWedge(run.timeline!, wedgeOf(e)))
  },
}

interface HealthWatch {
  /** Until the wedged service has answered ok three times in a row after the revert, or its resumption bound (+2 s). */
  resumed(signal: AbortSignal): Promise<void>
  stop(): Promise<void>
}

/**
 * The evidence of a wedge: prefill's and decode's health, one probe in flight per service, a new one every
 * sampleIntervalMs (or as soon as a slow one answers), each recorded when its answer arrives. The first round is
 * taken before the fault is injected.
 */
async function startHealthWatch(session: RunSession, rec: Recorder, x: WedgeExpectation): Promise<HealthWatch> {
  const clients = serviceClients(session.deployment, {timeoutMs: (x.healthTimeoutSeconds + 5) * 1000})
  const stopping = new AbortController()
  const okStreak = {prefill: 0, decode: 0}
  const probe = async (service: 'prefill' | 'decode') => {
    const h = await clients[service].health(x.probePath)
    rec.add({
      kind: 'health',
      t: now(),
      service,
      ok: h.ok,
      ...(h.status === undefined ? {} : {status: h.status}),
      ms: h.ms,
    })
    okStreak[service] = h.ok ? okStreak[service] + 1 : 0
    return h.ms
  }
  await Promise.all([probe('prefill'), probe('decode')])
  // Bounded: the watch ends with the batch (stop), and at most this many probes per service.
  const loops = (['prefill', 'decode'] as const).map(async service => {
    for (let i = 0; i < 100_000 && !stopping.signal.aborted; i++) {
      const ms = await probe(service)
      await sleep(Math.max(0, x.sampleIntervalMs - ms), stopping.signal)
    }
  })
  return {
    async resumed(signal) {
      okStreak[x.service] = 0
      const by = now() + (x.resumeWithinSeconds + 2) * 1000
      while (okStreak[x.service] < 3 && now() < by && !signal.aborted) await sleep(x.sampleIntervalMs, signal)
    },
    async stop() {
      stopping.abort()
      await Promise.all(loops)
    },
  }
}
