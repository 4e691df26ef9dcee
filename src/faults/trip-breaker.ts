import {isIP} from 'node:net'

import {z} from 'zod'

import type {BreakerExpectation} from '../checks/expectation.js'
import {GATEWAY_DEFAULTS, worstBackoffMs} from '../engines/sglang/discovery/router-settings.js'
import {badInput} from '../errors.js'
import type {Host} from '../hosts/host.js'
import {checkLeaseId, type Fault, type FaultContext, type FaultPlan, type HostFacts} from './fault.js'
import {buildFilter, detectFilterTool, noFilterTool} from './mechanisms/packet-filter.js'
import {buildTwinFailpoint} from './mechanisms/twin-failpoint.js'

/**
 * trip-breaker: the gateway's circuit breaker of the prefill worker, opened the way a real outage opens it. Prefill's
 * HTTP port refuses the gateway's connections (a packet filter: TCP reset, from the gateway's address only), so every
 * attempt fails at once with a 502 and counts against prefill's breaker (sgl-model-gateway
 * src/routers/http/pd_router/dispatch.rs: a failed prefill ticks prefill alone and drops decode). With the breaker
 * open, selection must refuse the request with a 503 before any worker is picked (pd_router/selection.rs
 * pick_worker_by_policy_arc; core/worker.rs is_available), never send decode its half alone (SGLang #31206), and the
 * breaker must turn half-open after its open duration and close on successes (core/circuit_breaker.rs).
 */

const Params = z
  .object({
    role: z
      .enum(['prefill'])
      .default('prefill')
      .describe("trip-breaker: whose breaker to open (prefill: decode's half must never be sent alone)."),
    mechanism: z
      .enum(['auto', 'packet-filter', 'twin-failpoint'])
      .default('auto')
      .describe(
        "trip-breaker: auto uses the host's packet filter, or the twin's own failure point where none is usable " +
          '(twin only).',
      ),
    probes: z.number().int().min(1).max(20).default(3).describe('trip-breaker: requests sent at the open breaker.'),
  })
  .strict()

export type TripBreakerParams = z.infer<typeof Params>

const LOOPBACK = /^(localhost|127\.\d+\.\d+\.\d+|::1|\[::1\])$/

/** The address the gateway's connections to prefill come from, or why it cannot be told. */
type Gateway = NonNullable<FaultContext<TripBreakerParams>['discovery']['gateway']>

function routerSource(gateway: Gateway): {addr: string; why: string} {
  const prefill = new URL(gateway.prefillUrl).hostname.replace(/^\[|\]$/g, '')
  const router = new URL(gateway.routerUrl).hostname.replace(/^\[|\]$/g, '')
  // A connection to a local address leaves from that address: a gateway on prefill's host dials prefill's URL.
  if (LOOPBACK.test(prefill)) {
    const addr = prefill.includes(':') ? '::1' : '127.0.0.1'
    return {addr, why: `prefill's URL is on loopback (${prefill}): the gateway connects from it`}
  }
  if (isIP(router) && router !== '0.0.0.0' && router !== '::') {
    const why =
      router === prefill ? `gateway and prefill share the address ${router}` : `the gateway's URL address ${router}`
    return {addr: router, why}
  }
  throw badInput(
    `cannot tell which address the gateway connects to prefill from (router URL host ${JSON.stringify(router)})`,
    "write the router's URL with its host's IP address (as prefill sees the gateway connect) in the deployment file",
  )
}

