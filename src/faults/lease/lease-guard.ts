import {PdError, oneLine} from '../../errors.js'
import {ExitCode} from '../../exit-codes.js'
import type {Host} from '../../hosts/host.js'
import {createLease, describeExpiry, revertLease, type Lease, type LeaseSpec, type RevertResult} from './lease.js'

/**
 * The in-process half of the leases a command holds: every lease it creates is tracked, and on SIGINT or SIGTERM
 * they are all reverted before the process exits (3); a command that stops on the first signal itself (actOn
 * 'second': inject, suite) leaves that one to its own flow, and the guard acts on the next. A further signal while
 * reverting does not skip anything; it says the reverts are running. A lease that cannot be reverted (connection
 * lost, script failed) makes the exit 4, naming each lease and when the host reverts it by itself.
 */

export interface GuardOptions {
  /** Progress and warnings (stderr by default; stdout belongs to results). */
  say?: (line: string) => void
  /** How the process ends after a signal (process.exit, after the onSignalExit work, by default). */
  exit?: (code: number) => void
  /** Deadline for each revert (default 30 s). */
  revertTimeoutMs?: number
  /**
   * 'second': the command stops on the first SIGINT or SIGTERM itself (it reverts through its own flow, then writes its
   * journal), so the guard only says so and acts on a second signal. Default 'first': the guard reverts and exits.
   */
  actOn?: 'first' | 'second'
}

/** Work that must run before a guard ends the process after a signal (the run lock's release on each host). */
const beforeSignalExit = new Set<() => Promise<unknown>>()

/**
 * Register work to run (bounded: 5 s in all) before a guard ends the process after a signal, which skips every
 * finally block: without it a Ctrl-C left the run lock held on the host until its TTL. Returns the unregister.
 */
export function onSignalExit(fn: () => Promise<unknown>): () => void {
  beforeSignalExit.add(fn)
  return () => beforeSignalExit.delete(fn)
}

/** End the process after a signal: the onSignalExit work first (bounded), then process.exit(code). */
export function exitAfterSignal(code: number): void {
  const all = Promise.all([...beforeSignalExit].map(fn => fn().catch(() => undefined)))
  const bound = new Promise(resolve => setTimeout(resolve, 5000).unref())
  void Promise.race([all, bound]).then(() => process.exit(code))
}

export interface RevertAllOutcome {
  results: RevertResult[]
  /** Leases not known to be clean: the revert could not run, or its script failed. */
  failures: Array<{lease: Lease; why: string}>
}

export class LeaseGuard {
  private readonly active = new Map<string, Lease>()
  private readonly pending = new Set<Promise<unknown>>()
  private stopping = false
  private readonly say: (line: string) => void
  private readonly exit: (code: number) => void
  private readonly handler = (signal: NodeJS.Signals): void => this.onSignal(signal)

  constructor(
    readonly host: Host,
    readonly stateDir: string,
    private readonly opts: GuardOptions = {},
  ) {
    this.say = opts.say ?? (line => process.stderr.write(line + '\n'))
    this.exit = opts.exit ?? exitAfterSignal
  }

  /** Leases created and not yet reverted. */
  leases(): Lease[] {
    return [...this.active.values()]
  }

  get interrupted(): boolean {
    return this.stopping
  }

  install(): this {
    process.on('SIGINT', this.handler)
    process.on('SIGTERM', this.handler)
    return this
  }

  dispose(): void {
    process.removeListener('SIGINT', this.handler)
    process.removeListener('SIGTERM', this.handler)
  }

  /** createLease, tracked from the moment it is asked for: a signal during creation waits for it, then reverts it. */
  async create(spec: LeaseSpec): Promise<Lease> {
    if (this.stopping) throw new PdError('stopping: no new fault is injected', {exit: ExitCode.stopped})
    const p = createLease(this.host, this.stateDir, spec).then(lease => {
      this.active.set(lease.id, lease)
      return lease
    })
    this.pending.add(p)
    try {
      return await p
    } finally {
      this.pending.delete(p)
    }
  }

  track(lease: Lease): void {
    this.active.set(lease.id, lease)
  }

  /**
   * Stop tracking a lease without reverting it: it stays armed and the host's reverter takes it out at expiry (--hold).
   */
  release(id: string): void {
    this.active.delete(id)
  }

