import {describe, expect, it} from 'vitest'

import {runCli} from './cli.js'
import {inject, matrixTwins} from './matrix-helpers.js'

/**
 * Decode's half of a pin (SGLang issue 30, item 2): `inject kill-prefill --instance` on the twin, whose decode heartbeat
 * is 2 s × 2 (a 4 s bound). Decode holds two halves in its transfer queue (WaitingForInput) when prefill is SIGKILLed; a
 * correct twin's heartbeat releases them with a 500 naming "Lost connection with prefill instance" within the bound,
 * three times out of three. With `sim up --heartbeat off` (decode's environment still states 2 s × 2) decode holds them
 * until its waiting timeout: the run fails, names the halves still held, and pdchaos brings the pair back anyway.
 */

const {twin} = matrixTwins()

const decodeRows = (verdicts: string[]): string[] => verdicts.filter(v => v.startsWith('decode-release'))

describe("kill-prefill: decode's half of a pin, released within decode's heartbeat bound", () => {
  it('a correct twin releases every half by its heartbeat within the bound, 3 times out of 3', async () => {
    const h = await twin({args: ['--heartbeat-interval', '2', '--cb-timeout-duration-secs', '5']})
    for (let i = 0; i < 3; i++) {
      const o = await inject(h, ['kill-prefill', '--instance'])
      const rows = decodeRows(o.verdicts)
      expect(o.code, o.all).toBe(0)
      expect(rows, o.all).toHaveLength(2)
      for (const r of rows)
        expect(r).toMatch(
          /pass: released \d\.\d\d s after the kill \(500, heartbeat\): within decode's heartbeat bound 2 s × 2 = 4 s \+ ε 1 s/,
        )
      expect(o.verdicts.filter(v => v.startsWith('cleanup'))[0], o.all).toMatch(/pass: .*a listener on port/)
    }
  }, 600_000)

  it('sim up --heartbeat off: the halves stay held past the bound (fail), and the pair is brought back', async () => {
    const h = await twin({
      args: [
        '--heartbeat-interval',
        '2',
        '--cb-timeout-duration-secs',
        '5',
        '--heartbeat',
        'off',
        '--waiting-timeout',
        '60',
      ],
    })
    const o = await inject(h, ['kill-prefill', '--instance'])
    expect(o.code, o.all).toBe(1)
    const rows = decodeRows(o.verdicts)
    expect(rows).toHaveLength(2)
    for (const r of rows)
      expect(r).toMatch(
        /fail: decode still held its half \d+\.\d\d s after the kill, past decode's heartbeat bound 2 s × 2 = 4 s/,
      )
    // Decode kept the dead prefill's endpoints (#34289): pdchaos co-restarted decode and the router, so the canaries pass.
    expect(o.verdicts.filter(v => v.startsWith('recovery') && v.includes('requests'))[0], o.all).toMatch(/pass/)
    expect(
      o.failed.every(f => f.startsWith('decode-release')),
      o.all,
    ).toBe(true)
  }, 300_000)

  it('--dry-run prints the plan with the bound and kills nothing', async () => {
    const h = await twin({})
    const r = await runCli(['inject', 'kill-prefill', '--instance', '-c', h.deploymentFile, '--dry-run'], {
      timeoutMs: 60_000,
    })
    expect(r.code, r.stdout + r.stderr).toBe(0)
    expect(r.stdout).toMatch(/SIGKILL the prefill server \(pid \d+\) and its 2 rank\(s\)/)
    expect(r.stdout).toMatch(/decode's heartbeat bound 2 s × 2 = 4 s/)
    const after = await runCli(['status', '-c', h.deploymentFile, '--json'], {timeoutMs: 60_000})
    expect(after.code).toBe(0)
  }, 120_000)
})
