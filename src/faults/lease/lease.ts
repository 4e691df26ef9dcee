import {randomBytes} from 'node:crypto'
import {readFileSync} from 'node:fs'
import {hostname, userInfo} from 'node:os'

import {PdError, badInput, oneLine} from '../../errors.js'
import {ExitCode} from '../../exit-codes.js'
import type {Host} from '../../hosts/host.js'
import {stateDirProblem} from '../../state-dir.js'
import {sleep} from '../../util/time.js'
import {findUnsafe, throwIfUnsafe, unsafeError, type UnsafeFinding} from './host-safety.js'
import {DISCARD_SH, LIST_SH, PREPARE_SH, REVERTER_SH, WRITE_SH, revertScript} from './reverter-script.js'

/**
 * The lease: what pdchaos put on a host and how to take it out, stored ON the host with a detached reverter that
 * takes it out at the TTL even if pdchaos, or its connection, dies. Create it before injecting; revert it after.
 */

export type RevertedBy = 'reverter' | 'pdchaos' | 'recover'

export interface LeaseOwner {
  user: string
  hostname: string
  pid: number
  /** Start time of the owning process (clock ticks), so a recycled pid is not mistaken for the owner. */
  startTicks: number | null
}

export interface Lease {
  id: string
  fault: string
  params: Record<string, unknown>
  owner: LeaseOwner
  command: string
  /** Host clock, epoch ms. */
  createdAt: number
  ttlMs: number
  /** Host clock, epoch ms: the reverter reverts at this time. */
  expiresAt: number
  revert: string[][]
  reverter: {pid: number; startTicks: number} | null
}

export interface DoneLease extends Lease {
  revertedAt: number
  revertedBy: RevertedBy
  exitStatus: number
}

/**
 * armed: its reverter waits; reverting: claimed by a party now running it; no-script: a lease file without its script.
 */
export type ActiveState = 'armed' | 'reverting' | 'no-script'

export type ActiveLease = Partial<Lease> & {
  id: string
  state: ActiveState
  file?: string
  /** A file of this lease another user owns or can write: it is never read or run (issue 12, S1). */
  unsafe?: UnsafeFinding
}

export interface LeaseListing {
  active: ActiveLease[]
  done: DoneLease[]
  /** Every lease file refused as unsafe (active ones also carry it as `unsafe`), named with its owner. */
  unsafe: UnsafeFinding[]
  /** The host clock when listed (epoch ms). */
  hostNow: number
}

export interface LeaseSpec {
  /** Chosen by the caller when the plan already names host objects after the lease; generated otherwise. */
  id?: string
  fault: string
  params?: Record<string, unknown>
  ttlMs: number
  /** Idempotent revert commands as argv, run in order by the revert script. */
  revert: string[][]
  /** The pdchaos command line that made the lease (for people reading the host). */
  command: string
}

export type RevertStatus = 'reverted' | 'already-reverted' | 'in-progress' | 'unknown'

export interface RevertResult {
  id: string
  /** True when this call ran the revert script. */
  reverted: boolean
  status: RevertStatus
  byWhom: RevertedBy | null
  /** The revert script's exit status (0: every command succeeded), null when no revert ran. */
  exitCode: number | null
  output: string
  /** Host clock when the lease was reverted, null when it was not. */
  revertedAt: number | null
  ms: number
}

/** The TTL is mandatory and bounded: a fault never outlives this on the host, whoever forgets it. */
export const LEASE_TTL_MAX_MS = 3_600_000
export const LEASE_TTL_MIN_MS = 500

const LEASE_ID = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/
const FAULT_NAME = /^[a-z0-9][a-z0-9-]{0,31}$/
const OP_TIMEOUT_MS = 15_000

export const leaseDir = (stateDir: string): string => `${stateDir}/leases`

/**
 * The default TTL a caller gives: long enough for the run (watchdog deadline + one poll + how long the fault is
 * held) plus a margin, never more than the maximum.
 */
export function leaseTtlMs(opts: {
  deadlineSeconds: number
  pollSeconds: number
  holdMs?: number
  marginMs?: number
}): number {
  const ms = Math.ceil(
    (opts.deadlineSeconds + opts.pollSeconds) * 1000 + (opts.holdMs ?? 0) + (opts.marginMs ?? 30_000),
  )
  return Math.min(Math.max(ms, LEASE_TTL_MIN_MS), LEASE_TTL_MAX_MS)
}

/**
 * The run lock's TTL, beside the lease's: a run of N fault scenarios holds the lock for three windows and five
 * minutes of setup each, plus ten minutes; a held fault (--hold) holds it exactly as long as its lease, plus 5 s.
 */
