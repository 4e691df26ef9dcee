import {DEFAULT_PROBE_TIMEOUT_MS} from '../engines/sglang/deployment/clients.js'
import type {Deployment} from '../deployment/config.js'
import {httpRequest, joinUrl} from '../deployment/http.js'
import {PdError, unreachable} from '../errors.js'
import {stoppedError} from '../util/stop.js'

/**
 * Before a run reaches for anything else: each service must answer its health path (any HTTP status) within the
 * deployment's probeTimeoutSeconds. A service that refuses, or accepts and never answers, is exit 5 naming it, in
 * seconds, instead of a calibration request that waits 30 s or a discovery that finds no ranks and blames the input.
 * A suite whose scenarios act on several instance pairs checks the services of each (`more`: the other pairs' views,
 * each service probed once), so a pair that is down is exit 5 before the run, not one scenario's error in it.
 */
export async function preflight(
  deployment: Deployment,
  more: Deployment[] = [],
  timeoutMs = (deployment.probeTimeoutSeconds ?? DEFAULT_PROBE_TIMEOUT_MS / 1000) * 1000,
  signal?: AbortSignal,
): Promise<void> {
  const seen = new Set<string>()
  const services = [deployment, ...more]
    .flatMap(
      d =>
        [
          ['prefill', d.services.prefill],
          ['decode', d.services.decode],
          ['router', d.services.router],
        ] as const,
    )
    .filter(([, svc]) => !seen.has(svc.url) && seen.add(svc.url))
  const probes = services.map(async ([role, svc]) => {
    // Where pairs differ, a service is named by its URL too (prefill at http://…): the role alone would not say which.
    const service = more.length > 0 ? `${role} at ${svc.url}` : role
    try {
      // The run's stop ends every probe at once (exit 3), not at the probe's deadline.
      await httpRequest({service, url: joinUrl(svc.url, svc.healthPath), timeoutMs, ...(signal ? {signal} : {})})
      return undefined
    } catch (error) {
      if (!(error instanceof PdError)) throw error
      if (signal?.aborted) throw stoppedError(signal, 'the health check')
      return error
    }
  })
  const failed = (await Promise.all(probes)).filter((e): e is PdError => e !== undefined)
  if (failed.length === 0) return
  const first = failed[0]!
  const others =
    failed.length > 1
      ? ` (and ${failed.length - 1} more: ${failed
          .slice(1)
          .map(e => e.message)
          .join('; ')})`
      : ''
  throw unreachable(
    `${first.message}${others}`,
    `is it up? \`pdchaos status\` shows every service; a slow one may need a longer probeTimeoutSeconds in the ` +
      `deployment file (now ${timeoutMs / 1000} s)`,
    first,
  )
}
