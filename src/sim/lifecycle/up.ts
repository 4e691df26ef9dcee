import {mkdirSync, rmSync} from 'node:fs'
import {performance} from 'node:perf_hooks'

import {distEndpoint, isFollower, type SimConfig, servicesHere, simPaths} from '../sim-config.js'
import {writeDeploymentFile} from './deployment-file.js'
import {endpoints, writeJsonAtomic} from './files.js'
import {acquireLock, downHint, type LockFile, removeLock, type Service, writeLock} from './lock.js'
import {writeNvidiaSmi} from './nvidia-smi.js'
import {createRails, destroyRails} from './rails.js'
import {buildSimConfig, type SimUpOptions, UP_DEFAULTS} from './options.js'
import {assertPortsFree} from './ports.js'
import {isSameProcess, type ProcRef, stopGroup} from './procs.js'
import {startService, waitHealthy} from './services.js'
import {assertOwnDeploymentFile, claimStateDir} from './state-marker.js'
import {EXIT_INTERRUPTED, SimError, unavailable} from './sim-error.js'

export interface SimUpResult {
  stateDir: string
  deploymentFile: string
  endpoints: ReturnType<typeof endpoints>
  /** The services started here (all three, or this node's with --only). */
  pids: Partial<Record<Service, number>>
  rankPids: {prefill: number[]; decode: number[]}
  healthyMs: number
  config: SimConfig
}

/** One `sim up` in progress: what it has started, so that a failure or a signal stops exactly that. */
interface Up {
  config: SimConfig
  stateDir: string
  paths: ReturnType<typeof simPaths>
  lock: LockFile
  started: Array<[Service, ProcRef]>
  railsMade: boolean
}

/** Every port this node's services will listen on is free, or bad input naming the port. */
async function assertServicePortsFree(config: SimConfig, here: readonly Service[]): Promise<void> {
  const on = (service: Service, ports: Record<string, number>): Record<string, number> =>
    here.includes(service) ? ports : {}
  await assertPortsFree(
    config.host,
    {
      ...on('router', {router: config.ports.router, 'router metrics': config.ports.routerMetrics}),
      // A follower node of a multi-node prefill runs no bootstrap server; node 0 also listens on the dist-init-addr.
      ...on('prefill', {
        prefill: config.ports.prefill,
        ...(isFollower(config, 'prefill') ? {} : {bootstrap: config.ports.bootstrap}),
        ...(config.dockerProxy ? {'prefill container': config.dockerProxy.prefill} : {}),
      }),
      ...(config.dist?.nodeRank === 0 ? {'dist-init-addr': distEndpoint(config.dist).port} : {}),
      ...on('decode', {
        decode: config.ports.decode,
        ...(config.dockerProxy ? {'decode container': config.dockerProxy.decode} : {}),
      }),
    },
    `pass another --base-port (now ${config.ports.router}), or stop what holds the port`,
  )
}

/** A fresh twin: old service/gpu files, truth and logs belong to a previous run; then sim.json, nvidia-smi, rails. */
async function prepareStateDir(up: Up): Promise<void> {
  const {paths, config, stateDir} = up
  for (const dir of [paths.services, paths.gpus, paths.truthDir, paths.logs])
    rmSync(dir, {recursive: true, force: true})
  for (const dir of [paths.services, paths.gpus, paths.truthDir, paths.logs]) mkdirSync(dir, {recursive: true})
  writeJsonAtomic(paths.config, config)
  writeNvidiaSmi(stateDir, config.gpus, config.rails?.nics.map(n => ({name: n.name, gpu: n.gpu})) ?? [], {
    hideProcesses: config.gpuView?.hideProcesses ?? false,
  })
  if (config.rails) {
    await createRails(config.rails, stateDir)
    up.railsMade = true
  }
}

/**
 * Launch order prefill -> decode -> router, as SGLang's fixture. The router process starts without waiting (node
 * start-up is the slow part here) but, like sgl-model-gateway, only turns ready once both workers pass its health
 * probes; decode connects to prefill lazily, so it need not wait for prefill either. On a node of a twin that spans
 * nodes, only this node's services; a router waits for workers on other nodes as the gateway does (start the workers'
 * nodes first, or give --wait the time they take).
 */
