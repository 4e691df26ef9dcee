import {describe, expect, it} from 'vitest'

import {runCli} from './cli.js'
import {matrixTwins} from './matrix-helpers.js'

/**
 * A prefill replaced alone behind its address (SGLang #34289): `restart --only prefill` on the twin, whose decode
 * heartbeat is 2 s × 2 (a 4 s bound). A correct twin notices the new instance at its next beat and every canary after
 * the bound completes; under --bug stale-peer decode keeps the dead instance's endpoints and the canaries after the
 * bound stall, which must fail the run and leave the deployment repaired by the co-restart.
 */

const {twin} = matrixTwins()

interface Alone {
  code: number | null
  verdicts: Array<{check: string; subject: string; verdict: string; summary: string; evidence: Record<string, unknown>}>
  alone?: {heartbeat?: {boundSeconds: number}; repaired?: string[]}
}

async function alone(file: string, role: 'prefill' | 'decode', extra: string[] = []): Promise<Alone> {
  const r = await runCli(['restart', '-c', file, '--json', '--only', role, '--health-timeout', '60', ...extra], {
    timeoutMs: 240_000,
  })
  let j: Omit<Alone, 'code'>
  try {
    j = JSON.parse(r.stdout) as Omit<Alone, 'code'>
  } catch {
    throw new Error(`pdchaos exited ${r.code} without JSON: ${r.stdout.slice(0, 300)} ${r.stderr.slice(-300)}`)
  }
  return {code: r.code, ...j}
}

const recoveryOf = (a: Alone) => a.verdicts.find(v => v.check === 'recovery')

describe("restart --only: a role replaced alone, judged against decode's heartbeat bound", () => {
  it('a correct twin recovers within the bound, 3 times out of 3 (prefill), and decode alone too', async () => {
    const h = await twin({})
    for (let i = 0; i < 3; i++) {
      const a = await alone(h.deploymentFile, 'prefill')
      const rec = recoveryOf(a)
      expect(a.code, JSON.stringify(a.verdicts.filter(v => v.verdict !== 'pass'))).toBe(0)
      expect(rec?.verdict).toBe('pass')
      // The bound came from decode's environment, as the twin sets it (2 s × 2).
      expect(a.alone?.heartbeat?.boundSeconds).toBe(4)
      expect(rec?.summary).toMatch(/canaries sent after decode's heartbeat bound 2 s × 2 = 4 s .* completed/)
      expect(a.alone?.repaired).toBeUndefined()
    }
    const d = await alone(h.deploymentFile, 'decode')
    expect(d.code, JSON.stringify(d.verdicts)).toBe(0)
    expect(recoveryOf(d)?.verdict).toBe('pass')
  }, 600_000)

  it('--bug stale-peer: canaries after the bound stall; the run fails and the co-restart brings the ' +
    'deployment back', async () => {
    const h = await twin({bugs: ['stale-peer']})
    const a = await alone(h.deploymentFile, 'prefill')
    expect(a.code).toBe(1)
    const rec = recoveryOf(a)
    expect(rec?.verdict).toBe('fail')
    expect(rec?.summary).toMatch(/canaries sent after decode's heartbeat bound .* did not complete .*SGLang #34289/)
    expect(a.alone?.repaired).toEqual(['prefill', 'decode', 'router'])
    // Repaired: a co-restart's canaries succeed again.
    const after = await runCli(
      ['restart', '-c', h.deploymentFile, '--json', '--service', 'router', '--watch', '0', '--settle', '0'],
      {timeoutMs: 120_000},
    )
    expect(after.code, after.stdout.slice(0, 500)).toBe(0)
  }, 600_000)

  it('sim up --heartbeat off: decode never notices the replaced prefill, and the run fails the same way', async () => {
    // The twin's decode still states 2 s × 2 in its environment: pdchaos expects the release that never comes.
    const h = await twin({
      args: ['--heartbeat-interval', '2', '--cb-timeout-duration-secs', '10', '--heartbeat', 'off'],
    })
    const a = await alone(h.deploymentFile, 'prefill')
    expect(a.code).toBe(1)
    expect(recoveryOf(a)?.summary).toMatch(/did not complete/)
  }, 600_000)

  it('--dry-run prints the plan with the bound and restarts nothing', async () => {
    const h = await twin({})
    const r = await runCli(['restart', '-c', h.deploymentFile, '--only', 'prefill', '--dry-run'], {timeoutMs: 60_000})
    expect(r.code).toBe(0)
    expect(r.stdout).toMatch(/plan \(dry run: nothing changed\)/)
    expect(r.stdout).toMatch(/decode's heartbeat bound 2 s × 2 = 4 s/)
    expect(r.stdout).not.toMatch(/healthy after/)
  }, 120_000)
})
