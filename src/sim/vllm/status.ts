import {readJson} from '../lifecycle/files.js'
import {readLock} from '../lifecycle/lock.js'
import {isSameProcess, procStart} from '../lifecycle/procs.js'
import {simPaths} from '../sim-config.js'
import {type VllmTwinConfig, vllmPaths} from './config.js'
import {vllmEndpoints, vllmHealthUrl} from './up.js'

async function get(url: string): Promise<number> {
  try {
    const res = await fetch(url, {signal: AbortSignal.timeout(1000)})
    await res.arrayBuffer()
    return res.status
  } catch {
    return 0
  }
}

/** The SGLang twin's `SimStatusResult`, restated (importing it would make an import circle with the hook). */
export interface VllmStatusResult {
  stateDir: string
  running: boolean
  services: Array<{
    service: 'prefill' | 'decode' | 'router'
    running: boolean
    pid: number | null
    url: string
    port: number
    health: number
    ranks: Array<{tpRank: number; pid: number; alive: boolean}>
  }>
  gpus: Array<{index: number; uuid: string; pid: number | null}>
  deploymentFile: string | null
}

/** `sim status` of a vLLM twin, in the SGLang twin's shape (ranks: the engine-core and worker processes). */
export async function vllmStatus(stateDir: string): Promise<VllmStatusResult> {
  const c = readJson<VllmTwinConfig>(vllmPaths(stateDir).config)
  if (!c) return {stateDir, running: false, services: [], gpus: [], deploymentFile: null}
  const lock = readLock(stateDir)
  const e = vllmEndpoints(c)
  const services = await Promise.all(
    (['prefill', 'decode', 'router'] as const).map(async service => {
      const ref = lock?.services[service]
      const running = isSameProcess(ref)
      const file = readJson<{workerPids?: number[]}>(vllmPaths(stateDir).service(service))
      const port = service === 'router' ? c.ports.proxy : c.ports[service]
      return {
        service,
        running,
        pid: running ? ref!.pid : null,
        url: e[service],
        port,
        health: running ? await get(vllmHealthUrl(c, service)) : 0,
        // workerPids: the engine core, then one per TP rank (at TP 1 the worker runs inside the engine core).
        ranks: (running ? (file?.workerPids ?? []) : [])
          .slice(c.tp > 1 ? 1 : 0, c.tp > 1 ? undefined : 1)
          .map((pid, tpRank) => ({tpRank, pid, alive: procStart(pid) !== undefined})),
      }
    }),
  )
  const running = services.some(s => s.running)
  return {stateDir, running, services, gpus: [], deploymentFile: running ? simPaths(stateDir).deploymentFile : null}
}
