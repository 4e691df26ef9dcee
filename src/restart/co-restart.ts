import {DEFAULT_PROBE_TIMEOUT_MS, serviceClients} from '../engines/sglang/deployment/clients.js'
import type {Deployment, RouterService, Service} from '../deployment/config.js'
import {RouterClient} from '../engines/sglang/deployment/router-client.js'
import {SglangClient} from '../engines/sglang/deployment/sglang-client.js'
import {sampleValue} from '../deployment/prom-text.js'
import type {HealthResult} from '../engines/sglang/deployment/sglang-client.js'
import {PREFILL_BOOTSTRAP_QUEUE, PREFILL_INFLIGHT_QUEUE, RUNNING_REQS} from '../engines/sglang/sglang-metrics.js'
import {badInput, oneLine} from '../errors.js'
import {warmUp} from '../experiment/calibrate.js'
import type {Host} from '../hosts/host.js'
import {displayArgv} from '../hosts/quote.js'
import type {RestartResult, RestartStep, ServiceName, WatchSample} from '../model/restart.js'
import {fail, pass, type Verdict} from '../model/verdict.js'
import {abortable, stoppedError, throwIfStopped} from '../util/stop.js'
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
  /** Every instance to restart, in order (several of a role); default: `order`, one instance per role on `hosts`. */
  targets?: RestartTarget[]
  /** Stop after the health gates: no settle, warm-up, canaries or watch (`restart --only` sends its own canaries). */
  gatesOnly?: boolean
}

/** The host a service's restart command runs on: the one host, or each service's own (a deployment over several). */
export type RestartHost = Host | ((service: ServiceName) => Host)

/**
 * One service a co-restart restarts: an instance of a role, with its restart command and health gate, and the host
 * its command runs on (its node rank 0's). Where the file lists several instances of a role, each is a step of its
 * own, in the file's order, named as the file has it (prefill[1]).
 */
export interface RestartTarget {
  /** In messages, verdicts and steps: the role, or role[i] where the role has several instances. */
  name: string
  role: ServiceName
  /** Where the file states it (services.prefill[1]): named when its restart command is missing. */
  path: string
  service: Service & Partial<Pick<RouterService, 'readinessPath'>> & {bootstrapPort?: number}
  host: Host
  /**
   * A multi-node instance (--nnodes): every node rank's host, rank 0 first, each running the restart command at once
   * (node ranks start together: rank 0 waits for the others to join, as SGLang's torch.distributed init does).
   */
  nodes?: Array<{name: string; host: Host}>
}

/** The targets of a deployment with one instance per role: each role in `order`, on the host `hosts` gives it. */
export function roleTargets(deployment: Deployment, hosts: RestartHost, order: ServiceName[]): RestartTarget[] {
  return order.map(role => ({
    name: role,
    role,
    path: `services.${role}`,
    service: deployment.services[role],
    host: typeof hosts === 'function' ? hosts(role) : hosts,
  }))
}

/** One co-restart under way: what it has gathered so far, and how it says where it is and stops. */
export interface Run {
  /** Restart commands run privileged (the deployment's sudo: passwordless). */
  sudo: boolean
  opts: RestartOptions
  rec: Recorder
  say: (line: string) => void
  stopOpt: {signal?: AbortSignal}
  steps: RestartStep[]
  verdicts: Verdict[]
  canaries: RestartResult['canaries']
  samples: WatchSample[]
  watchRequests: RestartResult['watch']['requests']
  /** What was restarted so far, for a stop (SIGINT): a restart command under way is killed (exit 3). */
  done: () => string
  stopped: (phase: string) => void
  finish: () => RestartResult
}

export async function coRestart(
  deployment: Deployment,
  hosts: RestartHost,
  opts: RestartOptions,
): Promise<RestartResult> {
  const run = startRun(deployment.sudo === 'passwordless', opts)
  const {router, ...clients} = serviceClients(deployment)
  const targets = opts.targets ?? roleTargets(deployment, hosts, opts.order)
  if (!(await restartEach(run, targets))) return run.finish()
  if (opts.gatesOnly) return run.finish()
  await settleAndWarmUp(run, deployment, targets)
  // Canaries end to end: the pair works again through the router.
  const requestTimeoutMs = Math.max(
    10_000,
    (deployment.watchdog.deadlineSeconds + deployment.watchdog.pollSeconds) * 1000 + 10_000,
  )
  await sendCanaries(run, router, requestTimeoutMs)
  await pinWatch(run, deployment, router, clients, requestTimeoutMs)
  return run.finish()
}

