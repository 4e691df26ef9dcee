import {type ChildProcess, spawn} from 'node:child_process'
import {existsSync, lstatSync, unlinkSync} from 'node:fs'
import {join} from 'node:path'
import {createInterface} from 'node:readline'

import {oneLine} from '../errors.js'
import {ExitCode} from '../exit-codes.js'
import {runLockTtlMs} from '../faults/lease/lease.js'
import {FLEET_EXIT_PRECEDENCE, type FleetMember, memberOfFailure, worseExit} from '../model/fleet.js'
import type {FleetEntry} from '../suite/fleet-file.js'
import {describeEntry, type MemberContext} from '../suite/fleet.js'
import {readJournal} from '../suite/fleet-journals.js'
import {vllmSuiteTtlMs} from './vllm-suite.js'

/**
 * One deployment of a fleet, run as its own `pdchaos suite -c FILE --journal DIR/NAME.json --label NAME` process.
 * Why a process each and not N runs in this one: a run judges evictions to the millisecond on its own event loop, and
 * N runs in one loop would widen each other's ε; each run's lease guard reverts on SIGINT and then exits the process,
 * which in a shared process would cut another deployment's reverts short; a crash or an out-of-memory in one run
 * would take every other deployment's faults down with it. A process each costs one Node start (about 0.6 CPU-s and
 * 60 MB) and is exactly the run the README's CronJob and CI matrix make, so a fleet run here and a fleet under a
 * scheduler combine through the same journal reader (suite/fleet-journals.ts).
 *
 * The child gets its own process group (detached), so a Ctrl-C reaches only this process, which forwards one SIGINT
 * to each child (a second would only make it say that its reverts are running), never to the child's own commands.
 */

export interface ChildOptions {
  /** How to start pdchaos: node and its arguments up to the command (this CLI's own entry). */
  cli: string[]
  journalDir: string
  /** The journal stays in journalDir (--journal-dir) and is named in the member; else the directory is temporary. */
  keepJournal: boolean
  runId?: string
  /** Flags every deployment's run gets. */
  pass: {gate?: boolean; oneAtATime?: boolean; allowProduction?: boolean; acceptNewHostKey?: boolean}
  /** Each progress line of the child (its stderr). */
  say?: (line: string) => void
  /** How long the child may run: by default its run lock's TTL plus 5 minutes; then SIGINT. */
  deadlineMs?: number
  /** After a SIGINT, how long the child has to revert and exit before SIGKILL (default 120 s). */
  killGraceMs?: number
  env?: NodeJS.ProcessEnv
}

export const journalPath = (dir: string, name: string): string => join(dir, `${name}.json`)

/** The command line of one deployment's run (after the CLI itself). */
export function memberArgv(e: FleetEntry, o: Pick<ChildOptions, 'journalDir' | 'runId' | 'pass'>): string[] {
  return [
    'suite',
    ...(e.suiteFile ? [e.suiteFile] : []),
    '-c',
    e.deploymentFile,
    '--journal',
    journalPath(o.journalDir, e.name),
    '--label',
    e.name,
    ...(o.runId ? ['--run-id', `${o.runId}.${e.name}`] : []),
    ...(o.pass.gate ? ['--gate'] : []),
    ...(o.pass.oneAtATime ? ['--one-at-a-time'] : []),
    ...(o.pass.allowProduction ? ['--allow-production'] : []),
    ...(o.pass.acceptNewHostKey ? ['--accept-new-host-key'] : []),
  ]
}

/** The longest a deployment's run may take: its run lock's TTL (what the run itself allows) and 5 minutes. */
export function memberDeadlineMs(e: FleetEntry): number {
  if (e.engine === 'vllm') return vllmSuiteTtlMs(e.suite) + 300_000
  const scenarios = e.suite.scenarios.reduce((n, s) => n + s.repetitions, 0)
  return runLockTtlMs({...e.deployment.watchdog, scenarios}) + 300_000
}

function removeOldJournal(journal: string): void {
  try {
    const s = lstatSync(journal)
    if (s.isFile() || s.isSymbolicLink()) unlinkSync(journal)
  } catch {
    /* none */
  }
}

export async function runMemberChild(e: FleetEntry, o: ChildOptions, ctx: MemberContext): Promise<FleetMember> {
  const journal = journalPath(o.journalDir, e.name)
  // A journal left by an earlier run must never be read as this run's; a node that is not a file is never removed.
  removeOldJournal(journal)
  const startedAt = Date.now()
  const child = spawn(o.cli[0]!, [...o.cli.slice(1), ...memberArgv(e, o)], {
    detached: true,
    stdio: ['ignore', 'pipe', 'pipe'],
    ...(o.env ? {env: o.env} : {}),
  })
  const tail: string[] = []
  createInterface({input: child.stderr}).on('line', line => {
    tail.push(line)
    if (tail.length > 40) tail.shift()
    o.say?.(line)
  })
  child.stdout.resume()
  const ended = await superviseChild(child, o.deadlineMs ?? memberDeadlineMs(e), o.killGraceMs ?? 120_000, ctx.signal)
  const more: Partial<FleetMember> = {
    ...describeEntry(e),
    ...(o.keepJournal ? {journal} : {}),
    startedAt,
    finishedAt: Date.now(),
  }
  if (ended.error)
    return memberOfFailure(
      e.name,
      {
        exitCode: ExitCode.unreachable,
        code: 'E_INTERNAL',
        reason: `could not start pdchaos for it: ${oneLine(ended.error)}`,
      },
      more,
    )
  const code = ended.code ?? undefined
  if (existsSync(journal)) return memberOfJournal(journal, e.name, o, code, ended.signal, more)
  return memberOfFailure(e.name, withoutJournal(tail, code, ended.signal, ended), more)
}

