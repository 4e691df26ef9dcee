import {execFile} from 'node:child_process'
import {existsSync, mkdtempSync, readFileSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join, resolve} from 'node:path'
import {promisify} from 'node:util'

import {beforeAll, describe, expect, it} from 'vitest'

import {freeVllmPorts} from '../sim/lifecycle-helpers.js'

/**
 * Mutation rows of issue 31 for drop-dest-info on the vLLM twin: `pdchaos inject drop-dest-info -c <twin file>` on a
 * correct twin three times (every verdict pass: 0 false alarms over 3 clean repetitions), on a twin whose reaper
 * never frees (`lease-never-expires`: fail "never"), one that grants half the lease (`expire-early`: fail "early"),
 * and a build before the lease (`no-lease`, a short VLLM_NIXL_ABORT_REQUEST_TIMEOUT; the twin's file states
 * `vllm.lease.mode: legacy`: pass on the legacy path), and a correct twin whose P log is unreadable (pass on the
 * expiry counter alone, P shown otherwise idle). Each verdict is compared with the twin's truth log. The seven twins
 * run four at a time (distinct ports), each torn down on every path. Rows for stall-kv, abort and wedge live
 * in their own files.
 */
const run = promisify(execFile)
const CLI = resolve('bin/run.js')
const LEASE_S = 4
const LEGACY_S = 4
const PINS = 2
const STEP_MS = 20

interface Truth {
  t: number
  rid: string
  event: string
  detail?: {cause?: string; ttlS?: number; expiryMs?: number; mode?: string}
}
interface Verdict {
  check: string
  subject: string
  verdict: string
  summary: string
  evidence: Record<string, unknown>
}
interface Outcome {
  code: number
  stderr: string
  verdicts: Verdict[]
  truth: Truth[]
}
interface Row {
  name: string
  bugs: string[]
  up?: string[]
  /** Point the file's P log at a path that does not exist (the log unreadable: the counter is all there is). */
  noLog?: boolean
}

const ROWS: Row[] = [
  {name: 'correct 1', bugs: []},
  {name: 'correct 2', bugs: []},
  {name: 'correct 3', bugs: []},
  {name: 'lease-never-expires', bugs: ['lease-never-expires']},
  {name: 'expire-early', bugs: ['expire-early']},
  {name: 'no-lease', bugs: ['no-lease'], up: ['--abort-request-timeout', String(LEGACY_S)]},
  {name: 'correct, log unreadable', bugs: [], noLog: true},
]

/** Up, inject with a journal, down on every path. */
async function injectOnTwin(row: Row): Promise<Outcome> {
  const dir = mkdtempSync(join(process.env.TMPDIR ?? tmpdir(), 'vllm-mut-'))
  const {base, side} = await freeVllmPorts()
  const args = ['sim', 'up', '--engine', 'vllm', '--state-dir', dir, '--base-port', String(base)]
  args.push('--side-channel-port', String(side), '--kv-lease-duration', String(LEASE_S))
  args.push('--vllm-step-ms', String(STEP_MS), ...(row.up ?? []))
  for (const b of row.bugs) args.push('--vllm-bug', b)
  try {
    await run(process.execPath, [CLI, ...args], {timeout: 60_000})
    const file = join(dir, 'pdchaos.yaml')
    if (row.noLog) writeFileSync(file, readFileSync(file, 'utf8').replace('logs/prefill.log', 'logs/absent.log'))
    const journal = join(dir, 'run.json')
    const inject = [CLI, 'inject', 'drop-dest-info', '-c', join(dir, 'pdchaos.yaml'), '--pins', String(PINS)]
    inject.push('--journal', journal)
    const r = await run(process.execPath, inject, {timeout: 60_000}).then(
      x => ({code: 0, stderr: x.stderr}),
      (e: {code?: number; stderr?: string}) => ({code: e.code ?? -1, stderr: e.stderr ?? ''}),
    )
    const j = JSON.parse(readFileSync(journal, 'utf8')) as {scenarios: Array<{verdicts: Verdict[]}>}
    const tf = join(dir, 'truth', 'prefill.jsonl')
    const truth = existsSync(tf)
      ? readFileSync(tf, 'utf8')
          .split('\n')
          .filter(Boolean)
          .map(l => JSON.parse(l) as Truth)
      : []
    return {...r, verdicts: j.scenarios[0]!.verdicts, truth}
  } finally {
    await run(process.execPath, [CLI, 'sim', 'down', '--state-dir', dir], {timeout: 30_000}).catch(() => undefined)
  }
}

