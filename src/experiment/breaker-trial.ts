import type {BreakerExpectation} from '../checks/expectation.js'
import type {RouterClient} from '../engines/sglang/deployment/router-client.js'
import {ROUTER_CB_STATE} from '../engines/sglang/sglang-metrics.js'
import type {Observation} from '../model/timeline.js'
import {sleep} from '../util/time.js'
import {now, type Recorder} from '../workload/recorder.js'
import {sampleOnce, type SampledServer} from '../workload/sampler.js'
import {sendRequest} from '../workload/send.js'
import type {RunSession} from './session.js'

/**
 * What the runner records for a fault with `observe: 'breaker'` (observe-breaker.ts): requests through the gateway
 * until the prefill worker's breaker reads open (role `trip`), then requests at the open breaker (role `probe`) while
 * decode's fresh queue snapshot (/v1/loads) is sampled; after the revert, requests until the breaker reads closed.
 * Every read of the gateway's breakers is a `breaker` observation. checkBreakerTrip judges the timeline.
 */

type BreakerObservation = Extract<Observation, {kind: 'breaker'}>
type State = BreakerObservation['state']

const STATES: Record<number, State> = {0: 'closed', 1: 'open', 2: 'half_open'}
const CB_TRANSITIONS = 'smg_worker_cb_transitions_total'
/** Decode's queues are read this often while the probes are out: a half sent alone sits there for seconds. */
const DECODE_SAMPLE_MS = 200

/** The deployment service a gateway worker label names: same host and port, else the same port alone. */
type Urls = Pick<BreakerExpectation, 'workerUrl' | 'decodeUrl'>

export function workerRole(worker: string, x: Urls): BreakerObservation['role'] {
  const parse = (u: string): {host: string; port: string} | undefined => {
    try {
      const url = new URL(u)
      return {host: url.hostname, port: url.port || (url.protocol === 'https:' ? '443' : '80')}
    } catch {
      return undefined
    }
  }
  const w = parse(worker)
  if (!w) return 'other'
  const roles = [
    ['prefill', parse(x.workerUrl)],
    ['decode', parse(x.decodeUrl)],
  ] as const
  const exact = roles.find(([, u]) => u && u.host === w.host && u.port === w.port)
  if (exact) return exact[0]
  const byPort = roles.filter(([, u]) => u && u.port === w.port)
  return byPort.length === 1 ? byPort[0]![0] : 'other'
}

/** One read of every worker's breaker, recorded; the prefill worker's state (undefined: unreadable or absent). */
export async function readBreakers(
  router: RouterClient,
  rec: Recorder,
  x: BreakerExpectation,
): Promise<State | undefined> {
  const m = await router.metrics().catch(() => undefined)
  if (!m) return undefined
  const t = now()
  let prefill: State | undefined
  for (const s of m.samples.filter(x => x.name === ROUTER_CB_STATE)) {
    const worker = s.labels.worker ?? ''
    const state = STATES[s.value] ?? 'closed'
    const count = (to: string): number =>
      m.samples
        .filter(c => c.name === CB_TRANSITIONS && c.labels.worker === worker && c.labels.to === to)
        .reduce((a, c) => a + c.value, 0)
    const role = workerRole(worker, x)
    const transitions = {toOpen: count('open'), toHalfOpen: count('half_open'), toClosed: count('closed')}
    rec.add({kind: 'breaker', t, worker, role, state, transitions})
    if (role === 'prefill') prefill = state
  }
  return prefill
}

/** The scenario's fault (its requests carry the name) and where its lines go. */
export interface TrialOptions {
  fault: string
  promptTokens: number
  scenario: string
  signal: AbortSignal
  say: (l: string) => void
}

export interface BreakerTrial {
  /** When pdchaos first read the breaker open (undefined: it never opened). */
  openedAt?: number
}

/**
 * With the fault in place: trip requests until the breaker reads open (at most x.tripRequests), then x.probes requests
 * at it, one at a time, within half its open duration (a probe after it half-opens would reach the refused prefill).
 */