export function runLockTtlMs(opts: {
  deadlineSeconds: number
  pollSeconds: number
  scenarios: number
  holdMs?: number
}): number {
  if (opts.holdMs !== undefined) return opts.holdMs + 5000
  return (opts.scenarios * ((opts.deadlineSeconds + opts.pollSeconds) * 3 + 300) + 600) * 1000
}

export function checkTtl(ttlMs: number): void {
  if (!Number.isInteger(ttlMs) || ttlMs < LEASE_TTL_MIN_MS || ttlMs > LEASE_TTL_MAX_MS) {
    throw badInput(
      `lease TTL ${ttlMs} ms is outside ${LEASE_TTL_MIN_MS} ms .. ${LEASE_TTL_MAX_MS / 60_000} min`,
      `give a TTL of at most ${LEASE_TTL_MAX_MS / 60_000} minutes: a fault must come back out by itself`,
    )
  }
}

/** A fresh id: fault, host-independent UTC time, random suffix. Safe in file, chain and table names. */
export function newLeaseId(fault: string): string {
  const t = new Date().toISOString().replace(/[-:]/g, '').replace(/\..*$/, '').toLowerCase()
  return `${fault}-${t}-${randomBytes(3).toString('hex')}`
}

/** Bad input (exit 2) unless the deployment's stateDir is a path pdchaos may use (state-dir.ts). */
export function checkStateDir(stateDir: string): void {
  const why = stateDirProblem(stateDir)
  if (why)
    throw badInput(
      `state dir ${JSON.stringify(stateDir)} ${why}`,
      'give stateDir in the deployment file as an absolute, normalised path of a directory only pdchaos uses, e.g. ' +
        '/run/pdchaos',
    )
}

function checkSpec(stateDir: string, spec: LeaseSpec): string {
  checkStateDir(stateDir)
  if (!FAULT_NAME.test(spec.fault))
    throw badInput(`invalid fault name ${JSON.stringify(spec.fault)}`, 'use lowercase letters, digits and -')
  checkTtl(spec.ttlMs)
  if (
    !Array.isArray(spec.revert) ||
    spec.revert.length === 0 ||
    spec.revert.some(a => !Array.isArray(a) || a.length === 0 || a.some(s => typeof s !== 'string'))
  ) {
    throw badInput(
      `lease for ${spec.fault} has no usable revert commands`,
      'give at least one revert command as a non-empty argv',
    )
  }
  const id = spec.id ?? newLeaseId(spec.fault)
  if (!LEASE_ID.test(id))
    throw badInput(
      `invalid lease id ${JSON.stringify(id)}`,
      'use 1-64 letters, digits, _ . or - (starting with a letter or digit)',
    )
  return id
}

/** Start time (field 22 of /proc/<pid>/stat) of a process on THIS machine, null when unknown. */
export function localStartTicks(pid: number): number | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'latin1')
    const v = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19])
    return Number.isInteger(v) ? v : null
  } catch {
    return null
  }
}

export function currentOwner(): LeaseOwner {
  return {user: userInfo().username, hostname: hostname(), pid: process.pid, startTicks: localStartTicks(process.pid)}
}

/**
 * Write the lease on the host and arm its reverter, BEFORE the caller injects. The reverter starts first (step 2)
 * and the files are written after it (step 3): pdchaos dying between any two steps leaves either nothing to
 * revert, or a lease whose reverter already runs. Three commands on the host.
 */
