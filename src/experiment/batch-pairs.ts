import {PD_QUEUE_GAUGES, PD_QUEUE_LOADS} from '../engines/sglang/sglang-metrics.js'
import type {Observation} from '../model/timeline.js'
import {pairServers, type SampledServer} from '../workload/sampler.js'
import type {BatchScenario} from './batch-scenario.js'
import type {RunSession} from './session.js'

/**
 * The instance pairs one batch acts on (scenarios on pairs whose footprints do not overlap share a window), the
 * servers it samples for them, and when they have all drained.
 */

/**
 * Every PD queue of every server reads 0: in its latest loads snapshot, or, on an SGLang whose /v1/loads has no disagg
 * section, in its /metrics gauges (the requests pdchaos sent have all been answered by then; a stale nonzero gauge
 * only makes this wait out its deadline, and the recovery check says what it could not prove). A server none of whose
 * queues was seen (a pair of the batch that never answered) is not drained.
 */
export function drained(
  rec: {observations: readonly Observation[]},
  servers: ReadonlyArray<{service: 'prefill' | 'decode'; instance?: string}>,
): boolean {
  const key = (service: string, instance: string | undefined) => `${service}/${instance ?? ''}`
  const last = new Map<string, Map<string, number>>()
  for (const o of rec.observations) {
    if (o.kind !== 'metric' || !(PD_QUEUE_LOADS as readonly string[]).concat(PD_QUEUE_GAUGES).includes(o.name)) continue
    const k = key(o.service, o.instance)
    if (!last.has(k)) last.set(k, new Map())
    last.get(k)!.set(o.name, o.value)
  }
  return (
    servers.length > 0 &&
    servers.every(s => {
      const seen = last.get(key(s.service, s.instance)) ?? new Map<string, number>()
      const loads = PD_QUEUE_LOADS.filter(n => seen.has(n))
      const names: readonly string[] = loads.length > 0 ? loads : PD_QUEUE_GAUGES.filter(n => seen.has(n))
      return names.length > 0 && names.every(n => seen.get(n) === 0)
    })
  )
}

/** No /v1/loads PD queue was ever sampled: the queues are known only from the per-batch /metrics gauges. */
export function gaugesOnly(rec: {observations: readonly Observation[]}): boolean {
  return !rec.observations.some(o => o.kind === 'metric' && (PD_QUEUE_LOADS as readonly string[]).includes(o.name))
}

/** One instance pair a batch acts on: its session, and where the file states its two instances (labels its samples). */
export interface PairInBatch {
  session: RunSession
  labels: {prefill: string; decode: string}
}

/** The pairs of a batch's scenarios, each once, in order (the batch's own session for a scenario that names none). */
export function pairsOf(session: RunSession, batch: BatchScenario[]): PairInBatch[] {
  const out: PairInBatch[] = []
  for (const s of batch.length > 0 ? batch : [{} as Partial<BatchScenario>]) {
    const own = s.session ?? session
    if (out.some(p => p.session === own)) continue
    // A session given without its paths is named by its servers' URLs: labels only need to tell the pairs apart.
    out.push({session: own, labels: s.pair ?? {prefill: own.prefill.baseUrl, decode: own.decode.baseUrl}})
  }
  return out
}

/**
 * Every server the batch's pairs span, once each (pairs may share one); labelled by instance where there are several
 * pairs.
 */
export function serversOf(pairs: PairInBatch[]): SampledServer[] {
  if (pairs.length === 1) return pairServers(pairs[0]!.session)
  const out = new Map<string, SampledServer>()
  for (const p of pairs) {
    for (const service of ['prefill', 'decode'] as const) {
      const instance = p.labels[service]
      if (!out.has(`${service}/${instance}`))
        out.set(`${service}/${instance}`, {service, client: p.session[service], instance})
    }
  }
  return [...out.values()]
}
