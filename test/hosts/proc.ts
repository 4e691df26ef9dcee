import {readFileSync, readdirSync} from 'node:fs'

/** Pids whose command line contains `needle` (tests run sshd on this machine, so remote processes are visible here). */
export function pidsMatching(needle: string): number[] {
  const out: number[] = []
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name) || Number(name) === process.pid) continue
    try {
      const cmdline = readFileSync(`/proc/${name}/cmdline`, 'utf8').replaceAll('\0', ' ')
      if (cmdline.includes(needle)) out.push(Number(name))
    } catch {
      /* exited */
    }
  }
  return out
}

export function alive(pid: number): boolean {
  try {
    process.kill(pid, 0)
    const stat = readFileSync(`/proc/${pid}/stat`, 'latin1')
    return stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3) !== 'Z'
  } catch {
    return false
  }
}

/** Poll until cond() holds or the deadline passes; returns whether it held. */
export async function eventually(cond: () => boolean, deadlineMs: number): Promise<boolean> {
  const until = Date.now() + deadlineMs
  while (Date.now() < until) {
    if (cond()) return true
    await new Promise(r => setTimeout(r, 25))
  }
  return cond()
}

export function killAll(pids: number[]): void {
  for (const p of pids) {
    try {
      process.kill(p, 'SIGKILL')
    } catch {
      /* gone */
    }
  }
}

/** A sleep duration unique to this test run, so `sleep <marker>` finds exactly the processes a test started. */
export const marker = (): string => (31 + Math.random() * 10).toFixed(6)