async function startServices(up: Up, here: readonly Service[], deadline: number) {
  const {config, lock, stateDir} = up
  const start = (service: Service): ProcRef => {
    const ref = startService(config, service)
    up.started.push([service, ref])
    lock.services[service] = ref
    writeLock(stateDir, lock)
    return ref
  }
  const refs: Partial<Record<Service, ProcRef>> = {}
  for (const service of ['prefill', 'decode', 'router'] as const)
    if (here.includes(service)) refs[service] = start(service)
  const [pf, df] = await Promise.all(
    (['prefill', 'decode'] as const).map(s => (refs[s] ? waitHealthy(config, s, refs[s], deadline) : undefined)),
  )
  if (refs.router) await waitHealthy(config, 'router', refs.router, deadline)
  return {refs, pf, df}
}

/** Interrupted while starting: nothing half-started may outlive us. */
function killStarted(up: Up): never {
  for (const [service, ref] of up.started) {
    try {
      if (isSameProcess(ref)) process.kill(-ref.pid, 'SIGKILL')
    } catch {}
    rmSync(up.paths.service(service), {force: true})
  }
  removeLock(up.stateDir)
  process.exit(EXIT_INTERRUPTED)
}

/** A failed start: stop everything this call started, release the lock, and say why. */
async function undo(up: Up, error: unknown): Promise<never> {
  const {started, paths, config, stateDir} = up
  await Promise.all(started.map(([, ref]) => stopGroup(ref, 3000, 2000)))
  for (const [service] of started) rmSync(paths.service(service), {force: true})
  if (up.railsMade && config.rails) await destroyRails(config.rails, stateDir).catch(() => undefined)
  removeLock(stateDir)
  if (error instanceof SimError) throw error
  throw unavailable(`sim up failed: ${(error as Error).message}`, downHint(stateDir), error)
}

/**
 * Start the twin: validate, lock the state dir, check every port, write sim.json and the nvidia-smi
 * stand-in, start prefill and decode detached, then the router once both serve, wait for health and
 * write the deployment file. Any failure stops everything this call started and releases the lock.
 */
export async function simUp(options: SimUpOptions): Promise<SimUpResult> {
  const t0 = performance.now()
  const config = buildSimConfig(options)
  const {stateDir} = config
  const paths = simPaths(stateDir)
  // Only a new or empty dir, or one pdchaos made for a twin, is cleared below; a deployment file pdchaos did not
  // write is never overwritten (issue 12, S2). Both are checked before anything in the dir changes.
  claimStateDir(stateDir)
  assertOwnDeploymentFile(paths.deploymentFile)
  const up: Up = {config, stateDir, paths, lock: acquireLock(stateDir), started: [], railsMade: false}
  const onSignal = (): void => killStarted(up)
  process.once('SIGINT', onSignal)
  process.once('SIGTERM', onSignal)
  try {
    const here = servicesHere(config)
    await assertServicePortsFree(config, here)
    await prepareStateDir(up)
    const deadline = Date.now() + (options.waitS ?? UP_DEFAULTS.waitS) * 1000
    const {refs, pf, df} = await startServices(up, here, deadline)

    const deploymentFile = await writeDeploymentFile(config)
    up.lock.owner = {pid: 0, start: ''} // from here on the services alone hold the state dir
    writeLock(stateDir, up.lock)
    return {
      stateDir,
      deploymentFile,
      endpoints: endpoints(config),
      pids: Object.fromEntries(Object.entries(refs).map(([s, r]) => [s, r.pid])) as Partial<Record<Service, number>>,
      rankPids: {prefill: pf?.rankPids ?? [], decode: df?.rankPids ?? []},
      healthyMs: Math.round(performance.now() - t0),
      config,
    }
  } catch (error) {
    return await undo(up, error)
  } finally {
    process.off('SIGINT', onSignal)
    process.off('SIGTERM', onSignal)
  }
}
