import {hostname, userInfo} from 'node:os'
import {randomBytes} from 'node:crypto'

import {PdError} from '../../errors.js'
import {ExitCode} from '../../exit-codes.js'
import {checkStateDir, localStartTicks} from './lease.js'
import {SAFE_SH, throwIfUnsafe} from './host-safety.js'
import type {Host} from '../../hosts/host.js'

/**
 * The run lock on the host: two chaos runs against one deployment never overlap. The lock file is created with
 * O_EXCL (sh's noclobber), names its owner and expires, so a lock left by a dead pdchaos is taken over after its
 * expiry instead of blocking every later run. Its times are the host's clock, the one the leases and every later
 * pdchaos compare them with. A lock held until expiry (--hold) also lasts as long as any armed lease in the state
 * dir: the fault it left is covered whatever the calibration before it took (issue 12, S5).
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
  /** Host clock, epoch ms. */
  acquiredAt: number
  /** Host clock, epoch ms. */
  expiresAt: number
}

export interface HeldLock {
  body: LockBody
  file: string
  release(): Promise<void>
}

const NOW = "n=$(date +%s%3N 2>/dev/null); case $n in ''|*[!0-9]*) n=$(( $(date +%s) * 1000 ));; esac"
// $1 dir, $2 body without its times, $3 TTL ms. The state dir is made private (0700) or checked (host-safety.ts);
// the times are the host's. Prints "ok", the host clock and the body written; or "held", the host clock, the
// latest expiry of the armed leases (0 when none) and the current body.
const ACQUIRE =
  SAFE_SH +
  `D=$1
pd_make "$D" || exit $?
pd_check_if f "$D/lock.json" || exit 13
${NOW}
b="\${2%\\}},\\"acquiredAt\\":$n,\\"expiresAt\\":$((n + $3))}"
if ( set -C; printf '%s' "$b" > "$D/lock.json" ) 2>/dev/null; then echo ok; echo "$n"; printf '%s' "$b"; exit 0; fi
pd_check_if f "$D/lock.json" || exit 13
m=0
set --
for f in "$D"/leases/*.json; do [ -e "$f" ] || [ -L "$f" ] && set -- "$@" "$f"; done
bad=$(pd_scan all f "$@" 2>&1 >/dev/null)
for f do
  case $bad in *"PDCHAOS-UNSAFE $f$pd_tab"*) continue;; esac
  e=$(sed -n 's/.*"expiresAt":\\([0-9][0-9]*\\).*/\\1/p' "$f" | head -n 1)
  case $e in ''|*[!0-9]*) ;; *) [ "$e" -le "$m" ] || m=$e;; esac
done
echo held; echo "$n"; echo "$m"; cat "$D/lock.json"`
// $1 dir, $2 the exact stale body: remove only if the file still holds it (nobody took it over meanwhile).
const BREAK =
  SAFE_SH +
  'pd_safe_tree "$1" && pd_check_if f "$1/lock.json" || exit 13; [ "$(cat "$1/lock.json" 2>/dev/null)" = "$2" ] && ' +
  'rm -f "$1/lock.json"; true'
// $1 dir, $2 token: remove only our own lock.
const RELEASE =
  SAFE_SH +
  'pd_safe_tree "$1" && pd_check_if f "$1/lock.json" || exit 13; grep -q -- "$2" "$1/lock.json" 2>/dev/null && rm ' +
  '-f "$1/lock.json"; true'

export async function acquireHostLock(
  host: Host,
  stateDir: string,
  opts: {command: string; ttlMs: number; timeoutMs?: number; untilExpiry?: boolean},
): Promise<HeldLock> {
  checkStateDir(stateDir)
  const timeoutMs = opts.timeoutMs ?? 10_000
  const ttlMs = Math.max(0, Math.ceil(opts.ttlMs))
  const partial: Omit<LockBody, 'acquiredAt' | 'expiresAt'> = {
    token: randomBytes(8).toString('hex'),
    owner: `${userInfo().username}@${hostname()} pid ${process.pid}`,
    hostname: hostname(),
    pid: process.pid,
    startTicks: localStartTicks(process.pid),
    command: opts.command,
    ...(opts.untilExpiry ? {untilExpiry: true} : {}),
  }
  const text = JSON.stringify(partial)
  const where = host.describe()
  for (let attempt = 0; attempt < 2; attempt++) {
    const res = await host.run(['sh', '-c', ACQUIRE, 'sh', stateDir, text, String(ttlMs)], {timeoutMs, sudo: true})
    throwIfUnsafe(res, where)
    if (res.code !== 0) {
      throw new PdError(
        `cannot write the pdchaos lock in ${stateDir} on ${where}: ${res.stderr.trim() || `exit ${res.code}`}`,
        {
          exit: ExitCode.unreachable,
          suggestion: 'check the deployment stateDir and the sudo policy',
        },
      )
    }
    const lines = res.stdout.split('\n')
    const hostNow = Number(lines[1])
    if (lines[0] === 'ok') {
      const file = `${stateDir}/lock.json`
      const body: LockBody = {...partial, acquiredAt: hostNow, expiresAt: hostNow + ttlMs}
      return {
        body,
        file,
        release: async () => {
          await host.run(['sh', '-c', RELEASE, 'sh', stateDir, body.token], {timeoutMs, sudo: true})
        },
      }
    }
    const leasesUntil = Number(lines[2])
    const currentText = lines.slice(3).join('\n')
    let current: Partial<LockBody> = {}
    try {
      current = JSON.parse(currentText) as Partial<LockBody>
    } catch {
      /* unreadable: treat as held until someone removes it */
    }
    const until = heldUntil(current, leasesUntil)
    const expired = until !== undefined && Number.isFinite(hostNow) && until < hostNow
    if (attempt === 0 && (expired || ownerDiedHere(current))) {
      await host.run(['sh', '-c', BREAK, 'sh', stateDir, currentText], {timeoutMs, sudo: true})
      continue
    }
    const untilText = until !== undefined ? ` until ${new Date(until).toISOString()} (host clock)` : ''
    throw new PdError(
      `another chaos run holds the lock on ${where}: ${current.owner ?? 'unknown owner'} ` +
        `(${current.command ?? 'unknown command'})${untilText}`,
      {
        exit: ExitCode.badInput,
        code: 'E_LOCKED',
        suggestion:
          `wait for it to finish, or if that run is dead remove ${stateDir}/lock.json after checking ` +
          `with \`pdchaos status\``,
      },
    )
  }
  throw new PdError(`the pdchaos lock on ${where} changed hands while taking it`, {
    exit: ExitCode.badInput,
    code: 'E_LOCKED',
    suggestion: 'try again',
  })
}

/**
 * When a lock stops holding, on the host clock: its own expiry, or for a lock held until expiry (--hold) the later
 * of that and the latest armed lease's expiry (the lease began after calibration, so it may outlast the lock's TTL).
 */
export function heldUntil(lock: Partial<LockBody>, leasesUntil: number): number | undefined {
  if (typeof lock.expiresAt !== 'number') return undefined
  return lock.untilExpiry && Number.isFinite(leasesUntil) ? Math.max(lock.expiresAt, leasesUntil) : lock.expiresAt
}

/** The owner ran on this machine and that process (pid + start time) is gone: the lock is orphaned. */
function ownerDiedHere(lock: Partial<LockBody>): boolean {
  if (lock.untilExpiry || lock.hostname !== hostname() || typeof lock.pid !== 'number') return false
  const ticks = localStartTicks(lock.pid)
  return ticks === null || (lock.startTicks !== undefined && lock.startTicks !== null && ticks !== lock.startTicks)
}
