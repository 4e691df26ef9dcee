import {serviceClients} from '../deployment/clients.js'
import type {Deployment} from '../deployment/config.js'
import {sampleValue} from '../deployment/prom-text.js'
import type {HealthResult} from '../deployment/sglang-client.js'
import {PREFILL_BOOTSTRAP_QUEUE, PREFILL_INFLIGHT_QUEUE, RUNNING_REQS} from '../deployment/sglang-metrics.js'
import {badInput, oneLine} from '../errors.js'
import {warmUp} from '../experiment/calibrate.js'
import type {Host} from '../hosts/host.js'
import {displayArgv} from '../hosts/quote.js'
import type {RestartResult, RestartStep, ServiceName, WatchSample} from '../model/restart.js'
import {fail, pass, type Verdict} from '../model/verdict.js'
import {sleep} from '../util/time.js'

export type {RestartResult, RestartStep, ServiceName, WatchSample} from '../model/restart.js'
import {now, Recorder} from '../workload/recorder.js'
import {sendRequest, type Sent} from '../workload/send.js'

/**
 * The co-restart: each service restarted by its operator command, in order (prefill → decode → router by default,
 * SGLang's own launch order), each behind its health gate before the next; then canaries end to end; then a pin
 * watch that samples like an operator's `t+7s inflight=… decode_running=…` loop while a light load runs.
 */


export interface RestartOptions {
  order: ServiceName[]
  /** Per-service deadline to become healthy after its restart command. */
  healthTimeoutS: number
  /** Deadline of each restart command. */
  commandTimeoutS: number
  canaries: number
  watchS: number
  /** Seconds between watch samples and watch requests. */
  sampleS: number
  /**
   * Seconds to wait after the last health gate before the canaries: decode learns of a restarted prefill only at its
   * next heartbeat (SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL, 5 s by default), so sooner is not a fair test.
   */
  settleS: number
  onProgress?: (line: string) => void
  signal?: AbortSignal
}

/** The host a service's restart command runs on: the one host, or each service's own (a deployment over several). */
export type RestartHost = Host | ((service: ServiceName) => Host)