export async function createLease(host: Host, stateDir: string, spec: LeaseSpec): Promise<Lease> {
  const id = checkSpec(stateDir, spec)
  const script = revertScript(id, spec.fault, spec.revert)
  const where = `${stateDir} on ${host.describe()}`
  const prep = await host.run(['sh', '-c', PREPARE_SH, 'sh', stateDir, id], {timeoutMs: OP_TIMEOUT_MS, sudo: true})
  throwIfUnsafe(prep, host.describe())
  if (prep.code === 3) throw badInput(`a lease ${id} already exists in ${where}`, 'pick another lease id')
  const hostNow = Number(prep.stdout.trim())
  if (prep.code !== 0 || !Number.isInteger(hostNow)) {
    throw new PdError(`cannot prepare the lease directory ${where}: ${oneLine(prep.stderr) || `exit ${prep.code}`}`, {
      exit: ExitCode.unreachable,
      suggestion: 'check the deployment stateDir and the sudo policy',
    })
  }
  const expiresAt = hostNow + spec.ttlMs
  // The reverter runs from its text, never from a file on the host that could be swapped before it starts.
  const {pid} = await host.startDetached(
    ['sh', '-c', REVERTER_SH, 'pdchaos-reverter', 'watch', stateDir, id, String(expiresAt)],
    {
      logFile: `${leaseDir(stateDir)}/${id}.log`,
      sudo: true,
      timeoutMs: OP_TIMEOUT_MS,
    },
  )
  const base: Omit<Lease, 'reverter'> = {
    id,
    fault: spec.fault,
    params: spec.params ?? {},
    owner: currentOwner(),
    command: spec.command,
    createdAt: hostNow,
    ttlMs: spec.ttlMs,
    expiresAt,
    revert: spec.revert,
  }
  const write = await host.run(['sh', '-c', WRITE_SH, 'sh', stateDir, id, script, JSON.stringify(base), String(pid)], {
    timeoutMs: OP_TIMEOUT_MS,
    sudo: true,
  })
  const ticks = Number(write.stdout.trim())
  if (write.code === 13 && findUnsafe(write.stderr)) {
    await host
      .run(['sh', '-c', DISCARD_SH, 'sh', stateDir, id], {timeoutMs: OP_TIMEOUT_MS, sudo: true})
      .catch(() => undefined)
    throwIfUnsafe(write, host.describe())
  }
  if (write.code !== 0 || write.stdout.trim() === '' || !Number.isInteger(ticks)) {
    // No reverter, no lease: a fault must never be injected without its dead-man switch.
    await host
      .run(['sh', '-c', DISCARD_SH, 'sh', stateDir, id], {timeoutMs: OP_TIMEOUT_MS, sudo: true})
      .catch(() => undefined)
    const why =
      write.code === 0
        ? `its reverter (pid ${pid}) is not running; see ${leaseDir(stateDir)}/${id}.log`
        : oneLine(write.stderr) || `exit ${write.code}`
    throw new PdError(`cannot arm lease ${id} in ${where}: ${why}`, {
      exit: ExitCode.unreachable,
      suggestion: 'check that sh, setsid and nohup work on the host and the state dir is writable',
    })
  }
  return {...base, reverter: {pid, startTicks: ticks}}
}

interface ProcResult {
  status: 'reverted' | 'already' | 'busy' | 'missing' | 'unsafe'
  by: RevertedBy | null
  exitStatus: number | null
  at: number | null
  output: string
}

function parseResult(stdout: string, code: number | null, stderr: string, id: string, where: string): ProcResult {
  const lines = stdout.replace(/\n$/, '').split('\n')
  const last = lines.pop() ?? ''
  const m = /^PDCHAOS-RESULT (reverted|already|busy|missing|unsafe)(?: (\S*))?(?: (\S*))?(?: (\S*))?$/.exec(last)
  if (!m) {
    throw new PdError(`reverting lease ${id} on ${where} gave no result: ${oneLine(stderr) || `exit ${code}`}`, {
      exit: ExitCode.cleanupUnverified,
      suggestion: 'run `pdchaos recover` again, and look at the lease log on the host',
    })
  }
  const by = (['reverter', 'pdchaos', 'recover'] as const).find(b => b === m[2]) ?? null
  const num = (s: string | undefined): number | null => (s !== undefined && /^\d+$/.test(s) ? Number(s) : null)
  return {status: m[1] as ProcResult['status'], by, exitStatus: num(m[3]), at: num(m[4]), output: lines.join('\n')}
}

/**
 * Revert a lease now, by claiming its script (exactly one party runs it), then stop its reverter. Idempotent: a
 * lease already reverted (by the reverter, recover or an earlier call) reports who did it. A lease being reverted
 * by a live party is waited for, up to waitMs.
 */
export async function revertLease(
  host: Host,
  stateDir: string,
  id: string,
  by: Exclude<RevertedBy, 'reverter'> = 'pdchaos',
  opts: {waitMs?: number; timeoutMs?: number} = {},
): Promise<RevertResult> {
  if (!LEASE_ID.test(id)) throw badInput(`invalid lease id ${JSON.stringify(id)}`)
  checkStateDir(stateDir)
  const started = performance.now()
  const until = Date.now() + (opts.waitMs ?? 30_000)
  const firstBusy = {at: 0}
  for (;;) {
    // A claim with no claim file for 3 s means its holder died between the rename and writing the claim.
    const force = firstBusy.at > 0 && Date.now() - firstBusy.at > 3000 ? '1' : '0'
    const res = await host.run(['sh', '-c', REVERTER_SH, 'pdchaos-reverter', 'revert', stateDir, id, by, force], {
      timeoutMs: opts.timeoutMs ?? 90_000,
      sudo: true,
    })
    const r = parseResult(res.stdout, res.code, res.stderr, id, host.describe())
    // Refused before anything ran: the state dir or a file of this lease is another user's (host-safety.ts).
    if (r.status === 'unsafe')
      throw unsafeError(
        findUnsafe(res.stderr) ?? {
          path: `${leaseDir(stateDir)}/${id}.*`,
          owner: '?',
          uid: '?',
          why: 'failed the ownership checks',
        },
        host.describe(),
      )
    const ms = performance.now() - started
    if (r.status === 'reverted')
      return {
        id,
        reverted: true,
        status: 'reverted',
        byWhom: r.by,
        exitCode: r.exitStatus,
        output: r.output,
        revertedAt: r.at,
        ms,
      }
    if (r.status === 'already')
      return {
        id,
        reverted: false,
        status: 'already-reverted',
        byWhom: r.by,
        exitCode: r.exitStatus,
        output: '',
        revertedAt: r.at,
        ms,
      }
    if (r.status === 'missing')
      return {id, reverted: false, status: 'unknown', byWhom: null, exitCode: null, output: '', revertedAt: null, ms}
    if (firstBusy.at === 0) firstBusy.at = Date.now()
    if (Date.now() > until)
      return {
        id,
        reverted: false,
        status: 'in-progress',
        byWhom: null,
        exitCode: null,
        output: r.output,
        revertedAt: null,
        ms,
      }
    await sleep(150)
  }
}

