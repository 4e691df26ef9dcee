import {mkdtempSync, rmSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {simDown} from '../../src/sim/lifecycle/down.js'
import {upOnFreePorts} from '../sim/lifecycle-helpers.js'
import {runCli, truth} from './cli.js'

/**
 * Why pins go to prefill and decode directly. The twin's router retries as sgl-model-gateway does (5 attempts, a new
 * bootstrap room each, each attempt waiting for decode too). A pin sent through it is evicted by a correct watchdog
 * inside its window, by ground truth, yet the client sees no answer in the window: judged through the router, a
 * correct watchdog fails. Sent directly, the same pins pass.
 */

const DEADLINE = 1.5
const POLL = 0.5
let dir: string

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'pdchaos-test-pinpath-'))
  await upOnFreePorts({stateDir: dir, deadlineS: DEADLINE, pollS: POLL, waitS: 60})
}, 120_000)

afterAll(async () => {
  if (dir) {
    await simDown(dir)
    rmSync(dir, {recursive: true, force: true})
  }
}, 60_000)

const inject = async (path: 'direct' | 'router') => {
  const r = await runCli(
    [
      'inject',
      'drop-dest-info',
      '--mechanism',
      'twin-failpoint',
      '--sim',
      '--state-dir',
      dir,
      '--json',
      '--pins',
      '2',
      '--load-interval',
      '0',
      '--pin-path',
      path,
    ],
    {timeoutMs: 120_000},
  )
  return {
    code: r.code,
    j: JSON.parse(r.stdout) as {
      pins: Array<{rid: string; verdict: string; evidence: Record<string, unknown>}>
      verdicts: Array<{check: string; verdict: string; summary: string}>
    },
  }
}

/** Ground truth: how long prefill held each pin's request(s) before its watchdog evicted it, seconds. */
function heldByWatchdog(rid: string): number[] {
  return truth(dir, 'prefill')
    .filter(e => e.rid === rid && e.event === 'watchdog_evicted')
    .map(e => (e.detail as {heldS: number}).heldS)
}

describe('pins and a retrying router', () => {
  it('through the router, a correct watchdog is judged failing; sent directly, the same pins pass', async () => {
    const routed = await inject('router')
    expect(routed.j.pins).toHaveLength(2)
    for (const p of routed.j.pins) {
      // The twin's watchdog evicted the pin's prefill request inside its window...
      const held = heldByWatchdog(p.rid)
      expect(held.length).toBeGreaterThanOrEqual(1)
      expect(held[0]!).toBeGreaterThanOrEqual(DEADLINE)
      expect(held[0]!).toBeLessThanOrEqual(DEADLINE + POLL + 0.1)
      // ...and yet, through the router, pdchaos's verdict is a failure: the wrong verdict this design avoids.
      expect(p.verdict).toBe('fail')
    }
    expect(routed.code).toBe(1)

    const direct = await inject('direct')
    expect(direct.j.pins).toHaveLength(2)
    for (const p of direct.j.pins) {
      expect(heldByWatchdog(p.rid)).toHaveLength(1)
      expect(p.verdict).toBe('pass')
    }
    expect(direct.j.verdicts.filter(v => v.verdict === 'fail').map(v => `${v.check}: ${v.summary}`)).toEqual([])
    expect(direct.code).toBe(0)
  }, 240_000)
})
