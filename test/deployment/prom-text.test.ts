import {Counter, Gauge, Histogram, Registry, Summary} from 'prom-client'
import {describe, expect, it} from 'vitest'

import {PdError} from '../../src/errors.js'
import {escapeLabelValue, histogramSeries, parsePromText, sampleValue, sumOf} from '../../src/deployment/prom-text.js'

/** Deterministic pseudo-random strings that stress the label escapes. */
function* randomStrings(seed: number, count: number): Generator<string> {
  const alphabet = ['a', 'Z', '0', ' ', '"', '\\', '\n', ',', '}', '{', '=', '#', 'é', '\t', 'n', '\\n', '"}', '\u00a0']
  let x = seed
  for (let i = 0; i < count; i++) {
    let s = ''
    const len = i % 17
    for (let j = 0; j < len; j++) {
      x = (x * 1_103_515_245 + 12_345) % 2_147_483_648
      s += alphabet[x % alphabet.length]
    }
    yield s
  }
}

function expectMalformed(text: string, line: number, what: RegExp): void {
  let caught: unknown
  try {
    parsePromText(text, {source: 'prefill at http://127.0.0.1:1/metrics'})
  } catch (error) {
    caught = error
  }
  expect(caught).toBeInstanceOf(PdError)
  const e = caught as PdError
  expect(e.exitCode).toBe(5)
  expect(e.message).toContain(`at line ${line}`)
  expect(e.message).toContain('prefill at http://127.0.0.1:1/metrics')
  expect(e.message).toMatch(what)
  expect(e.message).not.toContain('\n')
}

