import {describe, expect, it} from 'vitest'

import type {TestHost} from '../harness/test-host.js'
import {runCli} from './cli.js'
import {inject, injectRefused, matrixTwins, restart, type Outcome, TWIN_ARGS, withoutLogs} from './matrix-helpers.js'

/**
 * Proof by mutation, the defect-free half: the three faults and a co-restart against a correct twin pass, and the
 * faults pass again after the restart; no stall mechanism judges a correct watchdog failing; without /v1/loads no
 * per-batch gauge makes a failure. The defects, one per row: mutation-defects.system.test.ts and
 * mutation-defects-recovery.system.test.ts.
 */

const {twin, forget} = matrixTwins()

/** The matrix row: all four experiments, in order. */
async function allFour(h: TestHost): Promise<Record<'drop' | 'stall' | 'abort' | 'restart', Outcome>> {
  return {
    drop: await inject(h, ['drop-dest-info']),
    stall: await inject(h, ['stall-kv', '--gpu', '1']),
    abort: await inject(h, ['abort-mid-transfer', '--trials', '4']),
    restart: await restart(h),
  }
}

describe('mutation matrix: a correct twin passes', () => {
  it('no defect: the three faults and the co-restart pass, and the faults pass again on the restarted ' +
    'deployment', async () => {
    const h = await twin({})
    const m = await allFour(h)
    // After the co-restart every rank has a new pid and new ports: discovery, the drop and the stall find them again.
    const again = {
      dropAgain: await inject(h, ['drop-dest-info']),
      stallAgain: await inject(h, ['stall-kv', '--gpu', '1']),
    }
    for (const [name, o] of Object.entries({...m, ...again})) {
      expect(o.failed, `${name}: ${o.failed.join(' | ')}`).toEqual([])
      expect(o.code, `${name}: ${o.unverified.join(' | ')}`).toBe(0)
    }
    // A prefill-only restart passes too once decode's heartbeat has seen the new instance.
    const prefillOnly = await restart(h, ['prefill'])
    expect(prefillOnly.failed, prefillOnly.failed.join(' | ')).toEqual([])
  }, 600_000)

  it('no defect: no stall mechanism judges a correct watchdog failing (TCP packet filter, the twin failure point, ' +
    'the rail NIC)', async () => {
    const tcp = await twin({})
    for (const mechanism of ['packet-filter', 'twin-failpoint']) {
      const o = await inject(tcp, ['stall-kv', '--gpu', '1', '--mechanism', mechanism])
      expect(o.failed, `${mechanism}: ${o.failed.join(' | ')}`).toEqual([])
      expect(o.code, `${mechanism}: ${o.unverified.join(' | ')}`).toBe(0)
    }
    await tcp.destroy()
    forget()
    // Rail NICs with an RC limit past the deadline (2 s × 8 ≈ 16 s): the stall is the watchdog's to end (auto picks the
    // rail's filter).
    const rail = await twin({args: [...TWIN_ARGS, '--rail-nics', '--ucx-rc-timeout', '2s']})
    const o = await inject(rail, ['stall-kv', '--gpu', '1'])
    expect(o.all).toMatch(/rail1/)
    expect(o.failed, o.failed.join(' | ')).toEqual([])
    expect(o.code, o.unverified.join(' | ')).toBe(0)
  }, 600_000)
})

describe('mutation matrix: a correct twin without /v1/loads', () => {
  // An SGLang before v1_loads.py leaves pdchaos the per-batch /metrics gauges alone, whose sglang:token_usage counts
  // what was in flight at the last batch: with each request 0.34 % of the pool (as on the target of issue 27), a
  // canary batch after recovery reads more than the load's batch before the fault. That is never a failure.
  it('no-loads, a request being 0.34 % of the KV pool: no failed check; recovery proven where a write since the ' +
    'release shows it', async () => {
    const h = await twin({bugs: ['no-loads'], args: [...TWIN_ARGS, '--kv-pool-tokens', '37648']})
    for (const args of [['drop-dest-info'], ['stall-kv', '--gpu', '1'], ['abort-mid-transfer', '--trials', '4']]) {
      const o = await inject(h, args)
      expect(o.failed, `${args[0]}: ${o.failed.join(' | ')}`).toEqual([])
      // Prefill's gauges are written by the canaries' batch, then by the idle refresh the drain waits for: proven.
      expect(o.verdicts.filter(v => v.startsWith('recovery ')).join('\n')).toMatch(
        /recovery pass: prefill KV token usage back at its baseline/,
      )
      // Decode writes its gauges only every few batches: what no write after the release shows stays unverified, by
      // name. So may the failure counters, when the gateway retried a held load request once more than pdchaos can
      // attribute (its dispatch drops decode as soon as prefill fails): honest, and not a reading's freshness.
      const unproven = o.unverified.filter(
        u =>
          u.startsWith('recovery') &&
          !/not shown written|no reading of sglang:token_usage was shown to be written|more than the \d+ pdchaos can attribute/.test(
            u,
          ),
      )
      expect(unproven, `${args[0]}: ${o.unverified.join(' | ')}`).toEqual([])
    }
  }, 600_000)
})

