import {hostname} from 'node:os'

import {PdError, oneLine} from '../../errors.js'
import type {Host} from '../../hosts/host.js'
import {describeUnsafe, type UnsafeFinding} from './host-safety.js'
import {listLeases, localStartTicks, revertLease, type ActiveLease, type ActiveState, type RevertedBy} from './lease.js'

/**
 * `pdchaos recover`: revert every lease pdchaos left on the host from the lease files alone (no local state), then
 * list the state dir again to verify that none is left. Idempotent: a second run finds nothing to recover.
 */

/** refused: a file of the lease is another user's, or others can write it: its script is never run (issue 12, S1). */
export type RecoverAction = 'reverted' | 'already-reverted' | 'gone' | 'skipped' | 'in-progress' | 'failed' | 'refused'

export interface RecoverOutcome {
  id: string
  fault: string | null
  /** What the lease was when recover found it. */
  stateBefore: ActiveState
  expiresAt: number | null
  action: RecoverAction
  revertedBy: RevertedBy | null
  exitCode: number | null
  output: string
  ms: number
  /** Its revert ran to exit 0 (or it needed none) and its lease file is gone. */
  clean: boolean
  why?: string
}

export interface RecoverReport {
  host: string
  stateDir: string
  recovered: RecoverOutcome[]
  /** Nothing was left to recover. */
  alreadyClean: boolean
  /** Every lease recover acted on is reverted with exit 0 and no lease file remains (skipped ones aside). */
  clean: boolean
  /** Ids of leases still active after recover (skipped ones included). */
  remaining: string[]
  /** Lease files refused because another user owns or can write them, each with its owner; none was read or run. */
  refused: UnsafeFinding[]
}

export interface RecoverOptions {
  /** Also revert leases held by a pdchaos process still running on this machine. */
  all?: boolean
  /** How long to wait for a lease another party is reverting (default 30 s). */
  waitMs?: number
}

/** The owner is a process alive on this machine (same pid AND start time), i.e. a run still in progress. */
export function ownerIsLiveHere(lease: ActiveLease): boolean {
  const o = lease.owner
  if (!o || o.hostname !== hostname() || !Number.isInteger(o.pid)) return false
  const ticks = localStartTicks(o.pid)
  return ticks !== null && (o.startTicks === null || o.startTicks === ticks)
}

export async function recoverAll(host: Host, stateDir: string, opts: RecoverOptions = {}): Promise<RecoverReport> {
  const before = await listLeases(host, stateDir)
  const recovered = await Promise.all(before.active.map(lease => recoverOne(host, stateDir, lease, opts)))
  let remaining: string[]
  try {
    const after = before.active.length === 0 ? before : await listLeases(host, stateDir)
    remaining = after.active.map(l => l.id)
  } catch (error) {
    // The host went away mid-recover: nothing is verified, so every lease counts as possibly left.
    remaining = before.active.map(l => l.id)
    for (const o of recovered) if (o.clean) Object.assign(o, {clean: false, why: `could not verify: ${oneLine(error)}`})
  }
  for (const o of recovered) {
    if (o.clean && remaining.includes(o.id)) {
      o.clean = false
      o.why = 'its lease file is still on the host after the revert'
    }
  }
  // A refused lease is not ours to revert: it is reported (and makes the exit 2), not counted as left unclean.
  const setAside = new Set(recovered.filter(o => o.action === 'skipped' || o.action === 'refused').map(o => o.id))
  return {
    host: host.describe(),
    stateDir,
    recovered,
    alreadyClean: before.active.length === 0 && before.unsafe.length === 0,
    clean: recovered.every(o => o.clean || setAside.has(o.id)) && remaining.every(id => setAside.has(id)),
    remaining,
    refused: before.unsafe,
  }
}

async function recoverOne(
  host: Host,
  stateDir: string,
  lease: ActiveLease,
  opts: RecoverOptions,
): Promise<RecoverOutcome> {
  const base = {
    id: lease.id,
    fault: lease.fault ?? null,
    stateBefore: lease.state,
    expiresAt: lease.expiresAt ?? null,
    revertedBy: null,
    exitCode: null,
    output: '',
    ms: 0,
  }
  if (lease.unsafe)
    return {
      ...base,
      action: 'refused',
      clean: false,
      why: `refusing ${describeUnsafe(lease.unsafe)}; its revert script is not run`,
    }
  if (!opts.all && ownerIsLiveHere(lease)) {
    return {
      ...base,
      action: 'skipped',
      clean: false,
      why: `held by a pdchaos still running here (pid ${lease.owner!.pid}); use --all to revert it anyway`,
    }
  }
  try {
    const r = await revertLease(host, stateDir, lease.id, 'recover', {waitMs: opts.waitMs ?? 30_000})
    const common = {...base, revertedBy: r.byWhom, exitCode: r.exitCode, output: r.output, ms: Math.round(r.ms)}
    switch (r.status) {
      case 'reverted':
      case 'already-reverted':
        return {
          ...common,
          action: r.status,
          clean: r.exitCode === 0,
          ...(r.exitCode === 0 ? {} : {why: `its revert script exited ${r.exitCode}`}),
        }
      case 'unknown':
        return {...common, action: 'gone', clean: true}
      case 'in-progress':
        return {...common, action: 'in-progress', clean: false, why: 'another process is still reverting it'}
    }
  } catch (error) {
    // The host-side checks refused it (a file turned unsafe after the listing): refused, not failed.
    if (error instanceof PdError && error.code === 'E_UNSAFE_STATE_DIR')
      return {...base, action: 'refused', clean: false, why: oneLine(error)}
    return {...base, action: 'failed', clean: false, why: oneLine(error)}
  }
}

/** Several hosts' recoveries as one: clean only when every host is. */
export function combinedRecovery(parts: RecoverReport[]): RecoverReport {
  return {
    host: parts.map(p => p.host).join(', '),
    stateDir: parts.map(p => p.stateDir).join(', '),
    recovered: parts.flatMap(p => p.recovered),
    alreadyClean: parts.every(p => p.alreadyClean),
    clean: parts.every(p => p.clean),
    remaining: parts.flatMap(p => p.remaining),
    refused: parts.flatMap(p => p.refused),
  }
}