export async function coRestart(deployment: Deployment, hosts: RestartHost, opts: RestartOptions): Promise<RestartResult> {
  const started = now()
  const rec = new Recorder()
  const say = opts.onProgress ?? (() => {})
  const svc = deployment.services
  const {router, ...clients} = serviceClients(deployment)
  const gate = (name: ServiceName) => (name === 'router' ? router.readiness(svc.router.readinessPath) : clients[name].health(svc[name].healthPath))
  for (const name of opts.order) {
    if (!svc[name].restart) throw badInput(`the deployment file has no restart command for ${name}`, `add services.${name}.restart (an argv list) to the deployment file`)
  }

  const verdicts: Verdict[] = []
  const steps: RestartStep[] = []
  const canaries: RestartResult['canaries'] = []
  const samples: WatchSample[] = []
  let watchRequests: RestartResult['watch']['requests'] = []
  const finish = (): RestartResult =>
    ({steps, totalMs: Math.round(now() - started), canaries, watch: {samples, requests: watchRequests}, verdicts, observations: rec.sorted()})
  for (const name of opts.order) {
    const command = svc[name].restart!
    // Quoted, control characters escaped: an argument with a newline cannot forge a progress line.
    say(`restarting ${name}: ${displayArgv(command)}`)
    const t0 = now()
    rec.add({kind: 'marker', t: t0, name: `restart ${name}`})
    let exitCode: number | null = null
    try {
      // Privileged only as the deployment's sudo: policy says (never: as the login user).
      const host = typeof hosts === 'function' ? hosts(name) : hosts
      const res = await host.run(command, {timeoutMs: opts.commandTimeoutS * 1000, sudo: deployment.sudo === 'passwordless'})
      exitCode = res.code
      if (res.code !== 0) say(`${name} restart command exited ${res.code}: ${oneLine(res.stderr).slice(0, 200)}`)
    } catch (error) {
      say(`${name} restart command failed: ${oneLine(error)}`)
    }
    const commandMs = now() - t0
    let healthyAfterMs: number | null = null
    let last: HealthResult | undefined
    const deadline = t0 + opts.healthTimeoutS * 1000
    while (now() < deadline && !opts.signal?.aborted) {
      last = await gate(name)
      if (last.ok) {
        healthyAfterMs = now() - t0
        break
      }
      await sleep(200, opts.signal)
    }
    steps.push({service: name, command, exitCode, commandMs: Math.round(commandMs), healthyAfterMs: healthyAfterMs === null ? null : Math.round(healthyAfterMs), lastHealth: last})
    const evidence = {command, exitCode, commandMs: Math.round(commandMs), healthyAfterMs, gate: name === 'router' ? svc.router.readinessPath : svc[name].healthPath, lastHealth: last}
    if (healthyAfterMs === null) {
      verdicts.push(fail('restart', name, `${name} not healthy within ${opts.healthTimeoutS}s of its restart (${last?.error ?? 'no answer'}); later services were not restarted`, evidence))
      return finish()
    }
    verdicts.push(pass('restart', name, `${name} healthy ${(healthyAfterMs / 1000).toFixed(2)}s after its restart command`, evidence))
    say(`${name} healthy after ${(healthyAfterMs / 1000).toFixed(2)}s`)
  }

  if (opts.settleS > 0) {
    say(`settling ${opts.settleS}s (one decode heartbeat) before the canaries`)
    await sleep(opts.settleS * 1000, opts.signal)
  }
  // A restarted instance opens its routes and KV connections on its first request, which can outlast a short watchdog
  // deadline: warm it up directly (as calibration does) before the canaries judge it through the router.
  const warmed = await warmUp(deployment, clients)
  rec.marker('warm-up', `${warmed.ok ? 'succeeded' : 'did not succeed'} after ${warmed.tries} request(s)`)
  say(`warm-up after the restart: ${warmed.ok ? 'ok' : 'no success'} after ${warmed.tries} request(s)`)
  // Canaries end to end: the pair works again through the router.
  const requestTimeoutMs = Math.max(10_000, (deployment.watchdog.deadlineSeconds + deployment.watchdog.pollSeconds) * 1000 + 10_000)
  // All at once: a canary a restart left pinned waits out its whole timeout, and one after another they would add up.
  const sent = Array.from({length: opts.canaries}, () => sendRequest(router, rec, {role: 'canary', timeoutMs: requestTimeoutMs, signal: opts.signal}))
  for (const s of sent) {
    const r = await s.done
    canaries.push({rid: s.rid, status: r.status, ms: Math.round(r.at - s.sentAt)})
  }
  const badCanaries = canaries.filter((c) => c.status !== 200)
  verdicts.push(badCanaries.length === 0
    ? pass('restart', 'canaries', `${canaries.length} of ${canaries.length} canary requests succeeded end to end`, {canaries})
    : fail('restart', 'canaries', `${badCanaries.length} of ${canaries.length} canary requests failed after the restart: ${badCanaries.map((c) => `${c.rid} (${c.status ?? 'no answer'} after ${c.ms} ms)`).join(', ')}`, {canaries}))

  // The pin watch: an operator's sampling loop plus one request per sample.
  say(`watching for pins for ${opts.watchS}s`)
  const watchStart = now()
  const inWatch: Sent[] = []
  const deadlineMs = deployment.watchdog.deadlineSeconds * 1000
  while (now() - watchStart < opts.watchS * 1000 && !opts.signal?.aborted) {
    inWatch.push(sendRequest(router, rec, {role: 'load', timeoutMs: requestTimeoutMs, signal: opts.signal}))
    const atS = (now() - watchStart) / 1000
    const [pm, dm] = await Promise.all([clients.prefill.metrics().catch(() => undefined), clients.decode.metrics().catch(() => undefined)])
    const sample: WatchSample = {
      atS: Math.round(atS * 10) / 10,
      inflight: pm && sampleValue(pm.samples, PREFILL_INFLIGHT_QUEUE),
      bootstrap: pm && sampleValue(pm.samples, PREFILL_BOOTSTRAP_QUEUE),
      decodeRunning: dm && sampleValue(dm.samples, RUNNING_REQS),
      line: '',
    }
    sample.line = `t+${Math.round(atS)}s inflight=${sample.inflight ?? '?'} bootstrap=${sample.bootstrap ?? '?'} decode_running=${sample.decodeRunning ?? '?'}`
    samples.push(sample)
    say(sample.line)
    await sleep(opts.sampleS * 1000, opts.signal)
  }
  // Every watch request must finish; one held past the deadline is a pin the restart left behind.
  const settled = await Promise.all(inWatch.map(async (s) => ({s, r: await s.done})))
  watchRequests = settled.map(({s, r}) => ({rid: s.rid, sentAtS: Math.round(((s.sentAt - watchStart) / 1000) * 10) / 10, status: r.status, ms: r.status === null ? null : Math.round(r.at - s.sentAt)}))
  const pinned = settled.filter(({s, r}) => r.status !== 200 && (r.at - s.sentAt) >= deadlineMs * 0.5)
  const failedFast = settled.filter(({s, r}) => r.status !== 200 && (r.at - s.sentAt) < deadlineMs * 0.5)
  const watchEvidence = {samples: samples.map((x) => x.line), requests: watchRequests, deadlineSeconds: deployment.watchdog.deadlineSeconds}
  if (pinned.length > 0) {
    verdicts.push(fail('restart', 'pin watch', `${pinned.length} of ${settled.length} requests after the restart stayed in flight for ${(Math.min(...pinned.map((p) => p.r.at - p.s.sentAt)) / 1000).toFixed(1)}s or more and then failed (${pinned.map((p) => p.r.status ?? 'no answer').join(', ')}): pinned — stale prefill ports after a restart look exactly like this`, watchEvidence))
  } else if (failedFast.length > 0) {
    verdicts.push(fail('restart', 'pin watch', `${failedFast.length} of ${settled.length} requests after the restart failed`, watchEvidence))
  } else {
    verdicts.push(pass('restart', 'pin watch', `${settled.length} of ${settled.length} requests during the ${opts.watchS}s watch succeeded; no pin`, watchEvidence))
  }
  return finish()
}
