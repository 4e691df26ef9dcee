import {execFileSync} from 'node:child_process'
import {existsSync, mkdtempSync, readdirSync, readFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {describe, expect, it} from 'vitest'

import {freeVllmPorts} from '../sim/lifecycle-helpers.js'
import {runCli, startCli, truth} from './cli.js'

/**
 * `pdchaos inject abort-mid-transfer -c <engine: vllm file>` end to end on the vLLM twin (lease 4 s): D's READ held by
 * the READ stall (an nft/iptables drop on P's data port, under a fault lease), D's leg aborted once D's deferred gauge
 * shows the READ, P's log read once every window closed. Each verdict is compared with the twin's truth log: D
 * `aborted {during: reading}` after its `read-start`, P `freed {cause: lease-expired}` inside the verdict's window.
 * A correct twin passes three runs in a row (exit 0, no false alarm); `lease-never-expires` fails "never" and
 * `expire-early` fails "early" (exit 1); Ctrl-C exits 3 with the stall's filter gone. The twin is torn down on every
 * path.
 */
const LEASE_S = 4
const PINS = 2

interface Verdict {
  check: string
  subject: string
  verdict: string
  summary: string
  evidence: Record<string, unknown>
}

interface Run {
  code: number | null
  stderr: string
  verdicts: Verdict[]
  leases: Array<{verifiedInjected: boolean; verifiedClean: boolean}>
  notes: string[]
}

type Truth = Record<string, unknown> & {t: number; rid: string; event: string; detail?: Record<string, unknown>}

async function withTwin<T>(bugs: string[], body: (dir: string) => Promise<T>): Promise<T> {
  const dir = mkdtempSync(join(process.env.TMPDIR ?? tmpdir(), 'vllm-abort-'))
  const {base, side} = await freeVllmPorts()
  const up = ['sim', 'up', '--engine', 'vllm', '--state-dir', dir, '--base-port', String(base)]
  up.push('--side-channel-port', String(side), '--kv-lease-duration', String(LEASE_S), '--vllm-step-ms', '20')
  for (const b of bugs) up.push('--vllm-bug', b)
  try {
    const u = await runCli(up, {timeoutMs: 60_000})
    expect(u.code, u.stderr).toBe(0)
    return await body(dir)
  } finally {
    await runCli(['sim', 'down', '--state-dir', dir], {timeoutMs: 30_000}).catch(() => undefined)
  }
}

async function inject(dir: string, n: number): Promise<Run> {
  const journal = join(dir, `run-${n}.json`)
  const args = ['inject', 'abort-mid-transfer', '-c', join(dir, 'pdchaos.yaml'), '--pins', String(PINS)]
  const r = await runCli([...args, '--journal', journal], {timeoutMs: 90_000})
  const j = JSON.parse(readFileSync(journal, 'utf8')) as {scenarios: Array<Omit<Run, 'code' | 'stderr'>>}
  return {code: r.code, stderr: r.stderr, ...j.scenarios[0]!}
}

const events = (dir: string, role: 'prefill' | 'decode', rid: string, event: string): Truth[] =>
  (truth(dir, role) as Truth[]).filter(e => e.rid === rid && e.event === event)

/** The twin's truth for a verdict's request: the abort landed in D's READ, at or after the recorded abort. */
function expectAbortedDuringRead(dir: string, v: Verdict): void {
  const abortedAt = v.evidence.abortedAt as number
  const aborted = events(dir, 'decode', v.subject, 'aborted')
  expect(aborted).toHaveLength(1)
  expect(aborted[0]!.detail?.during).toBe('reading')
  const readStart = events(dir, 'decode', v.subject, 'read-start')[0]!
  expect(readStart.t).toBeLessThan(abortedAt)
  expect(aborted[0]!.t).toBeGreaterThanOrEqual(abortedAt)
  expect(events(dir, 'decode', v.subject, 'read-done')).toHaveLength(0)
}

/** The host's nft tables (the stall's filter is one while it is in); sbin added for a test runner's PATH. */
function nftTables(): string {
  try {
    const PATH = `${process.env.PATH ?? ''}:/usr/sbin:/sbin`
    return execFileSync('nft', ['list', 'tables'], {encoding: 'utf8', env: {...process.env, PATH}})
  } catch (error) {
    return `nft list tables failed: ${(error as Error).message}`
  }
}

describe('inject abort-mid-transfer on the vLLM twin', () => {
  it('passes on a correct twin three runs in a row, each release in its window by the truth log', async () => {
    await withTwin([], async dir => {
      for (let n = 0; n < 3; n++) {
        const r = await inject(dir, n)
        expect(r.code, r.stderr).toBe(0)
        expect(r.leases).toEqual([expect.objectContaining({verifiedInjected: true, verifiedClean: true})])
        expect(r.verdicts).toHaveLength(PINS)
        for (const v of r.verdicts) {
          expect([v.check, v.verdict, v.summary]).toEqual([
            'kv-lease',
            'pass',
            'released by the lease expiry path in its window after the abort',
          ])
          expect((v.evidence.entry as {by: string}).by).toBe('deferred')
          expectAbortedDuringRead(dir, v)
          const freed = events(dir, 'prefill', v.subject, 'freed')
          expect(freed.map(f => f.detail?.cause)).toEqual(['lease-expired'])
          const [open, close] = v.evidence.windowMs as [number, number]
          expect(freed[0]!.t).toBeGreaterThanOrEqual(open)
          expect(freed[0]!.t).toBeLessThanOrEqual(close)
          expect(freed[0]!.t).toBeGreaterThan(v.evidence.abortedAt as number)
        }
      }
    })
  }, 240_000)

  it('fails "never" under lease-never-expires (exit 1), where the truth log frees nothing in the window', async () => {
    await withTwin(['lease-never-expires'], async dir => {
      const r = await inject(dir, 0)
      expect(r.code, r.stderr).toBe(1)
      expect(r.verdicts).toHaveLength(PINS)
      for (const v of r.verdicts) {
        expect(v.verdict).toBe('fail')
        expect(v.evidence.failure).toBe('never')
        expectAbortedDuringRead(dir, v)
        const [, close] = v.evidence.windowMs as [number, number]
        expect(events(dir, 'prefill', v.subject, 'freed').filter(f => f.t <= close)).toHaveLength(0)
      }
    })
  }, 120_000)

  it('fails "early" under expire-early (exit 1), where the truth log frees before grant + duration', async () => {
    await withTwin(['expire-early'], async dir => {
      const r = await inject(dir, 0)
      expect(r.code, r.stderr).toBe(1)
      expect(r.verdicts).toHaveLength(PINS)
      for (const v of r.verdicts) {
        expect(v.verdict).toBe('fail')
        expect(v.evidence.failure).toBe('early')
        expectAbortedDuringRead(dir, v)
        const [open] = v.evidence.windowMs as [number, number]
        const freed = events(dir, 'prefill', v.subject, 'freed')
        expect(freed.map(f => f.detail?.cause)).toEqual(['lease-expired'])
        expect(freed[0]!.t).toBeLessThan(open)
      }
    })
  }, 120_000)

  it('Ctrl-C while the READ is held exits 3 with the stall reverted: no filter, no armed lease left', async () => {
    await withTwin([], async dir => {
      const {child, done} = startCli(['inject', 'abort-mid-transfer', '-c', join(dir, 'pdchaos.yaml')])
      let stderr = ''
      child.stderr!.on('data', (b: Buffer) => {
        stderr += b.toString()
      })
      let table: string | undefined
      try {
        await new Promise<void>((ok, no) => {
          const t = setTimeout(() => no(new Error(`never reached the wait: ${stderr}`)), 60_000)
          const tick = setInterval(() => {
            if (!stderr.includes('for every window to close')) return
            clearInterval(tick)
            clearTimeout(t)
            ok()
          }, 50)
        })
        table = /nft table inet (pdchaos_\w+)/.exec(stderr)?.[1]
        if (table) expect(nftTables()).toContain(table)
      } finally {
        child.kill('SIGINT')
      }
      const r = await done
      expect(r.code, r.stderr).toBe(3)
      expect(r.stderr).toContain('interrupted')
      expect(r.stderr).toContain('READ stall reverted: verified clean')
      if (table) expect(nftTables()).not.toContain(table)
      // No armed lease: every lease file of the run moved to done/ (reverted), none left beside it.
      const leases = join(dir, 'host-state', 'leases')
      const armed = existsSync(leases) ? readdirSync(leases).filter(f => f.endsWith('.json')) : []
      expect(armed).toEqual([])
      expect(readdirSync(join(leases, 'done')).some(f => f.startsWith('abort-mid-transfer-'))).toBe(true)
    })
  }, 120_000)
})
