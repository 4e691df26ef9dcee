import {existsSync, readFileSync} from 'node:fs'
import {join} from 'node:path'

import {afterEach, describe, expect, it} from 'vitest'

import {createTestHost, type SimUpOptions, type TestHost} from '../harness/test-host.js'
import {runCli} from './cli.js'

/**
 * Proof by mutation: the same experiments — the three faults and a co-restart — against the twin once per
 * defect and once with none. Every defect must turn the verdict to fail with the defect visible in the evidence;
 * the defect-free twin must pass, and pass again.
 */

const DEADLINE = 1.5
const POLL = 0.5
let host: TestHost | undefined

afterEach(async () => {
  await host?.destroy()
  host = undefined
}, 60_000)

interface Outcome {
  code: number | null
  failed: string[]
  all: string
}

/** A twin that has served one request (createTestHost warms it): these tests are about verdicts, not cold starts. */
async function twin(extra: SimUpOptions, warm = true): Promise<TestHost> {
  host = await createTestHost({twin: {deadlineSeconds: DEADLINE, pollSeconds: POLL, args: ['--heartbeat-interval', '2'], ...extra}, warm})
  return host
}

async function inject(h: TestHost, args: string[]): Promise<Outcome> {
  const r = await runCli(['inject', ...args, '-c', h.deploymentFile, '--json', '--pins', '2', '--load-interval', '400'], {timeoutMs: 120_000})
  return outcome(h, r)
}

/** The twin's own account of the last moments (its server logs, minus the health and metrics polling). */
function twinLogTail(h: TestHost): string {
  return (['prefill', 'decode'] as const).map((role) => {
    const file = join(h.stateDir, 'logs', `${role}.log`)
    const lines = existsSync(file) ? readFileSync(file, 'utf8').split('\n').filter((l) => l && !/GET \/(health|metrics|v1\/loads)/.test(l)) : []
    return `${role}.log: ${lines.slice(-6).join(' | ')}`
  }).join('\n')
}

function outcome(h: TestHost, r: {code: number | null; stdout: string; stderr: string}): Outcome {
  let j: {verdicts?: Array<{verdict: string; check: string; summary: string}>; error?: {message: string}} = {}
  try { j = JSON.parse(r.stdout) as typeof j } catch { /* not JSON: reported below */ }
  // An error instead of verdicts is not a verdict: fail the test with what pdchaos said, and what the twin saw.
  if (!j.verdicts) throw new Error(`pdchaos exited ${r.code} without verdicts: ${j.error?.message ?? r.stdout.slice(0, 300)} ${r.stderr.slice(-300)}\n${twinLogTail(h)}`)
  return {code: r.code, failed: j.verdicts.filter((v) => v.verdict === 'fail').map((v) => `${v.check}: ${v.summary}`), all: r.stdout}
}

async function restart(h: TestHost, services: string[] = []): Promise<Outcome> {
  const r = await runCli(['restart', '-c', h.deploymentFile, '--json', '--watch', '3', '--settle', '3', '--health-timeout', '60',
    ...services.flatMap((s) => ['--service', s])], {timeoutMs: 180_000})
  return outcome(h, r)
}

/** The matrix row: all four experiments, in order. */
async function allFour(h: TestHost): Promise<Record<'drop' | 'stall' | 'abort' | 'restart', Outcome>> {
  return {
    drop: await inject(h, ['drop-dest-info']),
    stall: await inject(h, ['stall-kv', '--gpu', '1']),
    abort: await inject(h, ['abort-mid-transfer', '--trials', '4']),
    restart: await restart(h),
  }
}

