import {execFile, spawn} from 'node:child_process'
import {existsSync, mkdtempSync, readFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join, resolve} from 'node:path'
import {promisify} from 'node:util'

import {describe, expect, it} from 'vitest'

import {freeVllmPorts} from '../sim/lifecycle-helpers.js'

/**
 * `pdchaos inject drop-dest-info -c <engine: vllm file>` end to end on the vLLM twin (short lease): P-only requests,
 * the D leg never sent, P's log and counters read, verdicts judged — each compared with the twin's truth log. A correct
 * twin passes (exit 0); `lease-never-expires` fails "never" and `expire-early` fails "early" (exit 1). The twin is
 * torn down on every path.
 */
const run = promisify(execFile)
const CLI = resolve('bin/run.js')
const LEASE_S = 4
const PINS = 2

interface Truth {
  t: number
  rid: string
  event: string
  detail?: {cause?: string; ttlS?: number}
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
  stdout: string
  verdicts: Verdict[]
  truth: Truth[]
  journal: {scenarios: Array<{name: string; notes?: string[]; verdicts: Verdict[]}>}
}

/** Up, inject (journal and --json), down on every path. */
async function injectOnTwin(bugs: string[]): Promise<Outcome> {
  const dir = mkdtempSync(join(process.env.TMPDIR ?? tmpdir(), 'vllm-drop-'))
  const {base, side} = await freeVllmPorts()
  const args = ['sim', 'up', '--engine', 'vllm', '--state-dir', dir, '--base-port', String(base)]
  args.push('--side-channel-port', String(side), '--kv-lease-duration', String(LEASE_S), '--vllm-step-ms', '20')
  for (const b of bugs) args.push('--vllm-bug', b)
  try {
    await run(process.execPath, [CLI, ...args], {timeout: 60_000})
    const journal = join(dir, 'run.json')
    const inject = [CLI, 'inject', 'drop-dest-info', '-c', join(dir, 'pdchaos.yaml'), '--pins', String(PINS)]
    inject.push('--journal', journal, '--json')
    const r = await run(process.execPath, inject, {timeout: 60_000}).then(
      x => ({code: 0, stdout: x.stdout}),
      (e: {code?: number; stdout?: string}) => ({code: e.code ?? -1, stdout: e.stdout ?? ''}),
    )
    const j = JSON.parse(readFileSync(journal, 'utf8')) as Outcome['journal']
    const tf = join(dir, 'truth', 'prefill.jsonl')
    const truth = existsSync(tf)
      ? readFileSync(tf, 'utf8')
          .split('\n')
          .filter(Boolean)
          .map(l => JSON.parse(l) as Truth)
      : []
    return {code: r.code, stdout: r.stdout, verdicts: j.scenarios[0]!.verdicts, truth, journal: j}
  } finally {
    await run(process.execPath, [CLI, 'sim', 'down', '--state-dir', dir], {timeout: 30_000}).catch(() => undefined)
  }
}

const freedOf = (o: Outcome, rid: string) => o.truth.find(e => e.rid === rid && e.event === 'freed')
const grantedOf = (o: Outcome, rid: string) => o.truth.find(e => e.rid === rid && e.event === 'granted')

describe('inject drop-dest-info on the vLLM twin', () => {
  it('passes on a correct twin (exit 0), each release inside its window by the truth log', async () => {
    const o = await injectOnTwin([])
    expect(o.code).toBe(0)
    expect(o.journal.scenarios[0]!.name).toBe('drop-dest-info (vllm)')
    expect(o.journal.scenarios[0]!.notes).toContain('engine: vllm')
    expect(o.verdicts).toHaveLength(PINS)
    for (const v of o.verdicts) {
      expect([v.check, v.verdict, v.summary]).toEqual([
        'kv-lease',
        'pass',
        'released by the lease expiry path in its window',
      ])
      const freed = freedOf(o, v.subject)
      expect(freed?.detail?.cause).toBe('lease-expired')
      const [open, close] = v.evidence.windowMs as [number, number]
      expect(freed!.t).toBeGreaterThanOrEqual(open)
      expect(freed!.t).toBeLessThanOrEqual(close)
    }
    expect((JSON.parse(o.stdout) as {scenarios: unknown[]}).scenarios).toHaveLength(1)
  }, 120_000)

  it('fails "never" under lease-never-expires (exit 1), where the truth log has no release', async () => {
    const o = await injectOnTwin(['lease-never-expires'])
    expect(o.code).toBe(1)
    expect(o.verdicts).toHaveLength(PINS)
    for (const v of o.verdicts) {
      expect(v.verdict).toBe('fail')
      expect(v.evidence.failure).toBe('never')
      expect(grantedOf(o, v.subject)).toBeDefined()
      expect(freedOf(o, v.subject)).toBeUndefined()
    }
  }, 120_000)

  it('fails "early" under expire-early (exit 1), where the truth log frees before the lease ends', async () => {
    const o = await injectOnTwin(['expire-early'])
    expect(o.code).toBe(1)
    expect(o.verdicts).toHaveLength(PINS)
    for (const v of o.verdicts) {
      expect(v.verdict).toBe('fail')
      expect(v.evidence.failure).toBe('early')
      const [open] = v.evidence.windowMs as [number, number]
      expect(freedOf(o, v.subject)!.t).toBeLessThan(open)
    }
  }, 120_000)

  it('Ctrl-C while waiting out the windows exits 3 at once, without waiting the windows out', async () => {
    const dir = mkdtempSync(join(process.env.TMPDIR ?? tmpdir(), 'vllm-drop-int-'))
    const {base, side} = await freeVllmPorts()
    const up = ['sim', 'up', '--engine', 'vllm', '--state-dir', dir, '--base-port', String(base)]
    up.push('--side-channel-port', String(side), '--kv-lease-duration', String(LEASE_S))
    try {
      await run(process.execPath, [CLI, ...up], {timeout: 60_000})
      const child = spawn(process.execPath, [CLI, 'inject', 'drop-dest-info', '-c', join(dir, 'pdchaos.yaml')])
      let stderr = ''
      const exited = new Promise<number | null>(ok => child.on('exit', code => ok(code)))
      await new Promise<void>((ok, no) => {
        const t = setTimeout(() => no(new Error(`never reached the wait: ${stderr}`)), 30_000)
        child.stderr.on('data', (b: Buffer) => {
          stderr += b.toString()
          if (stderr.includes('waiting')) {
            clearTimeout(t)
            ok()
          }
        })
      })
      const t0 = Date.now()
      child.kill('SIGINT')
      const code = await exited
      expect(code).toBe(3)
      // Well inside the lease: the run did not wait its windows out (a wide bound, not a timing assertion).
      expect(Date.now() - t0).toBeLessThan(LEASE_S * 1000)
      expect(stderr).toContain('interrupted')
    } finally {
      await run(process.execPath, [CLI, 'sim', 'down', '--state-dir', dir], {timeout: 30_000}).catch(() => undefined)
    }
  }, 120_000)
})
