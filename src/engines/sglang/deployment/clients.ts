import type {Deployment} from '../../../deployment/config.js'
import {RouterClient} from './router-client.js'
import {DEFAULT_PROBE_TIMEOUT_MS, SglangClient} from './sglang-client.js'

export {DEFAULT_PROBE_TIMEOUT_MS}

/** The three services of a PD deployment, each with its own client. */
export interface ServiceClients {
  prefill: SglangClient
  decode: SglangClient
  router: RouterClient
}

/**
 * The one place the prefill, decode and router clients are built from the deployment file: service names for messages,
 * the router's Prometheus endpoint, and one probe deadline for all three (default DEFAULT_PROBE_TIMEOUT_MS).
 */
export function serviceClients(
  deployment: Pick<Deployment, 'services'>,
  opts: {timeoutMs?: number; signal?: AbortSignal} = {},
): ServiceClients {
  const svc = deployment.services
  const timeoutMs = opts.timeoutMs ?? DEFAULT_PROBE_TIMEOUT_MS
  const stop = opts.signal ? {signal: opts.signal} : {}
  return {
    prefill: new SglangClient(svc.prefill.url, {service: 'prefill', timeoutMs, ...stop}),
    decode: new SglangClient(svc.decode.url, {service: 'decode', timeoutMs, ...stop}),
    router: new RouterClient(svc.router.url, {
      service: 'router',
      timeoutMs,
      metricsUrl: svc.router.metricsUrl,
      ...stop,
    }),
  }
}