export const tripBreaker: Fault<TripBreakerParams> = {
  name: 'trip-breaker',
  summary: 'prefill refuses the gateway until its circuit breaker opens; requests must then get 503 at once',
  params: Params,
  mechanisms: ['packet-filter', 'twin-failpoint'],
  observe: 'breaker',

  footprint() {
    // An open breaker refuses every request through the gateway: nothing else can be judged meanwhile.
    const exclusive = "opens the gateway's circuit breaker: every request through the gateway is refused while open"
    return {exclusive, gpus: [], ports: []}
  },

  async gather(host: Host, _discovery, _params, opts = {}): Promise<HostFacts> {
    const t = await detectFilterTool(host, opts.timeoutMs)
    return {filterTool: t.tool, filterEvidence: t.evidence}
  },

  plan(ctx: FaultContext<TripBreakerParams>): FaultPlan {
    checkLeaseId(ctx.leaseId)
    const {gateway, mech, useTwin} = breakerMechanism(ctx)
    const twinUrl = ctx.discovery.twinFailpointUrl
    const prefill = new URL(gateway.prefillUrl)
    const port = Number(prefill.port || (prefill.protocol === 'https:' ? 443 : 80))
    const from = useTwin
      ? {addr: '*', why: "the twin's failure point resets every /generate connection"}
      : routerSource(gateway)
    const expected = breakerExpectation(ctx, gateway)
    const {tripRequests, refuseWithinMs} = expected
    const filter = useTwin
      ? buildTwinFailpoint(twinUrl!, 'refuse-generate', [0])
      : buildFilter({
          tool: ctx.facts.filterTool!,
          leaseId: ctx.leaseId,
          matches: [{kind: 'to', port, from: from.addr}],
          action: {kind: 'reject'},
        })
    return {
      fault: 'trip-breaker',
      mechanism: useTwin ? 'twin-failpoint' : 'packet-filter',
      leaseId: ctx.leaseId,
      targets: [],
      inject: filter.inject,
      revert: filter.revert,
      sudo: !useTwin,
      verifyInjected: [filter.verifyInjected],
      verifyClean: [filter.verifyClean],
      readOnlyProbes: filter.readOnlyProbes,
      description:
        `refuse (TCP reset) the gateway's connections to prefill's HTTP port ${port} from ${from.addr} ` +
        `(${from.why}); ${filter.summary}. Then ${tripRequests} requests through the gateway open prefill's breaker, ` +
        `${expected.probes} more must each get 503 within ${refuseWithinMs} ms without decode's queue growing, ` +
        'and after ' +
        `the revert the breaker must half-open and close within ${expected.closeWithinSeconds} s.`,
      ...(useTwin && mech === 'auto'
        ? {
            refusals: [
              `packet filter not usable here (${ctx.facts.filterEvidence ?? 'not probed'}): ` +
                "using the twin's own failure point instead",
            ],
          }
        : {}),
      notes: [
        `gateway settings: ${expected.settingsSource}`,
        useTwin
          ? "the twin's failure point, not a host mechanism: it exists only on the twin"
          : `packet filter: ${ctx.facts.filterEvidence ?? ctx.facts.filterTool}`,
        "only the gateway's source address is refused: decode's bootstrap and KV traffic to prefill are untouched; " +
          "the gateway's own health checks of prefill are refused too " +
          '(a slow health interval leaves prefill healthy; ' +
          "the breaker is read from the gateway's metrics)",
      ],
      expected,
    }
  },
}

/** The gateway (with a breaker to trip) and how to refuse it: the host's packet filter or the twin's failure point. */
function breakerMechanism(ctx: FaultContext<TripBreakerParams>): {
  gateway: Gateway
  mech: NonNullable<TripBreakerParams['mechanism']>
  useTwin: boolean
} {
  const gateway = ctx.discovery.gateway
  if (!gateway) throw badInput('discovery found no gateway to trip', 'name the router in the deployment file')
  const cb = gateway.settings?.circuitBreaker
  if (cb && !cb.enabled) {
    throw badInput(
      'the gateway runs with --disable-circuit-breaker: there is no breaker to trip',
      'run the gateway with its circuit breaker, or leave trip-breaker out',
    )
  }
  const twinUrl = ctx.discovery.twinFailpointUrl
  const mech = ctx.params.mechanism ?? 'auto'
  if (mech === 'twin-failpoint' && !twinUrl) {
    throw badInput(
      "--mechanism twin-failpoint works only against pdchaos's twin, and this prefill is not it",
      'use --mechanism packet-filter',
    )
  }
  const useTwin = mech === 'twin-failpoint' || (mech === 'auto' && !ctx.facts.filterTool && twinUrl !== undefined)
  if (!useTwin && !ctx.facts.filterTool) throw noFilterTool(ctx.facts.filterEvidence)
  return {gateway, mech, useTwin}
}

/** What the breaker must do, from the gateway's settings (its defaults where they were not read). */
function breakerExpectation(ctx: FaultContext<TripBreakerParams>, gateway: Gateway): BreakerExpectation {
  const settings = gateway.settings
  const cb = settings?.circuitBreaker
  const failureThreshold = cb?.failureThreshold ?? GATEWAY_DEFAULTS.failureThreshold
  const openSeconds = cb?.openSeconds ?? GATEWAY_DEFAULTS.openSeconds
  const successThreshold = cb?.successThreshold ?? GATEWAY_DEFAULTS.successThreshold
  const retries = settings?.retries ?? {enabled: true, attempts: GATEWAY_DEFAULTS.attempts}
  const attempts = Math.max(1, retries.attempts)
  const backoffMs = worstBackoffMs({...retries, attempts})
  // A refusal is immediate: every attempt fails at selection, so the answer takes the backoffs and a round trip.
  const refuseWithinMs = Math.ceil(backoffMs + 1000)
  const tripRequests = Math.ceil(failureThreshold / attempts) + 2
  return {
    kind: 'breaker',
    role: 'prefill',
    workerUrl: gateway.prefillUrl,
    decodeUrl: gateway.decodeUrl,
    failureThreshold,
    successThreshold,
    openSeconds,
    attempts,
    tripRequests,
    tripTimeoutMs: refuseWithinMs + 5000,
    probes: ctx.params.probes ?? 3,
    refuseWithinMs,
    closeWithinSeconds: openSeconds + 10,
    settingsSource: settings?.source ?? "router settings not read: the gateway's defaults",
    why:
      `${failureThreshold} consecutive failures open a worker's breaker; ${attempts} attempt(s) per request, ` +
      `so ${tripRequests} refused requests open it; open, every attempt is refused at selection ` +
      `(worst backoff ${backoffMs.toFixed(0)} ms in all, + 1 s); ` +
      `it turns half-open when read after ${openSeconds} s and closes after ${successThreshold} successes`,
  }
}
