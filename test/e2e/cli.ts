import {expect} from 'vitest'
import {spawn, type ChildProcess} from 'node:child_process'
import {readFileSync} from 'node:fs'
import {join} from 'node:path'

import {requireSystemLevel} from '../harness/level.js'
import {cliEntry} from '../harness/test-host.js'

/** pdchaos as a user runs it: a subprocess, its exit code, its stdout and stderr, with a deadline. */

export interface CliResult {
  code: number | null
  signal: NodeJS.Signals | null
  stdout: string
  stderr: string
  ms: number
}

export function startCli(
  args: string[],
  env: NodeJS.ProcessEnv = {},
  asUser?: number,
): {child: ChildProcess; done: Promise<CliResult>} {
  requireSystemLevel('pdchaos as a subprocess')
  const started = performance.now()
  const child = spawn(process.execPath, [cliEntry(), ...args], {
    env: {...process.env, OCLIF_SKIP_NEW_VERSION_CHECK: '1', ...env},
    stdio: ['ignore', 'pipe', 'pipe'],
    ...(asUser === undefined ? {} : {uid: asUser, gid: asUser}),
  })
  let stdout = ''
  let stderr = ''
  child.stdout!.on('data', (d: Buffer) => {
    stdout += d.toString()
  })
  child.stderr!.on('data', (d: Buffer) => {
    stderr += d.toString()
  })
  const done = new Promise<CliResult>(resolve => {
    child.on('close', (code, signal) => resolve({code, signal, stdout, stderr, ms: performance.now() - started}))
  })
  return {child, done}
}

export async function runCli(
  args: string[],
  opts: {timeoutMs?: number; env?: NodeJS.ProcessEnv; asUser?: number} = {},
): Promise<CliResult> {
  const {child, done} = startCli(args, opts.env, opts.asUser)
  const timer = setTimeout(() => child.kill('SIGKILL'), opts.timeoutMs ?? 120_000)
  try {
    return await done
  } finally {
    clearTimeout(timer)
  }
}

/** The twin's ground truth: every JSON line of one service. */
export function truth(stateDir: string, service: 'prefill' | 'decode' | 'router'): Array<Record<string, unknown>> {
  try {
    return readFileSync(join(stateDir, 'truth', `${service}.jsonl`), 'utf8')
      .split('\n')
      .filter(Boolean)
      .map(l => JSON.parse(l) as Record<string, unknown>)
  } catch {
    return []
  }
}

/**
 * From a twin's ground truth: the states a rid held on prefill, and how long the watchdog held it before evicting it.
 */
export function evictionOf(stateDir: string, rid: string): {states: string[]; queue?: string; heldS?: number} {
  const events = truth(stateDir, 'prefill').filter(e => e.rid === rid)
  const entered = events.find(e => e.event === 'enter' && e.queue === 'bootstrap')
  const evicted = events.find(e => e.event === 'evicted')
  return {
    states: events.filter(e => e.event === 'state').map(e => String(e.state)),
    queue: evicted ? String(evicted.queue) : undefined,
    heldS: entered && evicted ? ((evicted.t as number) - (entered.t as number)) / 1000 : undefined,
  }
}

/**
 * A drop-dest-info pin by the twin's truth: held in Bootstrapping, evicted from the bootstrap queue inside
 * [deadline, deadline + poll], and pdchaos's own measurement within 0.25 s of it.
 */
export function expectDroppedPin(
  stateDir: string,
  pin: {rid: string; evictionSeconds: number},
  deadline: number,
  poll: number,
): void {
  const t = evictionOf(stateDir, pin.rid)
  expect(t.states).toEqual(['KVPoll.Bootstrapping'])
  expect(t.queue).toBe('bootstrap')
  expect(t.heldS!).toBeGreaterThanOrEqual(deadline)
  expect(t.heldS!).toBeLessThanOrEqual(deadline + poll + 0.05)
  expect(Math.abs(pin.evictionSeconds - t.heldS!)).toBeLessThan(0.25)
}

/** pdchaos's progress lines (stderr), each with when it arrived (performance.now()), and a bounded wait for one. */
export interface ProgressLines {
  readonly lines: ReadonlyArray<{at: number; text: string}>
  /** When a line matching re arrived, or undefined. */
  seen(re: RegExp): number | undefined
  /**
   * Resolve with the arrival time of the first line matching re; reject after deadlineMs or when the process ends
   * first.
   */
  waitFor(re: RegExp, deadlineMs: number): Promise<number>
}