/**
 * The engine-agnostic steps (vLLM's co-restart uses them too): every target must have a restart command (else exit
 * 2 before anything is restarted); then each is restarted behind its gate. False when a step failed.
 */
export async function restartEach(run: Run, targets: RestartTarget[]): Promise<boolean> {
  for (const t of targets) {
    if (!t.service.restart)
      throw badInput(
        `the deployment file has no restart command for ${t.name}`,
        `add ${t.path}.restart (an argv list) to the deployment file`,
      )
  }
  for (const t of targets) {
    if (!(await restartOne(run, t))) return false
  }
  return true
}

export function startRun(sudo: boolean, opts: RestartOptions): Run {
  const started = now()
  const rec = new Recorder()
  const run: Run = {
    sudo,
    opts,
    rec,
    say: opts.onProgress ?? (() => {}),
    stopOpt: opts.signal ? {signal: opts.signal} : {},
    steps: [],
    verdicts: [],
    canaries: [],
    samples: [],
    watchRequests: [],
    done: () => {
      const restarted = run.steps.filter(x => x.exitCode === 0).map(x => x.instance ?? x.service)
      return restarted.length > 0 ? `restarted ${restarted.join(', ')}; nothing after` : 'nothing was restarted'
    },
    stopped: phase => throwIfStopped(opts.signal, phase, run.done()),
    finish: () => ({
      steps: run.steps,
      totalMs: Math.round(now() - started),
      canaries: run.canaries,
      watch: {samples: run.samples, requests: run.watchRequests},
      verdicts: run.verdicts,
      observations: rec.sorted(),
    }),
  }
  return run
}

/** A service's health gate: the router's readiness, a server's health. */
function gate(t: RestartTarget): Promise<HealthResult> {
  return t.role === 'router'
    ? new RouterClient(t.service.url, {service: t.name, timeoutMs: DEFAULT_PROBE_TIMEOUT_MS}).readiness(
        t.service.readinessPath ?? '/readiness',
      )
    : new SglangClient(t.service.url, {service: t.name, timeoutMs: DEFAULT_PROBE_TIMEOUT_MS}).health(
        t.service.healthPath,
      )
}

type NodeCodes = Array<{host: string; exitCode: number | null}> | undefined

/** One target restarted by its command and behind its health gate; false when the co-restart stops there. */
async function restartOne(run: Run, t: RestartTarget): Promise<boolean> {
  const {opts, rec, say} = run
  const name = t.name
  const command = t.service.restart!
  // Quoted, control characters escaped: an argument with a newline cannot forge a progress line.
  say(
    `restarting ${name}${
      t.nodes && t.nodes.length > 1
        ? ` on its ${t.nodes.length} nodes ` + `(${t.nodes.map(n => n.name).join(', ')}) at once`
        : ''
    }: ${displayArgv(command)}`,
  )
  const t0 = now()
  rec.add({kind: 'marker', t: t0, name: `restart ${name}`})
  const {nodeCodes, exitCode} = await runRestartCommand(run, t, command)
  const commandMs = now() - t0
  if (exitCode !== 0) {
    commandFailed(run, t, {command, exitCode, nodeCodes, commandMs})
    return false
  }
  const {healthyAfterMs, last} = await waitHealthy(run, t, t0)
  run.steps.push({
    service: t.role,
    ...(name === t.role ? {} : {instance: t.path}),
    command,
    exitCode,
    ...(nodeCodes ? {nodes: nodeCodes} : {}),
    commandMs: Math.round(commandMs),
    healthyAfterMs: healthyAfterMs === null ? null : Math.round(healthyAfterMs),
    lastHealth: last,
  })
  const evidence = {
    command,
    exitCode,
    ...(nodeCodes ? {nodes: nodeCodes} : {}),
    commandMs: Math.round(commandMs),
    healthyAfterMs,
    gate: t.role === 'router' ? t.service.readinessPath : t.service.healthPath,
    lastHealth: last,
  }
  if (healthyAfterMs === null) {
    run.verdicts.push(
      fail(
        'restart',
        name,
        `${name} not healthy within ${opts.healthTimeoutS}s of its restart (${last?.error ?? 'no answer'}); ` +
          `later services were not restarted`,
        evidence,
      ),
    )
    return false
  }
  run.verdicts.push(
    pass('restart', name, `${name} healthy ${(healthyAfterMs / 1000).toFixed(2)}s after its restart command`, evidence),
  )
  say(`${name} healthy after ${(healthyAfterMs / 1000).toFixed(2)}s`)
  return true
}