export async function tripAndProbe(
  session: RunSession,
  rec: Recorder,
  x: BreakerExpectation,
  o: TrialOptions,
): Promise<BreakerTrial> {
  const base = {fault: o.fault, scenario: o.scenario, promptTokens: o.promptTokens, signal: o.signal}
  let state = await readBreakers(session.router, rec, x)
  o.say(
    `tripping prefill's breaker: up to ${x.tripRequests} requests through the gateway ` +
      `(${x.failureThreshold} failures open it)`,
  )
  for (let i = 0; i < x.tripRequests && state !== 'open' && !o.signal.aborted; i++) {
    await sendRequest(session.router, rec, {...base, role: 'trip', timeoutMs: x.tripTimeoutMs}).done
    state = await readBreakers(session.router, rec, x)
  }
  if (state !== 'open') {
    rec.marker('breaker-not-opened', `prefill's breaker read ${state ?? 'unreadable'} after the trip requests`)
    o.say(`prefill's breaker did not open (${state ?? 'metrics unreadable'}): no probes`)
    return {}
  }
  const openedAt = now()
  rec.marker('router-breaker-open', x.workerUrl)
  const decode: SampledServer[] = [{service: 'decode', client: session.decode}]
  await sampleOnce(rec, decode)
  rec.marker('breaker-probes', `${x.probes} request(s), each to be refused within ${x.refuseWithinMs} ms`)
  o.say(`prefill's breaker is open: ${x.probes} request(s) at it, each must get 503 within ${x.refuseWithinMs} ms`)
  const sampling = new AbortController()
  const sampler = (async () => {
    for (let i = 0; i < 1000 && !sampling.signal.aborted; i++) {
      await sleep(DECODE_SAMPLE_MS, sampling.signal)
      if (!sampling.signal.aborted) await sampleOnce(rec, decode)
    }
  })()
  try {
    const stopBy = openedAt + (x.openSeconds * 1000) / 2
    for (let i = 0; i < x.probes && now() < stopBy && !o.signal.aborted; i++) {
      await sendRequest(session.router, rec, {...base, role: 'probe', timeoutMs: x.refuseWithinMs + 1000}).done
      await readBreakers(session.router, rec, x)
    }
    // A half sent to decode alone is in its queues by now: one more snapshot after the last answer.
    await sleep(2 * DECODE_SAMPLE_MS, o.signal)
  } finally {
    sampling.abort()
    await sampler
  }
  await sampleOnce(rec, decode)
  rec.marker('breaker-probes-end')
  return {openedAt}
}

/**
 * After the revert: from the open duration's end (counted from the first open read), requests through the gateway one
 * at a time, the breaker read after each, until it reads closed or x.closeWithinSeconds (+2 s) have passed.
 */
export async function watchBreakerClose(
  session: RunSession,
  rec: Recorder,
  x: BreakerExpectation,
  trial: BreakerTrial,
  o: TrialOptions,
): Promise<void> {
  if (trial.openedAt === undefined || o.signal.aborted) return
  const halfOpenAt = trial.openedAt + x.openSeconds * 1000
  const inS = Math.max(0, (halfOpenAt - now()) / 1000).toFixed(1)
  o.say(`waiting for prefill's breaker to half-open (${inS} s) and close`)
  rec.marker('breaker-close-watch')
  await sleep(Math.max(0, halfOpenAt - now()), o.signal)
  const by = trial.openedAt + (x.closeWithinSeconds + 2) * 1000
  const base = {fault: o.fault, scenario: o.scenario, promptTokens: o.promptTokens, signal: o.signal}
  for (let i = 0; i < 200 && now() < by && !o.signal.aborted; i++) {
    await sendRequest(session.router, rec, {...base, role: 'probe', timeoutMs: 10_000}).done
    if ((await readBreakers(session.router, rec, x)) === 'closed') {
      rec.marker('router-breaker-closed', x.workerUrl)
      return
    }
    await sleep(100, o.signal)
  }
}