  async revert(id: string): Promise<RevertResult> {
    const res = await revertLease(this.host, this.stateDir, id, 'pdchaos', {
      waitMs: this.opts.revertTimeoutMs ?? 30_000,
    })
    if (res.status !== 'in-progress') this.active.delete(id)
    return res
  }

  /** Revert every tracked lease (after waiting for creations under way). Never throws. */
  async revertAll(): Promise<RevertAllOutcome> {
    await Promise.allSettled([...this.pending])
    const leases = this.leases()
    const settled = await Promise.allSettled(leases.map(l => this.revert(l.id)))
    const results: RevertResult[] = []
    const failures: RevertAllOutcome['failures'] = []
    settled.forEach((s, i) => {
      const lease = leases[i]!
      if (s.status === 'rejected') failures.push({lease, why: oneLine(s.reason)})
      else {
        results.push(s.value)
        if (s.value.status === 'in-progress') failures.push({lease, why: 'another process is still reverting it'})
        else if (s.value.exitCode !== 0 && s.value.status !== 'unknown')
          failures.push({lease, why: `its revert script exited ${s.value.exitCode}`})
      }
    })
    return {results, failures}
  }

  private deferred = false

  private onSignal(signal: NodeJS.Signals): void {
    if (this.opts.actOn === 'second' && !this.deferred) {
      // The command stops and reverts through its own flow (and keeps its journal); a second signal is the guard's.
      this.deferred = true
      if (this.active.size + this.pending.size > 0)
        this.say(
          `pdchaos: ${signal}: stopping; the run reverts its ${this.active.size + this.pending.size} lease(s) ` +
            `(${signal} again: revert and exit at once)`,
        )
      return
    }
    if (this.stopping) {
      this.say(
        `pdchaos: ${signal} again: reverts are running for ${this.active.size} lease(s); pdchaos exits when they ` +
          `are done (each lease also reverts itself on the host at its expiry)`,
      )
      return
    }
    this.stopping = true
    const n = this.active.size + this.pending.size
    this.say(`pdchaos: ${signal}: reverting ${n} lease(s) before exit`)
    this.revertAll().then(
      ({results, failures}) => {
        if (failures.length === 0) {
          this.say(`pdchaos: stopped; ${results.length} lease(s) reverted, the host is clean of them`)
          this.exit(ExitCode.stopped)
        } else {
          this.say(`pdchaos: ${cleanupMessage(failures)}`)
          this.exit(ExitCode.cleanupUnverified)
        }
      },
      (error: unknown) => {
        this.say(`pdchaos: reverting failed: ${oneLine(error)}`)
        this.exit(ExitCode.cleanupUnverified)
      },
    )
  }
}

/** "cleanup unverified: lease X (the host reverts it at ... (in 12 s)): why; ..." */
export function cleanupMessage(failures: RevertAllOutcome['failures']): string {
  return `cleanup unverified, the host may still be faulted: ${failures
    .map(
      ({lease, why}) => `lease ${lease.id} (${why}; the host reverts it by itself ${describeExpiry(lease.expiresAt)})`,
    )
    .join('; ')}`
}

/**
 * Run fn with a guard installed; whatever fn does (returns, throws), every lease still tracked is reverted before
 * this returns. A lease that cannot be reverted is a PdError exit 4 naming it.
 */
export async function withLeases<T>(
  host: Host,
  stateDir: string,
  fn: (guard: LeaseGuard) => Promise<T>,
  opts: GuardOptions = {},
): Promise<T> {
  const guard = new LeaseGuard(host, stateDir, opts).install()
  let result: T
  try {
    result = await fn(guard)
  } catch (error) {
    await finish(guard, error)
    throw error
  }
  await finish(guard)
  return result
}

async function finish(guard: LeaseGuard, cause?: unknown): Promise<void> {
  try {
    // After a signal the guard's own handler reverts and exits; do not race it.
    if (guard.interrupted) return
    const {failures} = await guard.revertAll()
    if (failures.length > 0) {
      const also = cause === undefined ? '' : ` (after: ${oneLine(cause)})`
      throw new PdError(cleanupMessage(failures) + also, {
        exit: ExitCode.cleanupUnverified,
        suggestion: 'run `pdchaos recover` once the host is reachable',
      })
    }
  } finally {
    if (!guard.interrupted) guard.dispose()
  }
}
