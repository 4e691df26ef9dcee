import {rmSync} from 'node:fs'
import {performance} from 'node:perf_hooks'

import {readJson} from '../lifecycle/files.js'
import {readLock, type Service, writeLock} from '../lifecycle/lock.js'
import {probeBind} from '../lifecycle/ports.js'
import {isSameProcess, stopGroup} from '../lifecycle/procs.js'
import {badInput, SimError, unavailable} from '../lifecycle/sim-error.js'
import {dataPorts, type VllmTwinConfig, vllmPaths} from './config.js'
import {startVllmService, waitVllmHealthy} from './up.js'

/**
 * `sim restart <service>` of a vLLM twin: stop it, start it again with the same command line, ports and
 * environment, wait until it serves. A restarted prefill has a new engine id and has lost every lease it held
 * (the blocks went with the process), as a restarted vLLM has.
 */
export async function vllmRestart(stateDir: string, svc: Service, waitS = 30) {
  const c = readJson<VllmTwinConfig>(vllmPaths(stateDir).config)
  const lock = readLock(stateDir)
  if (!c || !lock) throw badInput(`no twin runs in ${stateDir}`, `pdchaos sim up --engine vllm --state-dir ${stateDir}`)
  const t0 = performance.now()
  const old = lock.services[svc]
  if (old) await stopGroup(old)
  rmSync(vllmPaths(stateDir).service(svc), {force: true})
  const ports =
    svc === 'router'
      ? [c.ports.proxy]
      : svc === 'prefill'
        ? [c.ports.prefill, c.sideChannel.prefill, ...dataPorts(c, 'prefill')]
        : [c.ports.decode, c.sideChannel.decode]
  const portDeadline = Date.now() + 5000
  for (const port of ports)
    while ((await probeBind(c.host, port)) === 'EADDRINUSE') {
      if (Date.now() > portDeadline)
        throw unavailable(`port ${port} of ${svc} is still in use after stopping it`, 'find the holder with ss -ltnp')
      await new Promise(r => setTimeout(r, 50))
    }
  const ref = startVllmService(c, svc)
  lock.services[svc] = ref
  writeLock(stateDir, lock)
  try {
    await waitVllmHealthy(c, svc, ref, Date.now() + waitS * 1000)
    const file = readJson<{workerPids?: number[]}>(vllmPaths(stateDir).service(svc))
    return {
      service: svc,
      previousPid: old?.pid ?? null,
      pid: ref.pid,
      rankPids: file?.workerPids ?? [],
      rankPorts: [] as Array<{tpRank: number; zmqPort: number; dataPort?: number}>,
      healthyMs: Math.round(performance.now() - t0),
    }
  } catch (error) {
    if (isSameProcess(ref)) await stopGroup(ref, 3000, 2000)
    if (error instanceof SimError) throw error
    throw unavailable(`restart of ${svc} failed: ${(error as Error).message}`, `read ${vllmPaths(stateDir).log(svc)}`)
  }
}
