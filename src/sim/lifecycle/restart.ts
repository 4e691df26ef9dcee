import {rmSync} from 'node:fs'
import {performance} from 'node:perf_hooks'

import {badInput, SimError, unavailable} from './sim-error.js'
import {distEndpoint, isFollower, serviceHost, servicesHere, simPaths} from '../sim-config.js'
import {readSimConfig} from './files.js'
import {readLock, type Service, SERVICES, writeLock} from './lock.js'
import {probeBind} from './ports.js'
import {isSameProcess, stopGroup} from './procs.js'
import {startService, waitHealthy} from './services.js'
import {isVllmTwin} from '../vllm/config.js'
import {vllmRestart} from '../vllm/restart.js'

export interface SimRestartResult {
  service: Service
  previousPid: number | null
  pid: number
  rankPids: number[]
  rankPorts: Array<{tpRank: number; zmqPort: number; dataPort?: number}>
  healthyMs: number
}

const sleep = (ms: number): Promise<void> => new Promise(r => setTimeout(r, ms))

/**
 * Restart one service as an operator's restart command would: stop it, start it with the same ports and
 * environment, wait until it serves. Prefill's rank ZMQ ports are random, so they change.
 */
export async function simRestart(stateDir: string, service: string, waitS = 30): Promise<SimRestartResult> {
  if (!(SERVICES as string[]).includes(service))
    throw badInput(`unknown service "${service}"`, 'restart one of: prefill, decode, router')
  const svc = service as Service
  if (isVllmTwin(stateDir)) return vllmRestart(stateDir, svc, waitS) // engine: vllm (src/sim/vllm/)
  const config = readSimConfig(stateDir)
  if (!servicesHere(config).includes(svc)) {
    throw badInput(
      `${svc} does not run on this node of the twin (it runs ${servicesHere(config).join(', ')}; ${svc} is ` +
        `at ${serviceHost(config, svc)})`,
      `run sim restart ${svc} on the node that runs it`,
    )
  }
  const lock = readLock(stateDir)
  if (!lock) throw badInput(`no twin runs in ${stateDir} (no sim.lock)`, `pdchaos sim up --state-dir ${stateDir}`)
  const t0 = performance.now()
  const old = lock.services[svc]
  if (old) await stopGroup(old)
  rmSync(simPaths(stateDir).service(svc), {force: true})

  // Same ports as before: wait (bounded) until the old process has let go of them.
  const ports =
    svc === 'prefill'
      ? [config.ports.prefill, ...(isFollower(config, 'prefill') ? [] : [config.ports.bootstrap])]
      : svc === 'decode'
        ? [config.ports.decode]
        : [config.ports.router, config.ports.routerMetrics]
  // Node 0 of a multi-node instance also listens on the dist-init-addr (the other nodes rejoin there).
  if (config.dist?.role === svc && config.dist.nodeRank === 0) ports.push(distEndpoint(config.dist).port)
  const portDeadline = Date.now() + 5000
  for (const port of ports) {
    while ((await probeBind(config.host, port)) === 'EADDRINUSE') {
      if (Date.now() > portDeadline)
        throw unavailable(
          `port ${port} of ${svc} is still in use after stopping it`,
          'find the holder with ss -ltnp and stop it',
        )
      await sleep(50)
    }
  }

  const ref = startService(config, svc)
  lock.services[svc] = ref
  writeLock(stateDir, lock)
  try {
    const file = await waitHealthy(config, svc, ref, Date.now() + waitS * 1000)
    return {
      service: svc,
      previousPid: old?.pid ?? null,
      pid: ref.pid,
      rankPids: file.rankPids ?? [],
      rankPorts: file.rankPorts ?? [],
      healthyMs: Math.round(performance.now() - t0),
    }
  } catch (error) {
    // Nothing half-started: the failed service is stopped again (the others keep running).
    if (isSameProcess(ref)) await stopGroup(ref, 3000, 2000)
    if (error instanceof SimError) throw error
    throw unavailable(`restart of ${svc} failed: ${(error as Error).message}`, `read ${simPaths(stateDir).log(svc)}`)
  }
}