/** Every lease in the state dir: active ones (and leftover scripts without a lease file) and done ones. */
export async function listLeases(host: Host, stateDir: string, opts: {timeoutMs?: number} = {}): Promise<LeaseListing> {
  checkStateDir(stateDir)
  const res = await host.run(['sh', '-c', LIST_SH, 'sh', stateDir], {
    timeoutMs: opts.timeoutMs ?? OP_TIMEOUT_MS,
    sudo: true,
  })
  throwIfUnsafe(res, host.describe())
  const nowLine = /(?:^|\n)NOW (\d+)\n?$/.exec(res.stdout)
  if (res.code !== 0 || !nowLine) {
    throw new PdError(
      `cannot list the leases in ${stateDir} on ${host.describe()}: ${oneLine(res.stderr) || `exit ${res.code}`}`,
      {
        exit: ExitCode.unreachable,
        suggestion: 'check the deployment stateDir and the sudo policy',
      },
    )
  }
  const dir = leaseDir(stateDir)
  const active = new Map<string, ActiveLease>()
  const done: DoneLease[] = []
  const unsafe: UnsafeFinding[] = []
  // The NOW match starts at the newline that ends the last record's separator: keep that newline with the records.
  const records = res.stdout.slice(0, res.stdout[nowLine.index] === '\n' ? nowLine.index + 1 : nowLine.index)
  for (const chunk of records.split('\n\u001e\n')) {
    const text = chunk.replace(/^\n+/, '')
    const u = /^U ([^\t\n]*)\t([^\t\n]*)\t([^\t\n]*)\t([^\t\n]*)/.exec(text)
    if (u) {
      const finding = {path: u[1]!, owner: u[2]!, uid: u[3]!, why: u[4]!}
      unsafe.push(finding)
      const base = finding.path.slice(finding.path.lastIndexOf('/') + 1)
      if (finding.path.startsWith(`${dir}/done/`)) continue
      const id = base.replace(/\.(json|revert\.sh|reverting\.sh)$/, '')
      const entry = active.get(id) ?? {id, state: 'no-script' as ActiveState}
      entry.unsafe ??= finding
      active.set(id, entry)
      continue
    }
    const m = /^F (.*)\n?([\s\S]*)$/.exec(text)
    if (!m) continue
    const file = m[1]!
    const base = file.slice(file.lastIndexOf('/') + 1)
    let body: Record<string, unknown> = {}
    if (base.endsWith('.json')) {
      try {
        body = JSON.parse(m[2]!) as Record<string, unknown>
      } catch {
        body = {unreadable: true}
      }
    }
    if (file.startsWith(`${dir}/done/`)) {
      done.push({...(body as unknown as DoneLease), id: String(body.id ?? base.slice(0, -'.json'.length))})
      continue
    }
    const [id, kind] = base.endsWith('.reverting.sh')
      ? ([base.slice(0, -'.reverting.sh'.length), 'reverting'] as const)
      : base.endsWith('.revert.sh')
        ? ([base.slice(0, -'.revert.sh'.length), 'armed'] as const)
        : ([base.slice(0, -'.json'.length), 'json'] as const)
    const entry = active.get(id) ?? {id, state: 'no-script' as ActiveState}
    if (kind === 'json') Object.assign(entry, body, {id, file, state: entry.state})
    else entry.state = kind
    active.set(id, entry)
  }
  return {active: [...active.values()], done, unsafe, hostNow: Number(nowLine[1])}
}

/** "at 2026-11-30T16:01:02.000Z (in 12 s)": when the host reverts a lease by itself. */
export function describeExpiry(expiresAt: number | undefined, now = Date.now()): string {
  if (expiresAt === undefined || !Number.isFinite(expiresAt)) return 'at an unknown time'
  const s = Math.round((expiresAt - now) / 1000)
  return `at ${new Date(expiresAt).toISOString()} (${s >= 0 ? `in ${s} s` : `${-s} s ago`})`
}