/**
 * The restart command on the target's host, or on every node of a multi-node instance at once. The step's exit: the
 * one command's, or over nodes the first that did not succeed (0 when all did).
 */
async function runRestartCommand(
  run: Run,
  t: RestartTarget,
  command: string[],
): Promise<{nodeCodes: NodeCodes; exitCode: number | null}> {
  const {opts, say, stopOpt} = run
  const name = t.name
  const runOn = async (host: Host, where: string): Promise<number | null> => {
    try {
      // Privileged only as the deployment's sudo: policy says (never: as the login user).
      const res = await host.run(command, {
        timeoutMs: opts.commandTimeoutS * 1000,
        sudo: run.sudo,
        ...stopOpt,
      })
      if (res.code !== 0)
        say(`${name}${where} restart command exited ${res.code}: ${oneLine(res.stderr).slice(0, 200)}`)
      return res.code
    } catch (error) {
      if (opts.signal?.aborted) throw stoppedError(opts.signal, `${name}'s restart command (killed)`, run.done())
      say(`${name}${where} restart command failed: ${oneLine(error)}`)
      return null
    }
  }
  const nodeCodes =
    t.nodes && t.nodes.length > 1
      ? await Promise.all(
          t.nodes.map(async (n, k) => ({
            host: n.name,
            exitCode: await runOn(n.host, ` (node rank ${k} on ${n.name})`),
          })),
        )
      : undefined
  const exitCode = nodeCodes ? (nodeCodes.find(c => c.exitCode !== 0)?.exitCode ?? 0) : await runOn(t.host, '')
  return {nodeCodes, exitCode}
}

/**
 * A command that failed restarted nothing anyone can vouch for: the old process answering healthy would pass a
 * restart that never happened. Its step and a failed verdict; later services are not restarted.
 */
function commandFailed(
  run: Run,
  t: RestartTarget,
  {
    command,
    exitCode,
    nodeCodes,
    commandMs,
  }: {command: string[]; exitCode: number | null; nodeCodes: NodeCodes; commandMs: number},
): void {
  const name = t.name
  const where = nodeCodes
    ? ` (` +
      `${nodeCodes.map(n => `${n.host}: ${n.exitCode === null ? 'did not finish' : `exit ${n.exitCode}`}`).join(', ')})`
    : ''
  run.steps.push({
    service: t.role,
    ...(name === t.role ? {} : {instance: t.path}),
    command,
    exitCode,
    ...(nodeCodes ? {nodes: nodeCodes} : {}),
    commandMs: Math.round(commandMs),
    healthyAfterMs: null,
  })
  run.verdicts.push(
    fail(
      'restart',
      name,
      `${name}'s restart command ${exitCode === null ? 'did not finish' : `exited ${exitCode}`}${where}: it ` +
        `was not restarted as the file says; later services were not restarted`,
      {command, exitCode, ...(nodeCodes ? {nodes: nodeCodes} : {}), commandMs: Math.round(commandMs)},
    ),
  )
}

