import {rmSync} from 'node:fs'

import {type SimConfig, simPaths} from '../sim-config.js'
import {readJson} from './files.js'
import {destroyRails} from './rails.js'
import {readLock, removeLock, type Service, SERVICES} from './lock.js'
import {type ProcRef, procStart, stopGroup} from './procs.js'
import {badInput, SimError} from './sim-error.js'
import {isTwinStateDir, untrustedBecause} from './state-marker.js'

export interface SimDownResult {
  stateDir: string
  stopped: Array<{service: Service; pid: number}>
  /** True when nothing of this twin was running. */
  wasRunning: boolean
}

/**
 * Stop this state dir's twin; idempotent. Only processes it can prove are its own: those its lock names with the
 * start time (/proc/PID/stat field 22) `up` recorded when it started them, and only from a lock no other user could
 * have written (issue 12, S2). A dir pdchaos did not make for a twin is left untouched.
 */
export async function simDown(stateDir: string, termMs = 5000): Promise<SimDownResult> {
  const paths = simPaths(stateDir)
  if (!isTwinStateDir(stateDir)) return {stateDir, stopped: [], wasRunning: false}
  const untrusted = untrustedBecause(stateDir) ?? untrustedBecause(paths.lock)
  if (untrusted) {
    throw badInput(
      `refusing to stop the processes named in ${paths.lock}: ${untrusted}`,
      'stop them by hand after checking who they are; a twin state dir must be writable only by the user who runs it',
    )
  }
  const lock = readLock(stateDir)
  const targets = new Map<Service, ProcRef>()
  for (const service of SERVICES) {
    const ref = lock?.services[service]
    if (ref && procStart(ref.pid) === ref.start) targets.set(service, ref)
    // The leader is gone but its group may live on: a pid is never reused while a process group carries it.
    else if (ref && procStart(ref.pid) === undefined) targets.set(service, ref)
  }
  const stopped: SimDownResult['stopped'] = []
  // Router first, so nothing new is dispatched while the workers stop.
  const order: Service[] = ['router', 'decode', 'prefill']
  const results = await Promise.all(
    order
      .filter(s => targets.has(s))
      .map(async service => {
        const ref = targets.get(service)!
        const wasAlive = procStart(ref.pid) === ref.start
        const gone = await stopGroup(ref, termMs)
        if (wasAlive) stopped.push({service, pid: ref.pid})
        return {service, pid: ref.pid, gone}
      }),
  )
  const stuck = results.filter(r => !r.gone)
  if (stuck.length > 0) {
    throw new SimError(
      'cleanup-unverified',
      `could not stop ${stuck.map(s => `${s.service} (pid ${s.pid})`).join(', ')} even with SIGKILL`,
      {
        suggestion: `check the processes by hand: ps -o pid,stat,cmd -g ${stuck.map(s => s.pid).join(',')}`,
      },
    )
  }
  for (const service of SERVICES) rmSync(paths.service(service), {force: true})
  rmSync(paths.gpus, {recursive: true, force: true})
  // The rail NICs go with the services that used them (only this twin's: they carry its tag).
  const rails = readJson<SimConfig>(paths.config)?.rails
  if (rails) await destroyRails(rails, stateDir)
  removeLock(stateDir)
  return {stateDir, stopped, wasRunning: stopped.length > 0}
}
