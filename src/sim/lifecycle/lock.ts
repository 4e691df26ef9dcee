import {mkdirSync, openSync, closeSync, readFileSync, renameSync, rmSync, writeFileSync} from 'node:fs'
import {dirname} from 'node:path'

import {badInput} from './sim-error.js'
import type {Role} from '../sim-config.js'
import {simPaths} from '../sim-config.js'
import {isSameProcess, type ProcRef, refOf} from './procs.js'

/**
 * DIR/sim.lock: who owns the state dir. Created exclusively by `up`; holds the `up` process and the
 * service leaders (pid + start time), so liveness is checked against the processes themselves.
 */

export type Service = Role | 'router'
export const SERVICES: Service[] = ['prefill', 'decode', 'router']

export interface LockFile {
  owner: ProcRef
  createdAt: number
  services: Partial<Record<Service, ProcRef>>
}

export function readLock(stateDir: string): LockFile | undefined {
  try {
    return JSON.parse(readFileSync(simPaths(stateDir).lock, 'utf8')) as LockFile
  } catch {
    return undefined
  }
}

/** The live processes a lock names (its owner while `up` runs, then the services). */
export function liveHolders(lock: LockFile): ProcRef[] {
  return [lock.owner, ...Object.values(lock.services)].filter((r): r is ProcRef => isSameProcess(r))
}

export const downHint = (stateDir: string): string => `pdchaos sim down --state-dir ${stateDir}`

/**
 * Take the lock for `up`, or bad input when a live twin (or another `up`) holds the state dir. A dead lock is replaced.
 */
export function acquireLock(stateDir: string): LockFile {
  const file = simPaths(stateDir).lock
  mkdirSync(dirname(file), {recursive: true})
  const me = refOf(process.pid)!
  const lock: LockFile = {owner: me, createdAt: Date.now(), services: {}}
  for (let attempt = 0; attempt < 3; attempt++) {
    try {
      const fd = openSync(file, 'wx')
      try {
        writeFileSync(fd, JSON.stringify(lock))
      } finally {
        closeSync(fd)
      }
      return lock
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== 'EEXIST') throw error
    }
    const held = readLock(stateDir)
    const live = held ? liveHolders(held) : []
    if (live.length > 0) {
      throw badInput(
        `state dir ${stateDir} is in use by a running twin (pid ${live.map(r => r.pid).join(', ')})`,
        downHint(stateDir),
      )
    }
    if (!held) {
      // Being written by a concurrent `up` right now, or unreadable: treat a fresh one as busy.
      throw badInput(`state dir ${stateDir} is locked by another pdchaos sim command (${file})`, downHint(stateDir))
    }
    rmSync(file, {force: true}) // stale: every process it names is gone
  }
  throw badInput(`could not lock state dir ${stateDir}`, downHint(stateDir))
}

export function writeLock(stateDir: string, lock: LockFile): void {
  const file = simPaths(stateDir).lock
  const tmp = `${file}.${process.pid}.tmp`
  writeFileSync(tmp, JSON.stringify(lock))
  renameSync(tmp, file)
}

export function removeLock(stateDir: string): void {
  rmSync(simPaths(stateDir).lock, {force: true})
}