/** The health gate polled until it passes or the deadline (healthTimeoutS after the command started) runs out. */
async function waitHealthy(
  run: Run,
  t: RestartTarget,
  t0: number,
): Promise<{healthyAfterMs: number | null; last: HealthResult | undefined}> {
  const {opts} = run
  const name = t.name
  let healthyAfterMs: number | null = null
  let last: HealthResult | undefined
  const deadline = t0 + opts.healthTimeoutS * 1000
  while (now() < deadline && !opts.signal?.aborted) {
    last = await abortable(
      gate(t),
      opts.signal,
      `${name}'s health gate`,
      `${name}'s restart command ran; ${run.done()}`,
    )
    if (last.ok) {
      healthyAfterMs = now() - t0
      break
    }
    await sleep(200, opts.signal)
  }
  throwIfStopped(opts.signal, `${name}'s health gate`, `${name}'s restart command ran; ${run.done()}`)
  return {healthyAfterMs, last}
}

/**
 * The settle (one decode heartbeat), then the warm-up. A restarted instance opens its routes and KV connections on
 * its first request, which can outlast a short watchdog deadline: warm it up directly (as calibration does) before
 * the canaries judge it through the router. Several instances: pairs that reach every restarted one, since the
 * router may send a canary to any of them.
 */
async function settleAndWarmUp(run: Run, deployment: Deployment, targets: RestartTarget[]): Promise<void> {
  const {opts, say, rec} = run
  if (opts.settleS > 0) {
    say(`settling ${opts.settleS}s (one decode heartbeat) before the canaries`)
    await sleep(opts.settleS * 1000, opts.signal)
    run.stopped('the settle')
  }
  const warmed = await abortable(warmUpPairs(deployment, targets, opts.signal), opts.signal, 'the warm-up', run.done())
  rec.marker('warm-up', `${warmed.ok ? 'succeeded' : 'did not succeed'} after ${warmed.tries} request(s)`)
  say(`warm-up after the restart: ${warmed.ok ? 'ok' : 'no success'} after ${warmed.tries} request(s)`)
}

type Router = ReturnType<typeof serviceClients>['router']
type Clients = Omit<ReturnType<typeof serviceClients>, 'router'>

/**
 * The canaries, all at once: a canary a restart left pinned waits out its whole timeout, and one after another they
 * would add up.
 */
async function sendCanaries(run: Run, router: Router, requestTimeoutMs: number): Promise<void> {
  const {opts, rec, canaries} = run
  const sent = Array.from({length: opts.canaries}, () =>
    sendRequest(router, rec, {role: 'canary', timeoutMs: requestTimeoutMs, signal: opts.signal}),
  )
  for (const s of sent) {
    const r = await s.done
    canaries.push({rid: s.rid, status: r.status, ms: Math.round(r.at - s.sentAt)})
  }
  run.stopped('the canaries')
  judgeCanaries(run)
}

/** The canaries' verdict: every one answered 200 end to end, or which did not (with status and time). */
export function judgeCanaries(run: Pick<Run, 'canaries' | 'verdicts'>): void {
  const {canaries} = run
  const badCanaries = canaries.filter(c => c.status !== 200)
  run.verdicts.push(
    badCanaries.length === 0
      ? pass('restart', 'canaries', `${canaries.length} of ${canaries.length} canary requests succeeded end to end`, {
          canaries,
        })
      : fail(
          'restart',
          'canaries',
          `${badCanaries.length} of ${canaries.length} canary requests failed after the ` +
            `restart: ${badCanaries.map(c => `${c.rid} (${c.status ?? 'no answer'} after ${c.ms} ms)`).join(', ')}`,
          {canaries},
        ),
  )
}

/** The pin watch: an operator's sampling loop plus one request per sample; then every watch request judged. */
async function pinWatch(
  run: Run,
  deployment: Deployment,
  router: Router,
  clients: Clients,
  requestTimeoutMs: number,
): Promise<void> {
  const {opts, rec, say, samples} = run
  say(`watching for pins for ${opts.watchS}s`)
  const watchStart = now()
  const inWatch: Sent[] = []
  while (now() - watchStart < opts.watchS * 1000 && !opts.signal?.aborted) {
    inWatch.push(sendRequest(router, rec, {role: 'load', timeoutMs: requestTimeoutMs, signal: opts.signal}))
    const atS = (now() - watchStart) / 1000
    const [pm, dm] = await abortable(
      Promise.all([clients.prefill.metrics().catch(() => undefined), clients.decode.metrics().catch(() => undefined)]),
      opts.signal,
      'the pin watch',
      run.done(),
    )
    const sample: WatchSample = {
      atS: Math.round(atS * 10) / 10,
      inflight: pm && sampleValue(pm.samples, PREFILL_INFLIGHT_QUEUE),
      bootstrap: pm && sampleValue(pm.samples, PREFILL_BOOTSTRAP_QUEUE),
      decodeRunning: dm && sampleValue(dm.samples, RUNNING_REQS),
      line: '',
    }
    sample.line =
      `t+${Math.round(atS)}s inflight=${sample.inflight ?? '?'} bootstrap=${sample.bootstrap ?? '?'} ` +
      `decode_running=${sample.decodeRunning ?? '?'}`
    samples.push(sample)
    say(sample.line)
    await sleep(opts.sampleS * 1000, opts.signal)
  }
  run.stopped('the pin watch')
  await judgeWatch(run, deployment, inWatch, watchStart)
}

