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
  const lock: LockFile = acquireLock(stateDir)
  const started: Array<[Service, ProcRef]> = []
  let railsMade = false
  // Interrupted while starting: nothing half-started may outlive us.
  const onSignal = (): void => {
    for (const [service, ref] of started) {
      try {
        if (isSameProcess(ref)) process.kill(-ref.pid, 'SIGKILL')
      } catch {}
      rmSync(paths.service(service), {force: true})
    }
    removeLock(stateDir)
    process.exit(EXIT_INTERRUPTED)
  }
  process.once('SIGINT', onSignal)
  process.once('SIGTERM', onSignal)
  try {
    const here = servicesHere(config)
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

    // A fresh twin: old service/gpu files, truth and logs belong to a previous run.
    for (const dir of [paths.services, paths.gpus, paths.truthDir, paths.logs])
      rmSync(dir, {recursive: true, force: true})
    for (const dir of [paths.services, paths.gpus, paths.truthDir, paths.logs]) mkdirSync(dir, {recursive: true})
    writeJsonAtomic(paths.config, config)
    writeNvidiaSmi(stateDir, config.gpus, config.rails?.nics.map(n => ({name: n.name, gpu: n.gpu})) ?? [], {
      hideProcesses: config.gpuView?.hideProcesses ?? false,
    })
    if (config.rails) {
      await createRails(config.rails, stateDir)
      railsMade = true
    }

    const deadline = Date.now() + (options.waitS ?? UP_DEFAULTS.waitS) * 1000
    const start = (service: Service): ProcRef => {
      const ref = startService(config, service)
      started.push([service, ref])
      lock.services[service] = ref
      writeLock(stateDir, lock)
      return ref
    }
    // Launch order prefill -> decode -> router, as SGLang's fixture. The router process starts without waiting
    // (node start-up is the slow part here) but, like sgl-model-gateway, only turns ready once both workers
    // pass its health probes; decode connects to prefill lazily, so it need not wait for prefill either.
    // On a node of a twin that spans nodes, only this node's services; a router waits for workers on other nodes
    // as the gateway does (start the workers' nodes first, or give --wait the time they take).
    const refs: Partial<Record<Service, ProcRef>> = {}
    for (const service of ['prefill', 'decode', 'router'] as const)
      if (here.includes(service)) refs[service] = start(service)
    const [pf, df] = await Promise.all(
      (['prefill', 'decode'] as const).map(s => (refs[s] ? waitHealthy(config, s, refs[s], deadline) : undefined)),
    )
    if (refs.router) await waitHealthy(config, 'router', refs.router, deadline)

    const deploymentFile = await writeDeploymentFile(config)
    lock.owner = {pid: 0, start: ''} // from here on the services alone hold the state dir
    writeLock(stateDir, lock)
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
    await Promise.all(started.map(([, ref]) => stopGroup(ref, 3000, 2000)))
    for (const [service] of started) rmSync(paths.service(service), {force: true})
    if (railsMade && config.rails) await destroyRails(config.rails, stateDir).catch(() => undefined)
    removeLock(stateDir)
    if (error instanceof SimError) throw error
    throw unavailable(`sim up failed: ${(error as Error).message}`, downHint(stateDir), error)
  } finally {
    process.off('SIGINT', onSignal)
    process.off('SIGTERM', onSignal)
  }
}
