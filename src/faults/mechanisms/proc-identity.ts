import {parseProcStat, type ProcStat} from '../../discovery/proc.js'
import {badInput} from '../../errors.js'
import type {Host} from '../../hosts/host.js'
import type {Judgement, Probe} from '../fault.js'

/**
 * A process named for its whole life: (pid, start time in clock ticks since boot, /proc/<pid>/stat field 22).
 * A pid alone can be recycled by an unrelated process between discovery and a signal; the pair cannot.
 */

export interface ProcIdentity {
  pid: number
  startTicks: number
}

export function checkIdentity(id: {pid: number; startTicks?: number}, what: string): ProcIdentity {
  if (!Number.isInteger(id.pid) || id.pid <= 1) throw badInput(`${what}: invalid pid ${id.pid}`)
  if (id.startTicks === undefined || !Number.isInteger(id.startTicks) || id.startTicks < 0) {
    throw badInput(
      `${what}: pid ${id.pid} has no start time from /proc/${id.pid}/stat, so it cannot be told from a recycled pid`,
      'run as a user that can read /proc/<pid>/stat of the ranks, then retry',
    )
  }
  return {pid: id.pid, startTicks: id.startTicks}
}

export const procStatArgv = (pid: number): string[] => ['cat', `/proc/${pid}/stat`]

export {parseProcStat, type ProcStat}

/**
 * What /proc says about an identity now: the same process (with its state), gone, or a different process on the pid.
 */
export type Resolution = {kind: 'same'; state: string} | {kind: 'gone'} | {kind: 'recycled'; startTicks: number}

export function resolveFromStat(id: ProcIdentity, stdout: string, code: number | null): Resolution {
  const stat = code === 0 ? parseProcStat(stdout.trim()) : undefined
  if (!stat || stat.pid !== id.pid) return {kind: 'gone'}
  if (stat.startTicks !== id.startTicks) return {kind: 'recycled', startTicks: stat.startTicks}
  return {kind: 'same', state: stat.state}
}

/** Read an identity's /proc state now (read-only). */
export async function resolveIdentity(host: Host, id: ProcIdentity, timeoutMs = 5000): Promise<Resolution> {
  const res = await host.run(procStatArgv(id.pid), {timeoutMs})
  return resolveFromStat(id, res.stdout, res.code)
}

/** Probe: the process is stopped (state T) — SIGSTOP took effect on THIS process. */
export function stoppedProbe(id: ProcIdentity, label: string): Probe {
  return {
    name: `${label} is stopped (state T)`,
    argv: procStatArgv(id.pid),
    sudo: false,
    judge: (stdout, code): Judgement => {
      const r = resolveFromStat(id, stdout, code)
      if (r.kind === 'same') {
        return r.state === 'T'
          ? {ok: true, evidence: `/proc/${id.pid}/stat: state T, start ${id.startTicks}`}
          : {ok: false, evidence: `/proc/${id.pid}/stat: state ${r.state}, not stopped`}
      }
      if (r.kind === 'gone') return {ok: false, evidence: `pid ${id.pid} is gone`}
      return {
        ok: false,
        evidence: `pid ${id.pid} now belongs to another process (start ${r.startTicks}, expected ${id.startTicks})`,
      }
    },
  }
}

/** Probe: the process runs again (not T), or no longer exists (then nothing of ours is left on it). */
export function notStoppedProbe(id: ProcIdentity, label: string): Probe {
  return {
    name: `${label} is not stopped`,
    argv: procStatArgv(id.pid),
    sudo: false,
    judge: (stdout, code): Judgement => {
      const r = resolveFromStat(id, stdout, code)
      if (r.kind === 'same') {
        return r.state === 'T'
          ? {ok: false, evidence: `/proc/${id.pid}/stat: state T, still stopped`}
          : {ok: true, evidence: `/proc/${id.pid}/stat: state ${r.state}, start ${id.startTicks}`}
      }
      if (r.kind === 'gone') return {ok: true, evidence: `pid ${id.pid} no longer exists: nothing left stopped`}
      return {
        ok: true,
        evidence: `pid ${id.pid} exited and was reused (start ${r.startTicks}): the stopped process is gone`,
      }
    },
  }
}

/**
 * Probe: none of the identities is alive (gone, a zombie, or its pid now another process's). One shell reads every
 * /proc/<pid>/stat, so a kill of a whole tree (kill-prefill, vLLM's kill-decode) is judged at one instant.
 */
export function goneProbe(ids: Array<ProcIdentity & {label: string}>, who: string): Probe {
  return {
    name: `${ids.length} ${who} process(es) are gone`,
    argv: [
      'sh',
      '-c',
      'for p in "$@"; do cat "/proc/$p/stat" 2>/dev/null; done; true',
      'pdchaos-stat',
      ...ids.map(i => String(i.pid)),
    ],
    sudo: false,
    judge(stdout): Judgement {
      const alive = stdout
        .split('\n')
        .map(l => parseProcStat(l.trim()))
        .filter(s => s !== undefined)
        .filter(s => ids.some(i => i.pid === s.pid && i.startTicks === s.startTicks) && !'ZX'.includes(s.state))
      return alive.length === 0
        ? {ok: true, evidence: `/proc: ${ids.map(i => `${i.label} pid ${i.pid}`).join(', ')} gone`}
        : {ok: false, evidence: `still alive: ${alive.map(s => `pid ${s.pid} (state ${s.state})`).join(', ')}`}
    },
  }
}
