import {hostname, userInfo} from 'node:os'
import {randomBytes} from 'node:crypto'

import {PdError} from '../../errors.js'
import {ExitCode} from '../../exit-codes.js'
import {localStartTicks} from './lease.js'
import type {Host} from '../../hosts/host.js'

/**
 * The run lock on the host: two chaos runs against one deployment never overlap. The lock file is created with
 * O_EXCL (sh's noclobber), names its owner and expires, so a lock left by a dead pdchaos is taken over after its
 * expiry instead of blocking every later run.
 */

export interface LockBody {
  token: string
  owner: string
  /** The machine and process holding it: a lock whose owner died on this machine is taken over at once. */
  hostname: string
  pid: number
  startTicks: number | null
  /** Held until expiry even after its owner exits (inject --hold leaves its fault in place that long). */
  untilExpiry?: boolean
  command: string
  acquiredAt: number
  expiresAt: number
}

export interface HeldLock {
  body: LockBody
  file: string
  release(): Promise<void>
}

// $1 dir, $2 body. Prints "ok" on success, else "held" + host epoch ms + the current body.
const ACQUIRE = 'mkdir -p "$1" || exit 1; if ( set -C; printf "%s" "$2" > "$1/lock.json" ) 2>/dev/null; then echo ok; else echo held; date +%s%3N; cat "$1/lock.json"; fi'
// $1 dir, $2 the exact stale body: remove only if the file still holds it (nobody took it over meanwhile).
const BREAK = '[ "$(cat "$1/lock.json" 2>/dev/null)" = "$2" ] && rm -f "$1/lock.json"; true'
// $1 dir, $2 token: remove only our own lock.
const RELEASE = 'grep -q -- "$2" "$1/lock.json" 2>/dev/null && rm -f "$1/lock.json"; true'

export async function acquireHostLock(host: Host, stateDir: string, opts: {command: string; ttlMs: number; timeoutMs?: number; untilExpiry?: boolean}): Promise<HeldLock> {
  const timeoutMs = opts.timeoutMs ?? 10_000
  const body: LockBody = {
    token: randomBytes(8).toString('hex'),
    owner: `${userInfo().username}@${hostname()} pid ${process.pid}`,
    hostname: hostname(),
    pid: process.pid,
    startTicks: localStartTicks(process.pid),
    command: opts.command,
    acquiredAt: Date.now(),
    expiresAt: Date.now() + opts.ttlMs,
    ...(opts.untilExpiry ? {untilExpiry: true} : {}),
  }
  const text = JSON.stringify(body)
  for (let attempt = 0; attempt < 2; attempt++) {
    const res = await host.run(['sh', '-c', ACQUIRE, 'sh', stateDir, text], {timeoutMs, sudo: true})
    if (res.code !== 0) {
      throw new PdError(`cannot write the pdchaos lock in ${stateDir} on ${host.describe()}: ${res.stderr.trim() || `exit ${res.code}`}`, {
        exit: ExitCode.unreachable, suggestion: 'check the deployment stateDir and the sudo policy',
      })
    }
    const lines = res.stdout.split('\n')
    if (lines[0] === 'ok') {
      const file = `${stateDir}/lock.json`
      return {body, file, release: async () => { await host.run(['sh', '-c', RELEASE, 'sh', stateDir, body.token], {timeoutMs, sudo: true}) }}
    }
    const hostNow = Number(lines[1])
    const currentText = lines.slice(2).join('\n')
    let current: Partial<LockBody> = {}
    try {
      current = JSON.parse(currentText) as Partial<LockBody>
    } catch { /* unreadable: treat as held until someone removes it */ }
    const expired = typeof current.expiresAt === 'number' && Number.isFinite(hostNow) && current.expiresAt < hostNow
    if (attempt === 0 && (expired || ownerDiedHere(current))) {
      await host.run(['sh', '-c', BREAK, 'sh', stateDir, currentText], {timeoutMs, sudo: true})
      continue
    }
    const until = typeof current.expiresAt === 'number' ? ` until ${new Date(current.expiresAt).toISOString()}` : ''
    throw new PdError(`another chaos run holds the lock on ${host.describe()}: ${current.owner ?? 'unknown owner'} (${current.command ?? 'unknown command'})${until}`, {
      exit: ExitCode.badInput, code: 'E_LOCKED',
      suggestion: `wait for it to finish, or if that run is dead remove ${stateDir}/lock.json after checking with \`pdchaos status\``,
    })
  }
  throw new PdError(`the pdchaos lock on ${host.describe()} changed hands while taking it`, {exit: ExitCode.badInput, code: 'E_LOCKED', suggestion: 'try again'})
}

/** The owner ran on this machine and that process (pid + start time) is gone: the lock is orphaned. */
function ownerDiedHere(lock: Partial<LockBody>): boolean {
  if (lock.untilExpiry || lock.hostname !== hostname() || typeof lock.pid !== 'number') return false
  const ticks = localStartTicks(lock.pid)
  return ticks === null || (lock.startTicks !== undefined && lock.startTicks !== null && ticks !== lock.startTicks)
}