/** Every watch request must finish; one held past half the deadline and then failed is a pin the restart left. */
async function judgeWatch(run: Run, deployment: Deployment, inWatch: Sent[], watchStart: number): Promise<void> {
  const {opts, samples} = run
  const deadlineMs = deployment.watchdog.deadlineSeconds * 1000
  const settled = await Promise.all(inWatch.map(async s => ({s, r: await s.done})))
  run.watchRequests = settled.map(({s, r}) => ({
    rid: s.rid,
    sentAtS: Math.round(((s.sentAt - watchStart) / 1000) * 10) / 10,
    status: r.status,
    ms: r.status === null ? null : Math.round(r.at - s.sentAt),
  }))
  const pinned = settled.filter(({s, r}) => r.status !== 200 && r.at - s.sentAt >= deadlineMs * 0.5)
  const failedFast = settled.filter(({s, r}) => r.status !== 200 && r.at - s.sentAt < deadlineMs * 0.5)
  const watchEvidence = {
    samples: samples.map(x => x.line),
    requests: run.watchRequests,
    deadlineSeconds: deployment.watchdog.deadlineSeconds,
  }
  if (pinned.length > 0) {
    run.verdicts.push(
      fail(
        'restart',
        'pin watch',
        `${pinned.length} of ${settled.length} requests after the restart stayed in flight ` +
          `for ${(Math.min(...pinned.map(p => p.r.at - p.s.sentAt)) / 1000).toFixed(1)}s or more and then failed ` +
          `(${pinned.map(p => p.r.status ?? 'no answer').join(', ')}): pinned — stale prefill ports after a ` +
          `restart look exactly like this`,
        watchEvidence,
      ),
    )
  } else if (failedFast.length > 0) {
    run.verdicts.push(
      fail(
        'restart',
        'pin watch',
        `${failedFast.length} of ${settled.length} requests after the restart failed`,
        watchEvidence,
      ),
    )
  } else {
    run.verdicts.push(
      pass(
        'restart',
        'pin watch',
        `${settled.length} of ${settled.length} requests during the ${opts.watchS}s watch succeeded; no pin`,
        watchEvidence,
      ),
    )
  }
}

/**
 * Warm up every restarted prefill and decode instance: pair i is prefill instance i and decode instance i (each list
 * taken round), so max(prefills, decodes) pairs reach them all; a role not restarted is the deployment's own instance.
 */
async function warmUpPairs(
  deployment: Deployment,
  targets: RestartTarget[],
  signal?: AbortSignal,
): Promise<{ok: boolean; tries: number}> {
  const of = (role: 'prefill' | 'decode') => {
    const restarted = targets.filter(t => t.role === role).map(t => ({...deployment.services[role], ...t.service}))
    return restarted.length > 0 ? restarted : [deployment.services[role]]
  }
  const [prefills, decodes] = [of('prefill'), of('decode')]
  let ok = true
  let tries = 0
  for (let i = 0; i < Math.max(prefills.length, decodes.length); i++) {
    const prefill = prefills[i % prefills.length] as Deployment['services']['prefill']
    const decode = decodes[i % decodes.length]!
    const view = {...deployment, services: {...deployment.services, prefill, decode}}
    const w = await warmUp(view, serviceClients(view), undefined, signal)
    ok &&= w.ok
    tries += w.tries
  }
  return {ok, tries}
}
