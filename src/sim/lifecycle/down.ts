import {readFileSync, rmSync} from 'node:fs'

import {type SimConfig, simPaths} from '../sim-config.js'
import {readJson, readServiceFile} from './files.js'
import {destroyRails} from './rails.js'
import {readLock, removeLock, type Service, SERVICES} from './lock.js'
import {type ProcRef, procStart, refOf, stopGroup} from './procs.js'
import {SimError} from './sim-error.js'

export interface SimDownResult {
  stateDir: string
  stopped: Array<{service: Service; pid: number}>
  /** True when nothing of this twin was running. */
  wasRunning: boolean
}

/** Clock ticks per second for /proc starttime (USER_HZ, 100 on Linux). */
const HZ = 100
function bootTimeMs(): number | undefined {
  try {
    const m = /^btime (\d+)$/m.exec(readFileSync('/proc/stat', 'utf8'))
    return m ? Number(m[1]) * 1000 : undefined
  } catch {
    return undefined
  }
}

/**
 * A service pid known only from its service file: ours when the process started shortly before the
 * file's startedAt (the file is written by the process itself once it serves).
 */
function refFromServiceFile(pid: number, startedAt: number): ProcRef | undefined {
  const ref = refOf(pid)
  if (!ref) return undefined
  const boot = bootTimeMs()
  if (boot === undefined) return undefined
  const startMs = boot + (Number(ref.start) / HZ) * 1000
  return startMs <= startedAt + 2000 && startedAt - startMs < 120_000 ? ref : undefined
}

/** Stop this state dir's twin (only processes it started, verified by start time); idempotent. */
export async function simDown(stateDir: string, termMs = 5000): Promise<SimDownResult> {
  const paths = simPaths(stateDir)
  const lock = readLock(stateDir)
  const targets = new Map<Service, ProcRef>()
  for (const service of SERVICES) {
    const ref = lock?.services[service]
    if (ref && procStart(ref.pid) === ref.start) targets.set(service, ref)
    else if (ref && procStart(ref.pid) === undefined) targets.set(service, ref) // its group may outlive the leader
    const file = readServiceFile(stateDir, service)
    if (!targets.has(service) && file) {
      const fromFile = refFromServiceFile(file.pid, file.startedAt)
      if (fromFile) targets.set(service, fromFile)
    }
  }
  const stopped: SimDownResult['stopped'] = []
  // Router first, so nothing new is dispatched while the workers stop.
  const order: Service[] = ['router', 'decode', 'prefill']
  const results = await Promise.all(order.filter((s) => targets.has(s)).map(async (service) => {
    const ref = targets.get(service)!
    const wasAlive = procStart(ref.pid) === ref.start
    const gone = await stopGroup(ref, termMs)
    if (wasAlive) stopped.push({service, pid: ref.pid})
    return {service, pid: ref.pid, gone}
  }))
  const stuck = results.filter((r) => !r.gone)
  if (stuck.length > 0) {
    throw new SimError('cleanup-unverified', `could not stop ${stuck.map((s) => `${s.service} (pid ${s.pid})`).join(', ')} even with SIGKILL`, {
      suggestion: `check the processes by hand: ps -o pid,stat,cmd -g ${stuck.map((s) => s.pid).join(',')}`,
    })
  }
  for (const service of SERVICES) rmSync(paths.service(service), {force: true})
  rmSync(paths.gpus, {recursive: true, force: true})
  // The rail NICs go with the services that used them (only this twin's: they carry its tag).
  const rails = readJson<SimConfig>(paths.config)?.rails
  if (rails) await destroyRails(rails, stateDir)
  removeLock(stateDir)
  return {stateDir, stopped, wasRunning: stopped.length > 0}
}
