import {describe, expect, it} from 'vitest'

import {inject, matrixTwins, restart} from './matrix-helpers.js'

/**
 * Proof by mutation, the defects: every defect must turn the verdict of the experiment that exercises it to fail,
 * with the defect visible in the evidence. A row runs only the experiments it judges (the others would only cost
 * minutes: a watchdog that is off holds every pin to the end of its window). This file: the defects that show
 * after the eviction (drain, KV usage, a restart); mutation-defects.system.test.ts: the watchdog's and the aborts'. The
 * defect-free half: mutation-matrix.system.test.ts.
 */

const {twin} = matrixTwins()

describe('mutation matrix: every recovery defect turns the verdict to fail', () => {
  it('no-disagg-loads: an SGLang without the loads disagg section gets no false drain failure', async () => {
    // The stall, whose Transferring pins hold KV and sit in the inflight queue: the drain is judged on the gauges
    // alone, which SGLang leaves stale on an idle server (the drop's Bootstrapping pins add no other path to it).
    const o = await inject(await twin({bugs: ['no-disagg-loads']}), ['stall-kv', '--gpu', '1'])
    expect(o.failed, o.failed.join(' | ')).toEqual([])
    expect(o.verdicts.join('\n')).toMatch(
      /recovery (pass|unverified): (every PD queue drained to 0 \(4 of them from \/metrics gauges|queues shown nonzero only by gauges that may be stale|queues read 0 only by gauges not shown written)/,
    )
  }, 600_000)

  it('leak-on-evict: KV tokens do not return to their baseline', async () => {
    // A Bootstrapping pin holds no KV yet (prefill allocates at the forward): the leak shows on Transferring pins.
    const stall = await inject(await twin({bugs: ['leak-on-evict']}), ['stall-kv', '--gpu', '1'])
    expect(stall.code).toBe(1)
    expect(stall.failed.join('\n')).toMatch(/KV token usage did not return to its baseline: .* a leak/)
  }, 600_000)

  it('stale-prefill-ports with a prefill-only restart: requests after the restart are pinned', async () => {
    const h = await twin({bugs: ['stale-prefill-ports']})
    // Dormant until a prefill-only restart: a fault and a co-restart (prefill, decode, router) before it pass.
    const before = [await inject(h, ['drop-dest-info']), await restart(h)]
    for (const o of before) expect(o.failed, o.failed.join(' | ')).toEqual([])
    const r = await restart(h, ['prefill'])
    expect(r.code).toBe(1)
    expect(r.failed.join('\n')).toMatch(/canar|pinned/)
  }, 600_000)
})