describe('mutation matrix: every twin defect turns the verdict to fail', () => {
  it('no defect: the three faults and the co-restart pass, twice', async () => {
    const h = await twin({})
    for (let round = 0; round < 2; round++) {
      const m = await allFour(h)
      for (const [name, o] of Object.entries(m)) expect(o.failed, `round ${round} ${name}`).toEqual([])
      for (const o of Object.values(m)) expect(o.code).toBe(0)
    }
    // A prefill-only restart passes too once decode's heartbeat has seen the new instance.
    expect((await restart(h, ['prefill'])).failed).toEqual([])
  }, 600_000)

  it('no defect: no stall mechanism judges a correct watchdog failing (TCP packet filter, the twin failure point, the rail NIC)', async () => {
    const tcp = await twin({})
    for (const mechanism of ['packet-filter', 'twin-failpoint']) {
      const o = await inject(tcp, ['stall-kv', '--gpu', '1', '--mechanism', mechanism])
      expect(o.failed, mechanism).toEqual([])
      expect(o.code, mechanism).toBe(0)
    }
    await tcp.destroy()
    host = undefined
    // Rail NICs with an RC limit past the deadline (2 s × 8 ≈ 16 s): the stall is the watchdog's to end (auto picks the rail's filter).
    const rail = await twin({args: ['--heartbeat-interval', '2', '--rail-nics', '--ucx-rc-timeout', '2s']})
    const o = await inject(rail, ['stall-kv', '--gpu', '1'])
    expect(o.all).toMatch(/rail1/)
    expect(o.failed).toEqual([])
    expect(o.code).toBe(0)
  }, 600_000)

  it('--watchdog off: pins are never evicted', async () => {
    const m = await allFour(await twin({watchdog: 'off'}))
    expect(m.drop.code).toBe(1)
    expect(m.drop.failed.join('\n')).toMatch(/never evicted/)
    expect(m.drop.failed.join('\n')).toMatch(/watchdog is off/)
    expect(m.stall.failed.join('\n')).toMatch(/never evicted: .* in the inflight queue \(Transferring\)/)
  }, 600_000)

  it('--watchdog inflight: a Bootstrapping pin is reported outside its scope', async () => {
    const m = await allFour(await twin({watchdog: 'inflight'}))
    expect(m.drop.code).toBe(1)
    expect(m.drop.failed.join('\n')).toMatch(/outside the watchdog's scope: held in the bootstrap queue \(Bootstrapping\)/)
    expect(m.stall.failed).toEqual([])
  }, 600_000)

  it('abort-race with the watchdog off: a lost abort leaves the request held', async () => {
    const m = await allFour(await twin({watchdog: 'off', bugs: ['abort-race']}))
    expect(m.abort.code).toBe(1)
    expect(m.abort.failed.join('\n')).toMatch(/abort lost and the pin is still held/)
  }, 600_000)

  it('early-evict: evictions before the deadline are false timeouts', async () => {
    const m = await allFour(await twin({bugs: ['early-evict']}))
    expect(m.drop.code).toBe(1)
    expect(m.drop.failed.join('\n')).toMatch(/evicted early: after (0\.[6-9]|1\.[0-4])\d*s/)
  }, 600_000)

  it('late-evict: evictions two polls after the deadline are late', async () => {
    const m = await allFour(await twin({bugs: ['late-evict']}))
    expect(m.drop.code).toBe(1)
    expect(m.drop.failed.join('\n')).toMatch(/evicted late/)
  }, 600_000)

  it('leak-on-evict: KV tokens do not return to their baseline', async () => {
    const m = await allFour(await twin({bugs: ['leak-on-evict']}))
    // A Bootstrapping pin holds no KV yet (prefill allocates at the forward): the leak shows on Transferring pins.
    expect(m.stall.code).toBe(1)
    expect(m.stall.failed.join('\n')).toMatch(/KV token usage did not return to its baseline: .* a leak/)
  }, 600_000)

  it('stale-prefill-ports with a prefill-only restart: requests after the restart are pinned', async () => {
    const h = await twin({bugs: ['stale-prefill-ports']})
    const m = await allFour(h)
    for (const name of ['drop', 'stall', 'abort'] as const) expect(m[name].failed, name).toEqual([])
    const r = await restart(h, ['prefill'])
    expect(r.code).toBe(1)
    expect(r.failed.join('\n')).toMatch(/canar|pinned/)
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
    expect(o.failed).toEqual([])
    expect(o.code).toBe(0)
  }, 300_000)
})
