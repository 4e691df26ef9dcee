import {DEFAULT_PROBE_TIMEOUT_MS, serviceClients} from '../engines/sglang/deployment/clients.js'
import type {Deployment} from '../deployment/config.js'
import {ROUTER_CB_STATE} from '../engines/sglang/sglang-metrics.js'
import type {RouterClient} from '../engines/sglang/deployment/router-client.js'
import type {SglangClient} from '../engines/sglang/deployment/sglang-client.js'
import {discover} from '../engines/sglang/discovery/discover.js'
import {discoverAcrossHosts} from '../engines/sglang/discovery/discover-hosts.js'
import {faultDiscovery, type FaultDiscovery} from '../faults/fault.js'
import type {Host} from '../hosts/host.js'
import {describeLags} from '../model/lags.js'
import type {Calibration} from '../model/timeline.js'
import {abortable} from '../util/stop.js'
import {sleep} from '../util/time.js'
import {calibrate, type LagProbeShape} from './calibrate.js'
import {Placement} from './placement.js'

/** Deadline of every probe the runner makes (discovery, host probes, fault commands, aborts). */
export const PROBE_TIMEOUT_MS = DEFAULT_PROBE_TIMEOUT_MS

export type Calibrated = Calibration & {routerMs: number}

/**
 * What a run learns once and keeps while the deployment has not changed: the clients, the calibration and what
 * discovery saw. Batches share it; a co-restart replaces the processes it describes, so it forgets them then.
 */
export class RunSession {
  readonly prefill: SglangClient
  readonly decode: SglangClient
  readonly router: RouterClient
  /** Where each service runs: one host, or several (each fault acts on the host that owns what it targets). */
  readonly placement: Placement
  private calibrated?: Calibrated
  private discovered?: FaultDiscovery

  constructor(
    readonly deployment: Deployment,
    on: Host | Placement,
  ) {
    ;({
      prefill: this.prefill,
      decode: this.decode,
      router: this.router,
    } = serviceClients(deployment, {timeoutMs: PROBE_TIMEOUT_MS}))
    this.placement = on instanceof Placement ? on : Placement.single(deployment, on)
  }

  /** The router's host (the only one, on a deployment on one host). */
  get host(): Host {
    return this.placement.of('router').host
  }

  /** Prefill's bootstrap server, as the gateway injects it into both /generate bodies. */
  get bootstrap(): {host: string; port: number} {
    return {
      host: new URL(this.deployment.services.prefill.url).hostname,
      port: this.deployment.services.prefill.bootstrapPort,
    }
  }

  /** Unfaulted requests, measured once per run (and again after a restart): they calibrate ε and open what a fresh
   * deployment opens lazily (decode's route cache, the KV data connections a fault on them must find). */
  async calibration(opts: {
    promptTokens: number
    requests?: number
    lagProbes?: LagProbeShape
    say?: (l: string) => void
    signal?: AbortSignal
  }): Promise<Calibrated> {
    if (!this.calibrated) {
      // A breaker an earlier fault opened refuses healthy requests for a while: wait for it (bounded), not fail.
      await untilBreakersClose(this.router, {
        onOpen: () => opts.say?.("the router's circuit breaker is open: waiting for it to close before calibrating"),
      })
      opts.say?.('calibrating on unfaulted requests')
      this.calibrated = await calibrate(this.deployment, this, {
        promptTokens: opts.promptTokens,
        ...(opts.requests ? {requests: opts.requests} : {}),
        ...(opts.lagProbes ? {lagProbes: opts.lagProbes} : {}),
        ...(opts.signal ? {signal: opts.signal} : {}),
      })
      const lags = this.calibrated.lags
      if (lags)
        opts.say?.(`measured lags: ${describeLags(lags)}${lags.notes.length ? ` (${lags.notes.join('; ')})` : ''}`)
    }
    return this.calibrated
  }

  /** Discovery, once per run while the processes stay the same. After calibration: a fresh deployment publishes its
   * ranks' ZMQ ports on the bootstrap route only once it has served a request. */
  async discovery(say?: (l: string) => void, signal?: AbortSignal): Promise<FaultDiscovery> {
    if (!this.discovered) {
      say?.('discovering the deployment')
      // Each of discovery's host commands has its deadline; the run's stop ends the wait at once (exit 3).
      const o = {timeoutMs: PROBE_TIMEOUT_MS, ...(signal ? {signal} : {})}
      const report = await abortable(
        this.placement.spansHosts
          ? discoverAcrossHosts(this.placement.hosts, o)
          : discover(this.deployment, this.host, o),
        signal,
        'discovery',
      )
      this.discovered = faultDiscovery(report, this.deployment)
    }
    return this.discovered
  }

  /** The processes were replaced (a restart): measure and discover again before the next batch. */
  forget(): void {
    this.calibrated = undefined
    this.discovered = undefined
  }
}

/** How long the gateway's breaker may stay open after a fault: its default open duration (60 s) and a margin. */
export const BREAKER_WAIT_MS = 90_000

/**
 * Wait, at most BREAKER_WAIT_MS, until the gateway reports no open breaker (half-open counts as closing). Returns the
 * workers found open at first (empty: nothing to wait for) and whether they closed in time. Only a read of the
 * gateway's metrics can say a breaker closed: a scrape that fails (a loaded gateway answers late) proves nothing, so
 * the wait goes on; canaries sent at an open breaker get the gateway's 503 and would fail a healthy deployment.
 */
export async function untilBreakersClose(
  router: RouterClient,
  o: {signal?: AbortSignal; onOpen?: (open: string[]) => void} = {},
): Promise<{open: string[]; closed: boolean}> {
  let open = await openBreakers(router)
  // A failed first scrape is read again (twice, a second apart) before the gateway counts as one without metrics.
  for (let tries = 1; open === undefined && tries < 3 && !o.signal?.aborted; tries++) {
    await sleep(1000, o.signal)
    open = await openBreakers(router)
  }
  if (open === undefined || open.length === 0) return {open: [], closed: true}
  o.onOpen?.(open)
  const by = Date.now() + BREAKER_WAIT_MS
  while (Date.now() < by && !o.signal?.aborted) {
    await sleep(1000, o.signal)
    if ((await openBreakers(router))?.length === 0) return {open, closed: true}
  }
  return {open, closed: false}
}

/**
 * Workers whose circuit breaker the gateway reports open (smg_worker_cb_state 1); empty where it exports none;
 * undefined when its metrics could not be read (nothing known: a gateway without metrics is not waited for).
 */
export async function openBreakers(router: RouterClient): Promise<string[] | undefined> {
  const m = await router.metrics().catch(() => undefined)
  if (m === undefined) return undefined
  return m.samples.filter(s => s.name === ROUTER_CB_STATE && s.value === 1).map(s => s.labels.worker ?? 'a worker')
}
