/**
 * The server's Prometheus exposition, with SGLang's names and labels (reference §6), rendered as
 * prometheus_client does (floats with `.0`, counters with `_total`). Gauges hold what was last *written*;
 * callers decide when to write them (per batch, or from the idle hook), which is what makes them stale.
 */
export const GAUGES = [
  ['sglang:num_prefill_bootstrap_queue_reqs', 'The number of requests in the prefill bootstrap queue.'],
  ['sglang:num_prefill_inflight_queue_reqs', 'The number of requests in the prefill inflight queue.'],
  ['sglang:num_decode_prealloc_queue_reqs', 'The number of requests in the decode prealloc queue.'],
  ['sglang:num_decode_transfer_queue_reqs', 'The number of requests in the decode transfer queue.'],
  ['sglang:num_running_reqs', 'The number of running requests.'],
  ['sglang:num_queue_reqs', 'The number of requests in the waiting queue.'],
  ['sglang:token_usage', 'The token usage.'],
] as const
export type GaugeName = (typeof GAUGES)[number][0]

export const COUNTERS = [
  ['sglang:num_bootstrap_failed_reqs_total', 'Number of bootstrap failed requests.'],
  ['sglang:num_transfer_failed_reqs_total', 'Number of transfer failed requests.'],
  ['sglang:num_aborted_requests_total', 'Number of requests aborted.'],
  ['sglang:num_watchdog_evicted_reqs_total', 'Number of requests evicted by the disaggregation watchdog.'],
] as const
export type CounterName = (typeof COUNTERS)[number][0]

const LATENCY = 'sglang:kv_transfer_latency_ms'
const BUCKETS = [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000]

export class Metrics {
  private readonly gauges = new Map<GaugeName, number>()
  private readonly counters = new Map<CounterName, number>()
  private readonly bucketCounts = BUCKETS.map(() => 0)
  private histCount = 0
  private histSum = 0
  private readonly labels: string

  /** hidden: counters this server does not export (a deployment whose watchdog counts nothing). */
  constructor(
    engineType: 'prefill' | 'decode',
    modelName: string,
    private readonly hidden: ReadonlySet<string> = new Set(),
  ) {
    this.labels = `engine_type="${engineType}",model_name="${esc(modelName)}",moe_ep_rank="0",pp_rank="0",tp_rank="0"`
    for (const [g] of GAUGES) this.gauges.set(g, 0)
    for (const [c] of COUNTERS) this.counters.set(c, 0)
  }

  setGauge(name: GaugeName, value: number): void {
    this.gauges.set(name, value)
  }
  inc(name: CounterName, by = 1): void {
    this.counters.set(name, (this.counters.get(name) ?? 0) + by)
  }
  counter(name: CounterName): number {
    return this.counters.get(name) ?? 0
  }

  observeLatency(ms: number): void {
    this.histCount++
    this.histSum += ms
    BUCKETS.forEach((b, i) => {
      if (ms <= b) this.bucketCounts[i]!++
    })
  }

  render(): string {
    const out: string[] = []
    const L = this.labels
    for (const [name, help] of GAUGES) {
      out.push(`# HELP ${name} ${help}`, `# TYPE ${name} gauge`, `${name}{${L}} ${fmt(this.gauges.get(name) ?? 0)}`)
    }
    for (const [name, help] of COUNTERS) {
      if (this.hidden.has(name)) continue
      out.push(`# HELP ${name} ${help}`, `# TYPE ${name} counter`, `${name}{${L}} ${fmt(this.counters.get(name) ?? 0)}`)
    }
    out.push(`# HELP ${LATENCY} The transfer latency of the KV cache in ms.`, `# TYPE ${LATENCY} histogram`)
    BUCKETS.forEach((b, i) => {
      out.push(`${LATENCY}_bucket{${L},le="${fmt(b)}"} ${fmt(this.bucketCounts[i]!)}`)
    })
    out.push(`${LATENCY}_bucket{${L},le="+Inf"} ${fmt(this.histCount)}`)
    out.push(`${LATENCY}_count{${L}} ${fmt(this.histCount)}`, `${LATENCY}_sum{${L}} ${fmt(this.histSum)}`)
    return out.join('\n') + '\n'
  }
}

function fmt(v: number): string {
  return Number.isInteger(v) ? `${v}.0` : String(v)
}

function esc(s: string): string {
  return s.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n')
}
