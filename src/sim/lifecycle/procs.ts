import {spawn} from 'node:child_process'
import {closeSync, mkdirSync, openSync, readdirSync, readFileSync, readlinkSync} from 'node:fs'
import {dirname} from 'node:path'

/**
 * Processes by pid, safely: a pid is only ever signalled when /proc/<pid>/stat still shows the start time
 * recorded when we started it, so a recycled pid is never touched.
 */

export interface ProcRef {
  pid: number
  /** /proc/<pid>/stat field 22 (starttime, clock ticks since boot), as a string. */
  start: string
}

/** The stat fields after the command name (which may contain spaces and parentheses). */
function statFields(pid: number): string[] | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
    return stat.slice(stat.lastIndexOf(')') + 2).split(' ')
  } catch {
    return undefined
  }
}

/** starttime of a live process, or undefined when there is no such process (zombies count as gone). */
export function procStart(pid: number): string | undefined {
  const f = statFields(pid)
  if (!f || f[0] === 'Z' || f[0] === 'X') return undefined
  return f[19]
}

export function procGroup(pid: number): number | undefined {
  const f = statFields(pid)
  return f ? Number(f[2]) : undefined
}

export function isSameProcess(ref: ProcRef | undefined): boolean {
  return ref !== undefined && ref.pid > 0 && procStart(ref.pid) === ref.start
}

export function refOf(pid: number): ProcRef | undefined {
  const start = procStart(pid)
  return start === undefined ? undefined : {pid, start}
}

/**
 * Whether a process of the group still runs. A zombie does not: it has exited (its sockets, ports and files are
 * released) and waits only for its parent to collect it; once orphaned that is init, which in a container may take a
 * second or more (measured here: 1.0-1.4 s after the router exited in 7 ms), and every stop used to wait for it.
 */
export function groupAlive(pgid: number): boolean {
  try {
    process.kill(-pgid, 0)
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM'
  }
  return runningMember(pgid)
}

/** A member of the group in any state but zombie, from /proc (no procfs: assume one runs). */
function runningMember(pgid: number): boolean {
  let entries: string[]
  try {
    entries = readdirSync('/proc')
  } catch {
    return true
  }
  for (const d of entries) {
    const c = d.charCodeAt(0)
    if (c < 48 || c > 57) continue
    let stat: string
    try {
      stat = readFileSync(`/proc/${d}/stat`, 'latin1')
    } catch {
      continue
    }
    // After the command's closing parenthesis: state, ppid, pgrp, …
    const [state, , pgrp] = stat.slice(stat.lastIndexOf(')') + 2).split(' ', 3)
    if (Number(pgrp) === pgid && state !== 'Z' && state !== 'X') return true
  }
  return false
}

/**
 * Start a service detached: its own process group, stdout and stderr appended to logFile, not tied to
 * the CLI's lifetime. Returns the leader's ref (its pid is the process group id).
 */
export function spawnDetached(
  command: string,
  args: string[],
  opts: {env: NodeJS.ProcessEnv; logFile: string; cwd: string},
): ProcRef {
  mkdirSync(dirname(opts.logFile), {recursive: true})
  const fd = openSync(opts.logFile, 'a')
  try {
    const child = spawn(command, args, {detached: true, stdio: ['ignore', fd, fd], env: opts.env, cwd: opts.cwd})
    child.on('error', () => {})
    child.unref()
    if (child.pid === undefined) throw new Error(`could not start ${command}`)
    return {pid: child.pid, start: procStart(child.pid) ?? ''}
  } finally {
    closeSync(fd)
  }
}

const sleep = (ms: number): Promise<void> => new Promise(r => setTimeout(r, ms))

/**
 * Stop a process group we started: SIGTERM, then SIGKILL after termMs. Only when the leader is still the
 * process we started, or when the leader is gone but its group lives on (a pid cannot be reused while its
 * group exists, so such a group is still ours). Resolves true when the group is gone.
 */
export async function stopGroup(ref: ProcRef, termMs = 5000, killMs = 3000): Promise<boolean> {
  const leaderOurs = isSameProcess(ref)
  const leaderGone = procStart(ref.pid) === undefined
  if (!leaderOurs && !leaderGone) return true // the pid now belongs to someone else: never signal it
  if (!groupAlive(ref.pid)) return true
  const signal = (sig: NodeJS.Signals): void => {
    try {
      process.kill(-ref.pid, sig)
    } catch {}
  }
  signal('SIGTERM')
  // A SIGSTOPped member would never act on SIGTERM; SIGCONT lets it.
  signal('SIGCONT')
  const until = Date.now() + termMs
  while (Date.now() < until) {
    if (!groupAlive(ref.pid)) return true
    await sleep(50)
  }
  signal('SIGKILL')
  const until2 = Date.now() + killMs
  while (Date.now() < until2) {
    if (!groupAlive(ref.pid)) return true
    await sleep(50)
  }
  return !groupAlive(ref.pid)
}

/** Who listens on a TCP port (best effort, from /proc): "pid 123 (node router-main.js)", or undefined. */
export function portHolder(port: number): string | undefined {
  const inodes = new Set<string>()
  for (const file of ['/proc/net/tcp', '/proc/net/tcp6']) {
    let text: string
    try {
      text = readFileSync(file, 'utf8')
    } catch {
      continue
    }
    for (const line of text.split('\n').slice(1)) {
      const f = line.trim().split(/\s+/)
      if (f.length < 10) continue
      const local = f[1]
      if (Number.parseInt(local.slice(local.lastIndexOf(':') + 1), 16) === port && f[3] === '0A') inodes.add(f[9])
    }
  }
  if (inodes.size === 0) return undefined
  let pids: string[]
  try {
    pids = readdirSync('/proc').filter(d => /^\d+$/.test(d))
  } catch {
    return undefined
  }
  for (const pid of pids) {
    let fds: string[]
    try {
      fds = readdirSync(`/proc/${pid}/fd`)
    } catch {
      continue
    }
    for (const fd of fds) {
      let link: string
      try {
        link = readlinkSync(`/proc/${pid}/fd/${fd}`)
      } catch {
        continue
      }
      const m = /^socket:\[(\d+)\]$/.exec(link)
      if (m && inodes.has(m[1])) return `pid ${pid} (${describeProcess(Number(pid))})`
    }
  }
  return 'another process (its owner is not visible to this user)'
}

/** A short description of a process: its title/cmdline, shortened. */
export function describeProcess(pid: number): string {
  try {
    const cmd = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean)
    const text = cmd.map(a => (a.includes('/') && !a.startsWith('-') ? a.slice(a.lastIndexOf('/') + 1) : a)).join(' ')
    return text.length > 80 ? text.slice(0, 77) + '...' : text || '?'
  } catch {
    return '?'
  }
}
