import {joinUrl, requestText} from '../deployment/http.js'
import {parsePromText} from '../deployment/prom-text.js'
import type {SglangClient} from '../engines/sglang/deployment/sglang-client.js'
import {
  LOADS_RUNNING_REQS,
  LOADS_USED_TOKENS,
  LOADS_WAITING_REQS,
  PD_COUNTERS,
  PD_QUEUE_GAUGES,
  PD_QUEUE_LOADS,
  RUNNING_REQS,
  TOKEN_USAGE,
} from '../engines/sglang/sglang-metrics.js'
import {sleep} from '../util/time.js'
import {now, type Recorder} from './recorder.js'

/**
 * Samples what the deployment says about itself into the timeline: SGLang's counters and (stale) gauges from
 * /metrics, and the fresher /v1/loads snapshot. Evidence and corroboration only: the clock of a verdict is always
 * a request's own answer.
 */

export const SAMPLED_METRICS = [...PD_COUNTERS, ...PD_QUEUE_GAUGES, RUNNING_REQS, TOKEN_USAGE]

const LOADS = [...PD_QUEUE_LOADS, LOADS_USED_TOKENS, LOADS_RUNNING_REQS, LOADS_WAITING_REQS]

/**
 * One server sampled: its role, its client, and its instance (labels its samples where a batch spans several pairs).
 */
export interface SampledServer {
  service: 'prefill' | 'decode'
  client: SglangClient
  instance?: string
}

/** One pair's two servers, unlabelled (a batch on one pair). */
export const pairServers = (c: {prefill: SglangClient; decode: SglangClient}): SampledServer[] => [
  {service: 'prefill', client: c.prefill},
  {service: 'decode', client: c.decode},
]

export async function sampleOnce(rec: Recorder, servers: SampledServer[]): Promise<void> {
  await Promise.all(
    servers.map(async ({service, client: c, instance}) => {
      const [m, l] = await Promise.all([
        c.metrics().catch(() => undefined),
        requestText({
          service,
          url: joinUrl(c.baseUrl, '/v1/loads?include=disagg&format=prometheus'),
          timeoutMs: c.timeoutMs,
        })
          .then(r => (r.status === 200 ? parsePromText(r.text, {source: `${service} /v1/loads`}) : undefined))
          .catch(() => undefined),
      ])
      const t = now()
      const of = instance === undefined ? {} : {instance}
      for (const name of SAMPLED_METRICS) {
        const series = m?.samples.filter(s => s.name === name) ?? []
        if (series.length > 0)
          rec.add({kind: 'metric', t, service, name, value: series.reduce((a, s) => a + s.value, 0), ...of})
      }
      for (const name of LOADS) {
        const series = l?.samples.filter(s => s.name === name) ?? []
        if (series.length > 0)
          rec.add({kind: 'metric', t, service, name, value: series.reduce((a, s) => a + s.value, 0), ...of})
      }
    }),
  )
}

/** Sample every intervalMs until stopped; bounded by maxSamples so a forgotten sampler cannot run forever. */
export function startSampler(
  rec: Recorder,
  servers: SampledServer[],
  intervalMs = 1000,
  maxSamples = 10_000,
): {stop: () => Promise<void>} {
  // stop() aborts the sleep between samples, so stopping never waits out an interval.
  const stopping = new AbortController()
  let n = 0
  const loop = (async () => {
    while (!stopping.signal.aborted && n++ < maxSamples) {
      await sampleOnce(rec, servers)
      if (stopping.signal.aborted) break
      await sleep(intervalMs, stopping.signal)
    }
  })()
  return {
    stop: async () => {
      stopping.abort()
      await loop
    },
  }
}
