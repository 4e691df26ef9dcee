import {readdirSync} from 'node:fs'
import {join} from 'node:path'

import {type SimConfig, simPaths, servicesHere} from '../sim-config.js'
import {endpoints, readJson, readServiceFile, readSimConfig} from './files.js'
import {readLock, type Service} from './lock.js'
import {gpuUuid} from './nvidia-smi.js'
import {isSameProcess, procStart} from './procs.js'
import {probeHealth} from './services.js'
import {isVllmTwin} from '../vllm/config.js'
import {vllmStatus} from '../vllm/status.js'

export interface ServiceStatus {
  service: Service
  running: boolean
  pid: number | null
  url: string
  port: number
  /** Status code of /health (/readiness for the router); 0 when it did not answer. */
  health: number
  ranks: Array<{tpRank: number; pid: number; alive: boolean; gpu?: number; zmqPort?: number; dataPort?: number}>
}

export interface SimStatusResult {
  stateDir: string
  running: boolean
  services: ServiceStatus[]
  gpus: Array<{index: number; uuid: string; pid: number | null; role?: string; tpRank?: number}>
  deploymentFile: string | null
}

/** The twin's own view of itself: which services run, pids, health, ports, ranks and GPUs. */
export async function simStatus(stateDir: string): Promise<SimStatusResult> {
  if (isVllmTwin(stateDir)) return vllmStatus(stateDir) // engine: vllm (src/sim/vllm/)
  let config: SimConfig
  try {
    config = readSimConfig(stateDir)
  } catch {
    return {stateDir, running: false, services: [], gpus: [], deploymentFile: null}
  }
  const lock = readLock(stateDir)
  const e = endpoints(config)
  const gpuFiles = new Map<number, {pid: number; role: string; tpRank: number}>()
  try {
    for (const f of readdirSync(simPaths(stateDir).gpus)) {
      const m = /^(\d+)\.json$/.exec(f)
      const held = m
        ? readJson<{pid: number; role: string; tpRank: number}>(join(simPaths(stateDir).gpus, f))
        : undefined
      if (m && held && procStart(held.pid) !== undefined) gpuFiles.set(Number(m[1]), held)
    }
  } catch {}

  const services = await Promise.all(
    servicesHere(config).map(async (service): Promise<ServiceStatus> => {
      const ref = lock?.services[service]
      const running = isSameProcess(ref)
      const file = running ? readServiceFile(stateDir, service) : undefined
      const port = config.ports[service]
      const ranks = (file?.rankPids ?? []).map((pid, i) => {
        const gpu = [...gpuFiles].find(([, g]) => g.pid === pid)?.[0]
        // Listed in launch order; on a node of a multi-node instance the TP ranks do not start at 0.
        const ports = file?.rankPorts?.[i]
        const tpRank = ports?.tpRank ?? i
        return {
          tpRank,
          pid,
          alive: procStart(pid) !== undefined,
          gpu,
          zmqPort: ports?.zmqPort,
          dataPort: ports?.dataPort,
        }
      })
      return {
        service,
        running,
        pid: running ? ref!.pid : null,
        url: e[service],
        port,
        health: running ? await probeHealth(config, service, 1000) : 0,
        ranks,
      }
    }),
  )
  const gpus = Array.from({length: config.gpus}, (_, index) => {
    const g = gpuFiles.get(index)
    return {index, uuid: gpuUuid(config.stateDir, index), pid: g?.pid ?? null, role: g?.role, tpRank: g?.tpRank}
  })
  const running = services.some(s => s.running)
  return {stateDir, running, services, gpus, deploymentFile: running ? simPaths(stateDir).deploymentFile : null}
}
