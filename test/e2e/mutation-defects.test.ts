import {describe, expect, it} from 'vitest'

import {inject, matrixTwins, restart} from './matrix-helpers.js'

/**
 * Proof by mutation, the defects: every defect must turn the verdict of the experiment that exercises it to fail,
 * with the defect visible in the evidence. A row runs only the experiments it judges (the others would only cost
 * minutes: a watchdog that is off holds every pin to the end of its window). The defect-free half:
 * mutation-matrix.test.ts.
 */

const {twin} = matrixTwins()

describe('mutation matrix: every twin defect turns the verdict to fail', () => {
  it('--watchdog off: pins are never evicted', async () => {
    const h = await twin({watchdog: 'off'})
    const m = {drop: await inject(h, ['drop-dest-info']), stall: await inject(h, ['stall-kv', '--gpu', '1'])}
    expect(m.drop.code).toBe(1)
    expect(m.drop.failed.join('\n')).toMatch(/never evicted/)
    expect(m.drop.failed.join('\n')).toMatch(/watchdog is off/)
    expect(m.stall.failed.join('\n')).toMatch(/never evicted: .* in the inflight queue \(Transferring\)/)
  }, 600_000)

  it('--watchdog inflight: a Bootstrapping pin is reported outside its scope', async () => {
    const h = await twin({watchdog: 'inflight'})
    // The stall first: the drop's held load fails through the router and opens its circuit breaker, which the next
    // experiment would wait out (about a minute).
    const stall = await inject(h, ['stall-kv', '--gpu', '1'])
    const m = {drop: await inject(h, ['drop-dest-info']), stall}
    expect(m.drop.code).toBe(1)
    expect(m.drop.failed.join('\n')).toMatch(/outside the watchdog's scope: held in the bootstrap queue \(Bootstrapping\)/)
    expect(m.stall.failed).toEqual([])
  }, 600_000)

  it('abort-race with the watchdog off: a lost abort leaves the request held', async () => {
    const abort = await inject(await twin({watchdog: 'off', bugs: ['abort-race']}), ['abort-mid-transfer', '--trials', '4'])
    expect(abort.code).toBe(1)
    expect(abort.failed.join('\n')).toMatch(/abort lost and the pin is still held/)
  }, 600_000)

  it('early-evict: evictions before the deadline are false timeouts', async () => {
    const drop = await inject(await twin({bugs: ['early-evict']}), ['drop-dest-info'])
    expect(drop.code).toBe(1)
    expect(drop.failed.join('\n')).toMatch(/evicted early: after (0\.[6-9]|1\.[0-4])\d*s/)
  }, 600_000)

  it('late-evict: evictions two polls after the deadline are late', async () => {
    const drop = await inject(await twin({bugs: ['late-evict']}), ['drop-dest-info'])
    expect(drop.code).toBe(1)
    expect(drop.failed.join('\n')).toMatch(/evicted late/)
  }, 600_000)

  it('leak-on-evict: KV tokens do not return to their baseline', async () => {
    // A Bootstrapping pin holds no KV yet (prefill allocates at the forward): the leak shows on Transferring pins.
    const stall = await inject(await twin({bugs: ['leak-on-evict']}), ['stall-kv', '--gpu', '1'])
    expect(stall.code).toBe(1)
    expect(stall.failed.join('\n')).toMatch(/KV token usage did not return to its baseline: .* a leak/)
  }, 600_000)

  it('stale-prefill-ports with a prefill-only restart: requests after the restart are pinned', async () => {
    const h = await twin({bugs: ['stale-prefill-ports']})
    // Dormant until a restart: a fault before it passes.
    expect((await inject(h, ['drop-dest-info'])).failed).toEqual([])
    const r = await restart(h, ['prefill'])
    expect(r.code).toBe(1)
    expect(r.failed.join('\n')).toMatch(/canar|pinned/)
  }, 600_000)
})