describe('parsePromText', () => {
  it('reads SGLang-style names, labels, NaN and ±Inf, and text-format ms timestamps', () => {
    const page = [
      '# HELP sglang:num_prefill_inflight_queue_reqs The number of requests in the prefill inflight queue.',
      '# TYPE sglang:num_prefill_inflight_queue_reqs gauge',
      'sglang:num_prefill_inflight_queue_reqs{engine_type="prefill",model_name="M",moe_ep_rank="0",pp_rank="0",tp_rank="0"} 3.0',
      'sglang:num_prefill_inflight_queue_reqs{engine_type="prefill",model_name="M",moe_ep_rank="0",pp_rank="0",tp_rank="1"} 2.0 1700000000123',
      '# TYPE vllm:odd gauge',
      'vllm:odd{k="nan"} NaN',
      'vllm:odd{k="pinf"} +Inf',
      'vllm:odd{k="ninf"} -Inf',
      'vllm:odd{k="exp"} 1.5e+06',
      'untyped_metric 7',
      '',
    ].join('\n')
    const {samples, families, format} = parsePromText(page)
    expect(format).toBe('text')
    expect(samples).toHaveLength(7)
    expect(sampleValue(samples, 'sglang:num_prefill_inflight_queue_reqs', {tp_rank: '0'})).toBe(3)
    expect(sumOf(samples, 'sglang:num_prefill_inflight_queue_reqs', {engine_type: 'prefill'})).toBe(5)
    expect(samples[1].timestamp).toBe(1_700_000_000_123)
    expect(samples[0].timestamp).toBeUndefined()
    expect(Number.isNaN(sampleValue(samples, 'vllm:odd', {k: 'nan'}))).toBe(true)
    expect(sampleValue(samples, 'vllm:odd', {k: 'pinf'})).toBe(Number.POSITIVE_INFINITY)
    expect(sampleValue(samples, 'vllm:odd', {k: 'ninf'})).toBe(Number.NEGATIVE_INFINITY)
    expect(sampleValue(samples, 'vllm:odd', {k: 'exp'})).toBe(1_500_000)
    expect(sampleValue(samples, 'vllm:odd', {k: 'absent'})).toBeUndefined()
    expect(sumOf(samples, 'nothing_here')).toBe(0)
    const inflight = families.find(f => f.name === 'sglang:num_prefill_inflight_queue_reqs')
    expect(inflight).toEqual({
      name: 'sglang:num_prefill_inflight_queue_reqs',
      type: 'gauge',
      help: 'The number of requests in the prefill inflight queue.',
    })
    expect(families.find(f => f.name === 'untyped_metric')?.type).toBe('untyped')
  })

  it('round-trips label values with backslashes, quotes and newlines (200 generated values)', () => {
    const values = [...randomStrings(42, 200)]
    const page = values.map((v, i) => `m{i="${i}",v="${escapeLabelValue(v)}",z="end"} ${i}`).join('\n')
    const {samples} = parsePromText(page)
    expect(samples).toHaveLength(values.length)
    for (const [i, v] of values.entries()) {
      expect(samples[i].labels).toEqual({i: String(i), v, z: 'end'})
      expect(samples[i].value).toBe(i)
    }
  })

  it('keeps histogram and summary series apart per label set', () => {
    const page = [
      '# HELP sglang:kv_transfer_latency_ms KV transfer latency',
      '# TYPE sglang:kv_transfer_latency_ms histogram',
      'sglang:kv_transfer_latency_ms_bucket{model_name="A",tp_rank="0",le="1.0"} 1',
      'sglang:kv_transfer_latency_ms_bucket{model_name="A",tp_rank="0",le="+Inf"} 4',
      'sglang:kv_transfer_latency_ms_bucket{model_name="A",tp_rank="0",le="10.0"} 3',
      'sglang:kv_transfer_latency_ms_count{model_name="A",tp_rank="0"} 4',
      'sglang:kv_transfer_latency_ms_sum{model_name="A",tp_rank="0"} 42.5',
      'sglang:kv_transfer_latency_ms_bucket{model_name="B",tp_rank="0",le="1.0"} 0',
      'sglang:kv_transfer_latency_ms_bucket{model_name="B",tp_rank="0",le="10.0"} 2',
      'sglang:kv_transfer_latency_ms_bucket{model_name="B",tp_rank="0",le="+Inf"} 2',
      'sglang:kv_transfer_latency_ms_count{model_name="B",tp_rank="0"} 2',
      'sglang:kv_transfer_latency_ms_sum{model_name="B",tp_rank="0"} 9',
      '# TYPE rpc summary',
      'rpc{svc="x",quantile="0.5"} 0.1',
      'rpc{svc="x",quantile="0.99"} 0.7',
      'rpc_sum{svc="x"} 12',
      'rpc_count{svc="x"} 40',
    ].join('\n')
    const {samples, families} = parsePromText(page)
    expect(samples.filter(s => s.family === 'sglang:kv_transfer_latency_ms')).toHaveLength(10)
    expect(samples.filter(s => s.family === 'rpc')).toHaveLength(4)
    expect(families.map(f => f.name).sort()).toEqual(['rpc', 'sglang:kv_transfer_latency_ms'])
    const series = histogramSeries(samples, 'sglang:kv_transfer_latency_ms')
    expect(series).toHaveLength(2)
    const a = series.find(s => s.labels.model_name === 'A')!
    expect(a.labels).toEqual({model_name: 'A', tp_rank: '0'})
    expect(a.buckets).toEqual([
      {le: 1, count: 1},
      {le: 10, count: 3},
      {le: Number.POSITIVE_INFINITY, count: 4},
    ])
    expect(a.count).toBe(4)
    expect(a.sum).toBe(42.5)
    expect(histogramSeries(samples, 'sglang:kv_transfer_latency_ms', {model_name: 'B'})[0].sum).toBe(9)
    expect(sumOf(samples, 'sglang:kv_transfer_latency_ms_count')).toBe(6)
    expect(sampleValue(samples, 'rpc', {quantile: '0.99'})).toBe(0.7)
  })

  it('reads OpenMetrics: # EOF, seconds timestamps, exemplars dropped, _total/_created, UNIT', () => {
    const page = [
      '# TYPE sglang:num_aborted_requests counter',
      '# UNIT sglang:num_aborted_requests requests',
      '# HELP sglang:num_aborted_requests Aborted \\"requests\\"\\nsecond line',
      'sglang:num_aborted_requests_total{model_name="M"} 3.0 1700000000.5 # {trace_id="a # b"} 1.0 1700000000.1',
      'sglang:num_aborted_requests_created{model_name="M"} 1.69e+09',
      '# TYPE h histogram',
      'h_bucket{le="0.5"} 1 # {trace_id="x"} 0.3',
      'h_bucket{le="+Inf"} 2',
      'h_count 2',
      'h_sum 0.9',
      'h_created 1.69e+09',
      '# EOF',
      '',
    ].join('\n')
    const {samples, families, format} = parsePromText(page)
    expect(format).toBe('openmetrics')
    expect(samples).toHaveLength(7)
    expect(samples[0]).toEqual({
      name: 'sglang:num_aborted_requests_total',
      labels: {model_name: 'M'},
      value: 3,
      timestamp: 1_700_000_000_500,
      family: 'sglang:num_aborted_requests',
    })
    expect(samples[1].family).toBe('sglang:num_aborted_requests')
    expect(samples.filter(s => s.family === 'h')).toHaveLength(5)
    expect(families.find(f => f.name === 'sglang:num_aborted_requests')).toEqual({
      name: 'sglang:num_aborted_requests',
      type: 'counter',
      unit: 'requests',
      help: 'Aborted "requests"\nsecond line',
    })
  })

  it("groups prometheus_client's text-format <name>_created with its <name>_total counter", () => {
    const page = [
      '# HELP sglang:num_transfer_failed_reqs_total failed transfers',
      '# TYPE sglang:num_transfer_failed_reqs_total counter',
      'sglang:num_transfer_failed_reqs_total{tp_rank="0"} 2.0',
      'sglang:num_transfer_failed_reqs_created{tp_rank="0"} 1.7e+09',
    ].join('\n')
    const {samples} = parsePromText(page)
    expect(samples.map(s => s.family)).toEqual([
      'sglang:num_transfer_failed_reqs_total',
      'sglang:num_transfer_failed_reqs_total',
    ])
  })

  it('parses a real page from prom-client, in both the text format and OpenMetrics', async () => {
    for (const contentType of [Registry.PROMETHEUS_CONTENT_TYPE, Registry.OPENMETRICS_CONTENT_TYPE] as const) {
      const registry = new Registry<typeof contentType>()
      registry.setContentType(contentType)
      const counter = new Counter({
        name: 'smg_router_requests_total',
        help: 'Requests',
        labelNames: ['route', 'note'],
        registers: [registry],
      })
      const gauge = new Gauge({
        name: 'sglang:num_running_reqs',
        help: 'Running "reqs"\\ here',
        labelNames: ['model_name'],
        registers: [registry],
      })
      const hist = new Histogram({
        name: 'sglang:kv_transfer_latency_ms',
        help: 'latency',
        labelNames: ['model_name'],
        buckets: [1, 10, 100],
        registers: [registry],
      })
      const summary = new Summary({
        name: 'rpc_seconds',
        help: 'rpc',
        labelNames: ['svc'],
        percentiles: [0.5, 0.9],
        registers: [registry],
      })
      counter.inc({route: '/generate', note: 'a "quoted"\\path\nnext'}, 3)
      counter.inc({route: '/health', note: ''}, 1)
      gauge.set({model_name: 'meta/Llama'}, Number.NaN) // prom-client writes "Nan"
      hist.observe({model_name: 'A'}, 5)
      hist.observe({model_name: 'A'}, 500)
      hist.observe({model_name: 'B'}, 0.5)
      summary.observe({svc: 'x'}, 0.25)
      const page = await registry.metrics()
      const openMetrics = contentType === Registry.OPENMETRICS_CONTENT_TYPE
      const {samples, families, format} = parsePromText(page, {openMetrics})
      expect(format).toBe(openMetrics ? 'openmetrics' : 'text')
      expect(sampleValue(samples, 'smg_router_requests_total', {note: 'a "quoted"\\path\nnext'})).toBe(3)
      expect(sumOf(samples, 'smg_router_requests_total')).toBe(4)
      expect(Number.isNaN(sampleValue(samples, 'sglang:num_running_reqs', {model_name: 'meta/Llama'}))).toBe(true)
      const series = histogramSeries(samples, 'sglang:kv_transfer_latency_ms')
      expect(series.map(s => s.labels.model_name).sort()).toEqual(['A', 'B'])
      const a = series.find(s => s.labels.model_name === 'A')!
      expect(a.buckets).toEqual([
        {le: 1, count: 0},
        {le: 10, count: 1},
        {le: 100, count: 1},
        {le: Number.POSITIVE_INFINITY, count: 2},
      ])
      expect(a.count).toBe(2)
      expect(a.sum).toBe(505)
      expect(sampleValue(samples, 'rpc_seconds_count', {svc: 'x'})).toBe(1)
      expect(families.find(f => f.name === 'sglang:kv_transfer_latency_ms')?.type).toBe('histogram')
      expect(families.find(f => f.name === 'rpc_seconds')?.type).toBe('summary')
      const counterFamily = openMetrics ? 'smg_router_requests' : 'smg_router_requests_total'
      expect(families.find(f => f.name === counterFamily)?.type).toBe('counter')
      expect(samples.find(s => s.name === 'smg_router_requests_total')?.family).toBe(counterFamily)
    }
  })

  it('rejects malformed pages with a one-line exit-5 error naming the line', () => {
    expectMalformed('ok 1\nbad-name 1', 2, /expected a metric name|unexpected "-"/)
    expectMalformed('ok 1\n\nm{a="b" 1', 3, /expected "," or "}"/)
    expectMalformed('m{a="b\\x"} 1', 1, /invalid escape/)
    expectMalformed('m{a="unterminated} 1', 1, /unterminated value of label a/)
    expectMalformed('m{a="1",a="2"} 1', 1, /label a appears twice/)
    expectMalformed('m{1a="x"} 1', 1, /invalid label name/)
    expectMalformed('m', 1, /missing value/)
    expectMalformed('m abc', 1, /invalid value "abc"/)
    expectMalformed('m 0x10', 1, /invalid value/)
    expectMalformed('m 1 2 3', 1, /unexpected "3"/)
    expectMalformed('m 1 1.5', 1, /invalid timestamp/)
    expectMalformed('# TYPE m bogus\nm 1', 1, /unknown metric type "bogus"/)
    expectMalformed('# TYPE m gauge\n# TYPE m counter', 2, /second TYPE/)
    expectMalformed('m 1\n# EOF\nn 2', 3, /content after "# EOF"/)
    expectMalformed('<html><body>502 Bad Gateway</body></html>', 1, /expected a metric name/)
  })

  it('accepts the lenient corners of the text format', () => {
    const {samples} = parsePromText(
      '# a plain comment\r\nm{a="x",} 1\r\nm{} 2\nm{ a = "y" } 3\n\n\tcontinued 4'.replace('\tcontinued 4', 'n\t5'),
    )
    expect(samples.map(s => [s.name, s.labels, s.value])).toEqual([
      ['m', {a: 'x'}, 1],
      ['m', {}, 2],
      ['m', {a: 'y'}, 3],
      ['n', {}, 5],
    ])
    // A label named __proto__ stays a label.
    expect(parsePromText('m{__proto__="x"} 1').samples[0].labels).toEqual(JSON.parse('{"__proto__":"x"}'))
  })
})
