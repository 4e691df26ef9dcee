import http from 'node:http'

/** sgl-model-gateway's worker health check settings (--health-check-*). */
export interface HealthCheckSettings {
  intervalS: number
  timeoutS: number
  failureThreshold: number
  successThreshold: number
}

export const ROUTER_HEALTH_DEFAULTS: HealthCheckSettings = {
  intervalS: 60,
  timeoutS: 5,
  failureThreshold: 3,
  successThreshold: 2,
}

/** One GET with a deadline; resolves to the status code, or 0 on a transport error or timeout. */
export function probe(url: string, timeoutMs: number, agent?: http.Agent): Promise<number> {
  return new Promise(resolve => {
    const req = http.get(url, {agent, timeout: timeoutMs}, res => {
      res.resume()
      res.on('end', () => resolve(res.statusCode ?? 0))
      res.on('error', () => resolve(0))
    })
    req.on('timeout', () => req.destroy(new Error('timeout')))
    req.on('error', () => resolve(0))
  })
}

/**
 * The router's view of one worker: unhealthy until a first probe passes (the startup wait), then
 * flipped by consecutive failures/successes reaching the thresholds, as the real router does.
 */
export class WorkerHealth {
  healthy = false
  private failures = 0
  private successes = 0
  private timer?: NodeJS.Timeout
  private stopped = false

  constructor(
    readonly url: string,
    private readonly settings: HealthCheckSettings,
    private readonly onChange: (healthy: boolean) => void,
    private readonly path = '/health',
  ) {}

  start(): void {
    void this.startupLoop()
  }

  stop(): void {
    this.stopped = true
    if (this.timer) clearTimeout(this.timer)
  }

  /** Startup: probe every 100 ms until the worker answers (the gateway's startup wait), then the periodic check. */
  private async startupLoop(): Promise<void> {
    while (!this.stopped) {
      const status = await probe(this.url + this.path, Math.min(this.settings.timeoutS * 1000, 2000))
      if (this.stopped) return
      if (status >= 200 && status < 300) {
        this.set(true)
        this.schedule()
        return
      }
      await new Promise(r => {
        this.timer = setTimeout(r, 100)
      })
    }
  }

  private schedule(): void {
    if (this.stopped) return
    this.timer = setTimeout(() => void this.tick(), this.settings.intervalS * 1000)
  }

  private async tick(): Promise<void> {
    const status = await probe(this.url + this.path, this.settings.timeoutS * 1000)
    if (this.stopped) return
    if (status >= 200 && status < 300) {
      this.failures = 0
      this.successes++
      if (!this.healthy && this.successes >= this.settings.successThreshold) this.set(true)
    } else {
      this.successes = 0
      this.failures++
      if (this.healthy && this.failures >= this.settings.failureThreshold) this.set(false)
    }
    this.schedule()
  }

  private set(healthy: boolean): void {
    if (this.healthy === healthy) return
    this.healthy = healthy
    this.onChange(healthy)
  }
}
