import {joinUrl} from '../../../deployment/http.js'
import type {ParsedMetrics} from '../../../deployment/prom-text.js'
import {
  type ClientOptions,
  DEFAULT_PROBE_TIMEOUT_MS,
  fetchMetrics,
  type GenerateRequest,
  type GenerateResult,
  type HealthResult,
  postGenerate,
  SglangClient,
} from './sglang-client.js'

/**
 * HTTP client of the PD router (sgl-model-gateway / sglang_router). It has no abort route: abort a routed request
 * on the prefill and decode servers by the rid pdchaos put in its /generate (the router forwards it).
 */
export class RouterClient {
  readonly service: string
  readonly timeoutMs: number
  readonly generateTimeoutMs: number
  /** The router's Prometheus endpoint (--prometheus-port), or /metrics on its HTTP port. */
  readonly metricsUrl: string
  /** Health probes share SglangClient's probe (same semantics, router paths). */
  private readonly probe: SglangClient

  constructor(
    readonly baseUrl: string,
    opts: ClientOptions & {metricsUrl?: string} = {},
  ) {
    this.service = opts.service ?? 'router'
    this.timeoutMs = opts.timeoutMs ?? DEFAULT_PROBE_TIMEOUT_MS
    this.generateTimeoutMs = opts.generateTimeoutMs ?? 600_000
    this.metricsUrl = opts.metricsUrl
      ? new URL(opts.metricsUrl).pathname === '/'
        ? joinUrl(opts.metricsUrl, '/metrics')
        : opts.metricsUrl
      : joinUrl(baseUrl, '/metrics')
    this.probe = new SglangClient(baseUrl, {
      service: this.service,
      timeoutMs: this.timeoutMs,
      ...(opts.signal ? {signal: opts.signal} : {}),
    })
    this.signal = opts.signal
  }

  private readonly signal?: AbortSignal

  /** POST /generate through the router with pdchaos's own rid; the router adds the bootstrap host, port and room. */
  generate(
    req: Omit<GenerateRequest, 'bootstrap_host' | 'bootstrap_port' | 'bootstrap_room'>,
    opts: {timeoutMs?: number; signal?: AbortSignal} = {},
  ): Promise<GenerateResult> {
    return postGenerate(this.service, this.baseUrl, req, opts.timeoutMs ?? this.generateTimeoutMs, opts.signal)
  }

  health(path = '/health'): Promise<HealthResult> {
    return this.probe.health(path)
  }

  /** /readiness: 200 once a prefill-decode pair is healthy. */
  readiness(path = '/readiness'): Promise<HealthResult> {
    return this.probe.health(path)
  }

  liveness(): Promise<HealthResult> {
    return this.probe.health('/liveness')
  }

  ensureHealthy(path = '/health'): Promise<HealthResult> {
    return this.probe.ensureHealthy(path)
  }

  metrics(): Promise<ParsedMetrics> {
    return fetchMetrics(this.service, this.metricsUrl, this.timeoutMs, this.signal)
  }
}