describe('aborts counted from entry', () => {
  // Seen on an independent target: requests entered prefill about 1.03 s after the send, their aborts had been fired
  // at 0.63 s and 0.83 s, and were judged "abort lost". A twin that tokenizes one request at a time (250 ms each)
  // knows the k-th trial of a burst only k × 250 ms after it arrived and drops an abort of a rid it does not know,
  // as SGLang's TokenizerManager does: most trials' aborts arrive first. None of them may be judged lost.
  it('no defect, aborts fired before their requests enter: "not landed" (or not shown entered), ' +
    'never lost', async () => {
    const h = await twin({args: [...TWIN_ARGS, '--tokenize-ms', '250']})
    const abort = await inject(h, ['abort-mid-transfer', '--trials', '6'])
    expect(abort.failed, abort.failed.join(' | ')).toEqual([])
    const j = JSON.parse(abort.all) as {aborts: Array<{outcome: string; entry?: {shown: string}}>}
    const notEntered = j.aborts.filter(a => a.outcome === 'not-landed' || a.outcome === 'entry-unknown')
    expect(notEntered.length, abort.verdicts.join('\n')).toBeGreaterThan(0)
    expect(abort.unverified.join('\n')).toMatch(
      /not landed: the abort arrived before the request entered prefill|not shown to have entered prefill before its abort/,
    )
  }, 600_000)
})

describe('a fresh twin', () => {
  // A deployment just started opens its routes and KV connections on the first request: 1-5 s here, longer than a
  // short watchdog deadline, so the watchdog evicts pdchaos's first (warm-up) calibration request on prefill, and
  // decode, which never hears of it, holds its half until its waiting timeout. pdchaos must still calibrate (abort
  // the decode half, warm up again) rather than wait 30 s and exit 5: the README's `suite --sim` does exactly this.
  it('inject right after sim up gives verdicts, though the watchdog may evict the cold first request', async () => {
    const h = await twin({}, false)
    const o = await inject(h, ['drop-dest-info'])
    expect(o.failed, o.failed.join(' | ')).toEqual([])
    expect(o.code, o.unverified.join(' | ')).toBe(0)
  }, 300_000)
})

describe("SGLang's own timeouts inside the window, the watchdog off (issue 27): never a watchdog pass", () => {
  /** No eviction passed; each pin's eviction verdict unverified (a watchdog that is off cannot be passed). */
  const noPass = (o: Outcome, pins = 2) => {
    expect(
      o.verdicts.filter(v => /^eviction pass/.test(v)),
      o.verdicts.join(' | '),
    ).toEqual([])
    expect(
      o.unverified.filter(v => v.startsWith('eviction')),
      o.verdicts.join(' | '),
    ).toHaveLength(pins)
    expect(o.code, o.verdicts.join(' | ')).toBe(1)
  }

  it("decode's waiting timeout (1.75 s) inside [1.5 s, 2 s]: refused at plan time; allowed, unverified with and " +
    'without logs:', async () => {
    const h = await twin({watchdog: 'off', args: [...TWIN_ARGS, '--decode-waiting-timeout', '1.75']})
    const refused = await injectRefused(h, ['stall-kv', '--gpu', '1'])
    expect(refused.code).toBe(2)
    expect(refused.message).toMatch(
      /decode's waiting timeout SGLANG_DISAGGREGATION_WAITING_TIMEOUT = 1\.75 s \(read from the environment of pid \d+, decode scheduler TP0\) fires inside the watchdog window/,
    )
    expect(refused.suggestion).toMatch(/--allow-competing-timeout/)
    // With logs: decode's own line names its timeout.
    const logged = await inject(h, ['stall-kv', '--gpu', '1', '--allow-competing-timeout'])
    noPass(logged)
    expect(logged.unverified.join('\n')).toMatch(/decode's waiting timeout/)
    // Without logs: prefill's words say only that decode let go; nothing names the watchdog.
    const blind = await inject(h, ['stall-kv', '--gpu', '1', '--allow-competing-timeout'], withoutLogs(h))
    noPass(blind)
    expect(blind.all).toMatch(/logsUnread/)
  }, 600_000)

  it("prefill's bootstrap timeout (1.75 s, NIXL after #34692) inside the window: refused at plan time, dry run " +
    'included; allowed, unverified', async () => {
    const h = await twin({
      watchdog: 'off',
      args: [...TWIN_ARGS, '--sglang-version', '0.5.17', '--bootstrap-timeout', '1.75'],
    })
    // status: the version and each timeout with its value and where it was read.
    const status = await runCli(['status', '-c', h.deploymentFile], {timeoutMs: 60_000})
    expect(status.stdout).toMatch(/sglang +version 0\.5\.17 \(prefill's server_info\), backend nixl/)
    expect(status.stdout).toMatch(
      /prefill's bootstrap timeout 1\.75 s: the environment of pid \d+, prefill scheduler TP0/,
    )
    expect(status.stdout).toMatch(/decode's waiting timeout 300 s: the environment of pid \d+, decode scheduler TP0/)
    expect(status.stdout).toMatch(/decode's heartbeat bound 4 s \(2 s x 2\)/)
    for (const extra of [['--dry-run'], []]) {
      const refused = await injectRefused(h, ['drop-dest-info', ...extra])
      expect(refused.code, refused.message).toBe(2)
      expect(refused.message).toMatch(
        /prefill's bootstrap timeout SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT = 1\.75 s \(read from the environment of pid \d+, prefill scheduler TP0\)/,
      )
    }
    const allowed = await inject(h, ['drop-dest-info', '--allow-competing-timeout'])
    noPass(allowed)
    expect(allowed.unverified.join('\n')).toMatch(/SGLang's bootstrap timeout/)
    // SGLang's wording and counter, as the twin now models them.
    expect(allowed.all).toMatch(/timed out after 1\.\d+s in KVPoll\.Bootstrapping/)
    expect(allowed.all).toMatch(/num_bootstrap_failed_reqs_total \+\d/)
  }, 600_000)
})