interface ChildEnd {
  code: number | null
  signal: string | null
  error?: Error
  /** Why we stopped it (SIGINT), if we did. */
  stoppedBy?: string
  /** SIGKILLed after it did not stop within the grace. */
  killed: boolean
}

/** Wait for the child to end: SIGINT at its deadline or when the fleet is stopped, SIGKILL after the grace. */
async function superviseChild(
  child: ChildProcess,
  deadlineMs: number,
  killGraceMs: number,
  signal: AbortSignal,
): Promise<ChildEnd> {
  let stoppedBy: string | undefined
  let killed = false
  let killTimer: NodeJS.Timeout | undefined
  const stop = (why: string) => {
    if (stoppedBy !== undefined) return
    stoppedBy = why
    child.kill('SIGINT')
    killTimer = setTimeout(() => {
      killed = true
      child.kill('SIGKILL')
    }, killGraceMs)
  }
  const deadline = setTimeout(() => stop(`it did not finish within ${Math.round(deadlineMs / 1000)} s`), deadlineMs)
  const onAbort = () => stop('the fleet was stopped')
  signal.addEventListener('abort', onAbort, {once: true})
  if (signal.aborted) onAbort()
  const ended = await new Promise<{code: number | null; signal: string | null; error?: Error}>(resolve => {
    child.once('error', error => resolve({code: null, signal: null, error}))
    child.once('close', (code, signal) => resolve({code, signal}))
  })
  clearTimeout(deadline)
  clearTimeout(killTimer)
  signal.removeEventListener('abort', onAbort)
  return {...ended, ...(stoppedBy === undefined ? {} : {stoppedBy}), killed}
}

/** The member its run's journal records (the process's exit code may make it worse). */
async function memberOfJournal(
  journal: string,
  name: string,
  o: ChildOptions,
  code: number | undefined,
  signal: string | null,
  more: Partial<FleetMember>,
): Promise<FleetMember> {
  let member: FleetMember
  try {
    member = await readJournal(journal, name)
  } catch (error) {
    return memberOfFailure(
      name,
      {
        exitCode: ExitCode.unreachable,
        code: 'E_INTERNAL',
        reason: `its run exited ${code ?? signal} and its journal cannot be read: ${oneLine(error)}`,
      },
      more,
    )
  }
  // A temporary journal is gone once the report is written: not named.
  if (!o.keepJournal) delete member.journal
  // The process's own code may be worse than its journal's (a revert that failed after the journal was written).
  return code !== undefined && FLEET_EXIT_PRECEDENCE.includes(code) ? worseExit(member, code) : member
}

/** A run that wrote no journal: the error line it printed, else how it ended. */
function withoutJournal(
  tail: string[],
  code: number | undefined,
  signal: string | null,
  s: {stoppedBy?: string; killed: boolean},
): {exitCode: number; reason: string; suggestion?: string} {
  const error = [...tail].reverse().find(l => l.startsWith('Error: '))
  const hint = [...tail].reverse().find(l => l.startsWith('Try this: '))
  const why = s.stoppedBy ? ` (stopped: ${s.stoppedBy})` : ''
  // pdchaos handles SIGINT from the start of its run on: one that ended by ours had not begun (it held no fault).
  if (signal === 'SIGINT' && s.stoppedBy !== undefined && !s.killed)
    return {exitCode: ExitCode.stopped, reason: `stopped before its run began${why}`}
  if (signal !== null) {
    // Killed mid-run (by us after the grace, or by something else: the OOM killer): a fault it held is the host's to
    // revert.
    return {
      exitCode: ExitCode.cleanupUnverified,
      reason:
        `${s.killed ? 'killed after it did not stop in time' : `ended by ${signal}`}${why}: any fault it ` +
        `held is reverted by the host at its lease's expiry`,
      suggestion: 'run `pdchaos recover` against it',
    }
  }
  const exitCode = code !== undefined && FLEET_EXIT_PRECEDENCE.includes(code) ? code : ExitCode.unreachable
  // Without an error line, the lease guard's last word says what became of the faults ("stopped; 2 lease(s) reverted").
  const guard = [...tail].reverse().find(l => l.startsWith('pdchaos: '))
  const reason = error
    ? error.slice('Error: '.length)
    : guard
      ? `exited ${code} without a journal: ${guard.slice('pdchaos: '.length)}`
      : `pdchaos exited ${code} without a journal`
  return {exitCode, reason: reason + why, ...(hint ? {suggestion: hint.slice('Try this: '.length)} : {})}
}
