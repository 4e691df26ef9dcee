import {type ChildProcess, spawn} from 'node:child_process'
import {existsSync, readFileSync, readdirSync} from 'node:fs'

import type {Lease} from '../../src/faults/lease/lease.js'
import {entryArgv} from '../../src/sim/entry.js'
import {killAll, pidsMatching} from '../hosts/proc.js'

/** Lines the marker file holds: how many times a revert ran. */
export function markerCount(path: string): number {
  return existsSync(path) ? readFileSync(path, 'utf8').split('\n').filter(Boolean).length : 0
}

/** Files under <stateDir>/leases (not done/): what an active lease leaves. */
export function activeFiles(stateDir: string): string[] {
  const dir = `${stateDir}/leases`
  return existsSync(dir) ? readdirSync(dir).filter(f => /\.(json|revert\.sh|reverting\.sh)$/.test(f)) : []
}

/** Reverter processes of a state dir (their argv names it). */
export const reverters = (stateDir: string): number[] => pidsMatching(`pdchaos-reverter watch ${stateDir} `)

export interface Child {
  proc: ChildProcess
  stdout: () => string
  stderr: () => string
  /** Resolves with the armed lease, or null when the child exits first; bounded. */
  lease: Promise<Lease | null>
  /** Resolves once stderr has "START" (the child is about to create its lease). */
  started: Promise<void>
  exit: Promise<{code: number | null; signal: NodeJS.Signals | null}>
}

export function spawnChild(args: string[], env: Record<string, string> = {}, deadlineMs = 30_000): Child {
  const {command, args: argv} = entryArgv(new URL('./lease-child.mjs', import.meta.url).href, ...args)
  const proc = spawn(command, argv, {stdio: ['ignore', 'pipe', 'pipe'], env: {...process.env, ...env}})
  let out = ''
  let err = ''
  proc.stdout!.on('data', (c: Buffer) => {
    out += c.toString()
  })
  proc.stderr!.on('data', (c: Buffer) => {
    err += c.toString()
  })
  const exit = new Promise<{code: number | null; signal: NodeJS.Signals | null}>(resolve =>
    proc.once('exit', (code, signal) => resolve({code, signal})),
  )
  const poll = <T>(get: () => T | undefined): Promise<T | null> =>
    new Promise(resolve => {
      const until = Date.now() + deadlineMs
      const tick = (): void => {
        const v = get()
        if (v !== undefined) {
          resolve(v)
          return
        }
        if (proc.exitCode !== null || proc.signalCode !== null || Date.now() > until) {
          resolve(get() ?? null)
          return
        }
        setTimeout(tick, 5)
      }
      tick()
    })
  const lease = poll(() => {
    const m = /^LEASE (.*)$/m.exec(out)
    return m ? (JSON.parse(m[1]!) as Lease) : undefined
  })
  const started = poll(() => (err.includes('START') ? true : undefined)).then(() => undefined)
  return {proc, stdout: () => out, stderr: () => err, lease, started, exit}
}

export function killChild(c: Child | undefined): void {
  if (c?.proc.pid !== undefined && c.proc.exitCode === null && c.proc.signalCode === null) killAll([c.proc.pid])
}

export function sleep(ms: number): Promise<void> {
  return new Promise(r => setTimeout(r, ms))
}

/** Every reverter of any state dir under root (for cleanup). */
export const revertersUnder = (root: string): number[] => pidsMatching(`pdchaos-reverter watch ${root}/`)