/** Every row, three twins at a time; a row that threw keeps its error for its own test. */
async function runAll(rows: Row[], width: number): Promise<Map<string, Outcome | Error>> {
  const out = new Map<string, Outcome | Error>()
  const queue = [...rows]
  const worker = async (): Promise<void> => {
    for (let row = queue.shift(); row; row = queue.shift())
      out.set(row.name, await injectOnTwin(row).catch((e: unknown) => (e instanceof Error ? e : new Error(String(e)))))
  }
  await Promise.all(Array.from({length: width}, worker))
  return out
}

const event = (o: Outcome, rid: string, name: string) => o.truth.find(e => e.rid === rid && e.event === name)

describe('mutation rows: inject drop-dest-info on the vLLM twin', () => {
  let results: Map<string, Outcome | Error>
  const outcome = (name: string): Outcome => {
    const o = results.get(name)
    if (o instanceof Error || !o) throw o ?? new Error(`${name} did not run`)
    return o
  }
  beforeAll(async () => {
    results = await runAll(ROWS, 4)
  }, 110_000)

  it.each(['correct 1', 'correct 2', 'correct 3'])(
    '%s: every verdict passes (no false alarm), each release inside its window by the truth log',
    name => {
      const o = outcome(name)
      expect(
        o.verdicts.map(v => v.verdict),
        o.stderr,
      ).toEqual(Array(PINS).fill('pass'))
      expect(o.code).toBe(0)
      for (const v of o.verdicts) {
        const granted = event(o, v.subject, 'granted')!
        const freed = event(o, v.subject, 'freed')!
        expect(freed.detail?.cause).toBe('lease-expired')
        // The twin's own verdict: not before grant + lease, and inside the window pdchaos judged by.
        expect(freed.t).toBeGreaterThanOrEqual(granted.t + LEASE_S * 1000)
        const [open, close] = v.evidence.windowMs as [number, number]
        expect(freed.t).toBeGreaterThanOrEqual(open)
        expect(freed.t).toBeLessThanOrEqual(close)
        // The finer clock (P's expiry counter scraped through the windows, P otherwise idle) holds the truth.
        const [from, to] = v.evidence.releasedInSampled as [number, number]
        expect(freed.t).toBeGreaterThanOrEqual(from)
        expect(freed.t).toBeLessThanOrEqual(to)
      }
    },
  )

  it('correct twin, P log unreadable: passes on the expiry counter alone, P shown otherwise idle', () => {
    const o = outcome('correct, log unreadable')
    expect(
      o.verdicts.map(v => [v.verdict, v.summary]),
      o.stderr,
    ).toEqual(Array(PINS).fill(['pass', 'released by the expiry path (counter, P otherwise idle)']))
    for (const v of o.verdicts) {
      expect(String(v.evidence.idle)).toContain(`request_success +${PINS}`)
      expect(event(o, v.subject, 'freed')?.detail?.cause).toBe('lease-expired')
    }
  })

  it('lease-never-expires: every verdict fails "never", and the truth log frees nothing', () => {
    const o = outcome('lease-never-expires')
    expect(o.code).toBe(1)
    expect(o.verdicts).toHaveLength(PINS)
    for (const v of o.verdicts) {
      expect([v.verdict, v.evidence.failure]).toEqual(['fail', 'never'])
      expect(event(o, v.subject, 'granted')).toBeDefined()
      expect(event(o, v.subject, 'freed')).toBeUndefined()
    }
  })

  it('expire-early: every verdict fails "early", and the truth log frees before grant + lease', () => {
    const o = outcome('expire-early')
    expect(o.code).toBe(1)
    expect(o.verdicts).toHaveLength(PINS)
    for (const v of o.verdicts) {
      expect([v.verdict, v.evidence.failure]).toEqual(['fail', 'early'])
      const granted = event(o, v.subject, 'granted')!
      expect(event(o, v.subject, 'freed')!.t).toBeLessThan(granted.t + LEASE_S * 1000)
    }
  })

  it('no-lease (legacy timeout, vllm.lease.mode: legacy): every verdict passes on the legacy path', () => {
    const o = outcome('no-lease')
    expect(
      o.verdicts.map(v => [v.verdict, v.summary]),
      o.stderr,
    ).toEqual(Array(PINS).fill(['pass', 'released by the legacy expiry path in its window']))
    expect(o.code).toBe(0)
    for (const v of o.verdicts) {
      expect(v.evidence.mode).toBe('legacy')
      const granted = event(o, v.subject, 'granted')!
      expect(granted.detail).toMatchObject({mode: 'legacy', ttlS: LEGACY_S})
      const freed = event(o, v.subject, 'freed')!
      expect(freed.detail?.cause).toBe('legacy-timeout')
      expect(freed.t).toBeGreaterThanOrEqual(granted.t + LEGACY_S * 1000)
      const [open, close] = v.evidence.windowMs as [number, number]
      expect(freed.t).toBeGreaterThanOrEqual(open)
      expect(freed.t).toBeLessThanOrEqual(close)
    }
  })
})