export function progressLines(child: ChildProcess): ProgressLines {
  const lines: Array<{at: number; text: string}> = []
  const waiters = new Set<() => void>()
  let partial = ''
  let ended = false
  child.stderr!.on('data', (d: Buffer) => {
    const at = performance.now()
    const parts = (partial + d.toString()).split('\n')
    partial = parts.pop()!
    for (const text of parts) lines.push({at, text})
    for (const w of [...waiters]) w()
  })
  child.on('close', () => {
    ended = true
    for (const w of [...waiters]) w()
  })
  const seen = (re: RegExp): number | undefined => lines.find(l => re.test(l.text))?.at
  const tail = (): string =>
    lines
      .slice(-8)
      .map(l => l.text)
      .join(' | ')
  const waitFor = (re: RegExp, deadlineMs: number): Promise<number> =>
    new Promise((resolve, reject) => {
      const check = (): void => {
        const at = seen(re)
        if (at !== undefined) {
          done()
          resolve(at)
        } else if (ended) {
          done()
          reject(new Error(`pdchaos ended before printing ${re}: ${tail()}`))
        }
      }
      const timer = setTimeout(() => {
        done()
        reject(new Error(`no line matching ${re} within ${deadlineMs} ms: ${tail()}`))
      }, deadlineMs)
      const done = (): void => {
        clearTimeout(timer)
        waiters.delete(check)
      }
      waiters.add(check)
      check()
    })
  return {lines, seen, waitFor}
}

/** pdchaos started in the background, once it printed a line matching `re` (killed if it never does, within 90 s). */
export async function startUntil(args: string[], re: RegExp): Promise<ReturnType<typeof startCli>> {
  const started = startCli(args)
  try {
    await progressLines(started.child).waitFor(re, 90_000)
  } catch (error) {
    started.child.kill('SIGKILL')
    throw error
  }
  return started
}

/** Poll `ok` every 250 ms until it holds or `ms` pass. */
export async function eventually(ok: () => Promise<boolean>, ms: number): Promise<boolean> {
  const by = Date.now() + ms
  for (;;) {
    if (await ok()) return true
    if (Date.now() > by) return false
    await new Promise(r => setTimeout(r, 250))
  }
}

/**
 * abort-mid-transfer's trials over SSH: every trial has its verdict, pass or unverified as not counted (released before
 * its abort landed), none fails. By the twin's truth on prefill: a trial whose abort pdchaos saw honoured was aborted
 * while prefill held it (by its own abort, or by decode's reaching it first); one it saw complete (the transfer won the
 * race) was neither aborted nor evicted there.
 */
export function expectAbortTrials(r: CliResult, prefillStateDir: string, trials: number): void {
  // eslint-disable-next-line @typescript-eslint/no-explicit-any
  const j = JSON.parse(r.stdout) as any
  expect(
    j.verdicts,
    `exit ${r.code}: ${j.error?.message ?? r.stdout.slice(0, 300)} | ${r.stderr.replace(/\s+/g, ' ').slice(-600)}`,
  ).toBeDefined()
  const judged = j.verdicts.filter((v: {check: string}) => v.check === 'abort')
  expect(judged).toHaveLength(trials)
  expect(
    judged.every(
      (v: {verdict: string; summary: string}) =>
        v.verdict === 'pass' || (v.verdict === 'unverified' && /not counted/.test(v.summary)),
    ),
    JSON.stringify(judged),
  ).toBe(true)
  expect(j.verdicts.filter((v: {verdict: string}) => v.verdict === 'fail')).toEqual([])
  const events = truth(prefillStateDir, 'prefill')
  const ridsOf = (event: string) => new Set(events.filter(e => e.event === event).map(e => e.rid))
  // pdchaos aborts on both servers at once. Decode's abort may reach prefill first, as its ZMQ ABORT (nixl/conn.py,
  // docs/twin.md): the room fails "aborted by decode" and prefill's own abort then finds nothing to abort. Either way
  // the request ended by the abort.
  const byDecode = new Set(
    events
      .filter(e => e.event === 'transfer_failed' && /was aborted by decode/.test(JSON.stringify(e.detail ?? '')))
      .map(e => e.rid),
  )
  const [aborted, evicted] = [new Set([...ridsOf('abort'), ...byDecode]), ridsOf('evicted')]
  const outcomes = new Map((j.aborts as Array<{rid: string; outcome: string}>).map(a => [a.rid, a.outcome]))
  for (const t of judged.filter((v: {verdict: string}) => v.verdict === 'pass')) {
    const outcome = outcomes.get(t.subject)
    // On failure, what pdchaos said of the trial and what the twin recorded of its request.
    const said =
      `${t.subject}: ${outcome}: ${(t as {summary?: string}).summary} | ` +
      `twin: ${JSON.stringify(events.filter(e => e.rid === t.subject).map(e => e.event))}`
    if (outcome === 'honoured') expect(aborted.has(t.subject), said).toBe(true)
    else {
      expect(outcome, said).toBe('completed')
      expect(aborted.has(t.subject) || evicted.has(t.subject), said).toBe(false)
    }
  }
}
