import {describe, expect, it} from 'vitest'

import {inject, matrixTwins, suite, TWIN_ARGS} from './matrix-helpers.js'

/**
 * Proof by mutation, the defects: every defect must turn the verdict of the experiment that exercises it to fail,
 * with the defect visible in the evidence. A row runs only the experiments it judges (the others would only cost
 * minutes: a watchdog that is off holds every pin to the end of its window). This file: the watchdog's and
 * the aborts' defects; mutation-defects-recovery.system.test.ts: recovery's (the two files run side by side). The defect-free
 * half: mutation-matrix.system.test.ts.
 */

const {twin} = matrixTwins()

describe('mutation matrix: every twin defect turns the verdict to fail', () => {
  it('--watchdog off: pins are never evicted, and the verdict names the state each was left in', async () => {
    // The stall: its pins are left Transferring in the inflight queue (a drop's would be Bootstrapping, as the
    // inflight row below shows), and the evidence says the watchdog is off.
    const stall = await inject(await twin({watchdog: 'off'}), ['stall-kv', '--gpu', '1'])
    expect(stall.code).toBe(1)
    expect(stall.failed.join('\n')).toMatch(/never evicted: .* in the inflight queue \(Transferring\)/)
    expect(stall.failed.join('\n')).toMatch(/watchdog is off/)
  }, 600_000)

  it('--watchdog inflight: a Bootstrapping pin is reported outside its scope', async () => {
    const h = await twin({watchdog: 'inflight'})
    // The stall first: the drop's held load fails through the router and opens its circuit breaker, which the next
    // experiment would wait out (about a minute).
    const stall = await inject(h, ['stall-kv', '--gpu', '1'])
    const m = {drop: await inject(h, ['drop-dest-info']), stall}
    expect(m.drop.code).toBe(1)
    expect(m.drop.failed.join('\n')).toMatch(
      /outside the watchdog's scope: held in the bootstrap queue \(Bootstrapping\)/,
    )
    expect(m.stall.failed, m.stall.failed.join(' | ')).toEqual([])
  }, 600_000)

  // abort-race is prefill's own path only (decode's ABORT still fails the room): aborts sent to prefill alone show it.
  it('abort-race with the watchdog off: a lost abort leaves the request held', async () => {
    const abort = await inject(await twin({watchdog: 'off', bugs: ['abort-race']}), [
      'abort-mid-transfer',
      '--trials',
      '6',
      '--side',
      'prefill',
    ])
    expect(abort.code).toBe(1)
    expect(abort.failed.join('\n')).toMatch(/abort lost and the pin is still held/)
  }, 600_000)

  it('abort-race with the watchdog on: the abort check fails (the abort was lost), the eviction check passes the ' +
    'watchdog', async () => {
    const abort = await inject(await twin({bugs: ['abort-race']}), [
      'abort-mid-transfer',
      '--trials',
      '6',
      '--side',
      'prefill',
    ])
    expect(abort.code).toBe(1)
    const lost = abort.verdicts.filter(v => /^abort fail: abort lost; released by the watchdog after/.test(v))
    expect(lost.length, abort.verdicts.join('\n')).toBeGreaterThan(0)
    // Each lost abort's request was evicted by a correct watchdog: a pass of its own, and no eviction failure.
    expect(abort.verdicts.filter(v => /^eviction pass: .*after its abort was lost/.test(v))).toHaveLength(lost.length)
    expect(abort.failed.filter(f => f.startsWith('eviction'))).toEqual([])
  }, 600_000)

  it("prefill-only abort race: the suite's prefill set fails the abort check, its both set is rescued by decode's " +
    'ABORT and says so', async () => {
    // The gateway's way (both sides) hides the defect: decode's ABORT reaches prefill over ZMQ and fails the room.
    // The prefill set has no ABORT to rescue it: the watchdog evicts, and the abort is lost.
    const r = await suite(await twin({bugs: ['abort-race']}), [
      {name: 'both', fault: 'abort-mid-transfer', params: {gpu: 1, trials: 6}},
      {name: 'prefill', fault: 'abort-mid-transfer', params: {gpu: 1, trials: 6, side: 'prefill'}},
    ])
    const {both, prefill} = r.scenarios
    expect(prefill!.failed.filter(f => f.startsWith('abort')).length, prefill!.verdicts.join('\n')).toBeGreaterThan(0)
    expect(prefill!.failed.join('\n')).toMatch(/abort: abort lost; released by the watchdog/)
    expect(
      prefill!.aborts
        .filter(a => a.outcome === 'lost-then-evicted')
        .every(a => a.releasedBy?.path === 'watchdog' && a.entry?.shown === 'before'),
    ).toBe(true)
    expect(both!.failed, both!.failed.join(' | ')).toEqual([])
    // In the window (Transferring): an abort that met its request still in the bootstrap queue is prefill's own to
    // honour (the race is only that of a transfer under way), and lies outside the window anyway.
    const honoured = both!.aborts.filter(a => a.outcome === 'honoured' && a.inWindow)
    expect(honoured.length, both!.verdicts.join('\n')).toBeGreaterThan(0)
    expect(
      honoured.every(a => a.releasedBy?.path === 'decode-abort'),
      JSON.stringify(honoured),
    ).toBe(true)
    expect(r.code).toBe(1)
  }, 600_000)

  it('no-watchdog-counter: the counter balance is unverified, not failed or skipped, and the evictions are still ' +
    'judged', async () => {
    const drop = await inject(await twin({bugs: ['no-watchdog-counter']}), ['drop-dest-info'])
    expect(drop.failed, drop.failed.join(' | ')).toEqual([])
    expect(drop.unverified.join('\n')).toMatch(
      /recovery: the failure counter balance is unverified: prefill does not export sglang:num_watchdog_evicted_reqs_total/,
    )
    expect(drop.verdicts.filter(v => v.startsWith('eviction pass'))).toHaveLength(2)
    // An unverified counter does not block the gate by default (only an unverified eviction does).
    expect(drop.code, drop.unverified.join(' | ')).toBe(0)
  }, 600_000)

  it('early-evict: evictions before the deadline are false timeouts', async () => {
    const drop = await inject(await twin({bugs: ['early-evict']}), ['drop-dest-info'])
    expect(drop.code).toBe(1)
    // By the watchdog's own clock (its log line, watchdog.logPattern) or, without it, by the answer.
    expect(drop.failed.join('\n')).toMatch(/evicted early: (after|the watchdog held it) (0\.[6-9]|1\.[0-4])\d*s/)
  }, 600_000)

  it('late-evict: evictions two polls after the deadline are late', async () => {
    const drop = await inject(await twin({bugs: ['late-evict']}), ['drop-dest-info'])
    expect(drop.code).toBe(1)
    expect(drop.failed.join('\n')).toMatch(/evicted late/)
  }, 600_000)

  it("release by decode's waiting timeout inside the window: reported as such, not a watchdog pass", async () => {
    // A late watchdog (deadline + 2 polls) behind a decode whose own waiting timeout (1.75 s, decode's environment
    // only) falls inside the window
    // [1.5 s, 2 s]: decode lets go first, its ABORT fails the prefill request, and the answer lands where a punctual
    // eviction would. Decode's own log line names the timeout.
    const h = await twin({bugs: ['late-evict'], args: [...TWIN_ARGS, '--decode-waiting-timeout', '1.75']})
    // The plan refuses it (the timeout fires inside the window): run anyway, to see the release named afterwards.
    const stall = await inject(h, ['stall-kv', '--gpu', '1', '--allow-competing-timeout'])
    expect(
      stall.verdicts.filter(v => /^eviction pass/.test(v)),
      stall.verdicts.join(' | '),
    ).toEqual([])
    const byDecode = stall.unverified.filter(v =>
      /^eviction: released by decode's waiting timeout .* inside the deadline window: not a watchdog eviction/.test(v),
    )
    expect(byDecode.length, stall.verdicts.join(' | ')).toBeGreaterThan(0)
    expect(stall.all).toMatch(/Decode transfer failed for request rank=\d+ decode_req\.req\.rid=/)
  }, 600_000)
})
