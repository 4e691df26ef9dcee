import {mkdirSync, mkdtempSync, readFileSync, rmSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {simDown} from '../../src/sim/lifecycle/down.js'
import {upOnFreePorts} from '../sim/lifecycle-helpers.js'
import {runCli, truth} from './cli.js'

/**
 * trip-breaker against the twin (SGLang #31206): prefill refuses the gateway (a packet filter as root) until its
 * breaker opens; each request at the open breaker must get 503 at once, decode's queues must not grow, and the
 * breaker must half-open and close. A correct twin passes every row, three times over; `--bug half-dispatch` (the
 * gateway sends decode its half alone) fails the rows that judge the open breaker.
 */

type V = {check: string; subject: string; verdict: string; summary: string}
let good: string
let bad: string

beforeAll(async () => {
  good = mkdtempSync(join(tmpdir(), 'pdchaos-test-tb-'))
  bad = mkdtempSync(join(tmpdir(), 'pdchaos-test-tb-bug-'))
  // The breaker half-opens after 10 s here instead of 60 (`suite --sim` uses 5 s).
  await upOnFreePorts({stateDir: good, deadlineS: 3, pollS: 0.5, waitS: 60, router: {cbTimeoutDurationS: 10}})
  await upOnFreePorts({
    stateDir: bad,
    deadlineS: 3,
    pollS: 0.5,
    waitS: 60,
    router: {cbTimeoutDurationS: 10},
    bugs: ['half-dispatch'],
  })
}, 180_000)

afterAll(async () => {
  for (const dir of [good, bad]) {
    if (!dir) continue
    await simDown(dir)
    rmSync(dir, {recursive: true, force: true})
  }
}, 60_000)

const inject = async (dir: string, extra: string[] = []) => {
  const r = await runCli(['inject', 'trip-breaker', '--sim', '--state-dir', dir, '--json', ...extra], {
    timeoutMs: 150_000,
  })
  const j = JSON.parse(r.stdout) as {mechanism: string; verdicts: V[]}
  const row = (check: string, subject: RegExp | string): V[] =>
    j.verdicts.filter(
      v => v.check === check && (typeof subject === 'string' ? v.subject === subject : subject.test(v.subject)),
    )
  return {r, j, row}
}

describe('trip-breaker against the twin', () => {
  it('a correct gateway: every row passes, with 0 false alarms over 3 repetitions', async () => {
    const out = join(good, 'out')
    mkdirSync(out, {recursive: true})
    for (let rep = 0; rep < 3; rep++) {
      // The last repetition also writes its journal (rendered as JUnit and HTML below).
      const files = rep === 2 ? ['--journal', join(out, 'run.json')] : []
      const {r, j, row} = await inject(good, files)
      const why = JSON.stringify(j.verdicts.filter(v => v.verdict !== 'pass'))
      expect(j.mechanism, why).toBe('packet-filter')
      expect(
        j.verdicts.filter(v => v.verdict !== 'pass'),
        `repetition ${rep + 1}: ${why}`,
      ).toEqual([])
      expect(row('fault-effect', "prefill's circuit breaker")[0]?.verdict).toBe('pass')
      const probes = row('breaker', /^pdchaos-probe-/)
      expect(probes.length).toBeGreaterThanOrEqual(1)
      expect(probes.every(v => /refused with 503/.test(v.summary))).toBe(true)
      expect(row('breaker', "decode's prealloc and transfer queues")[0]?.verdict).toBe('pass')
      expect(row('recovery', "prefill's circuit breaker half-opens and closes")[0]?.verdict).toBe('pass')
      expect(r.code).toBe(0)
    }
    // The journal rendered as JUnit and HTML, as a nightly run's reports are.
    const rendered = await runCli([
      'report',
      join(out, 'run.json'),
      '--junit',
      join(out, 'run.xml'),
      '--html',
      join(out, 'run.html'),
    ])
    expect(rendered.code, rendered.stderr).toBe(0)
    const journal = JSON.parse(readFileSync(join(out, 'run.json'), 'utf8')) as {
      scenarios: Array<{timeline?: {observations: Array<{kind: string}>}}>
    }
    expect(journal.scenarios[0]!.timeline!.observations.some(o => o.kind === 'breaker')).toBe(true)
    expect(readFileSync(join(out, 'run.xml'), 'utf8')).toMatch(
      /decode&apos;s prealloc and transfer queues|decode's prealloc and transfer queues/,
    )
    expect(readFileSync(join(out, 'run.html'), 'utf8')).toMatch(/breaker of prefill \(0 closed, 1 open, 2 half-open\)/)
    // The twin's truth agrees: the gateway never sent decode a request alone.
    expect(truth(good, 'router').filter(e => e.event === 'half-dispatch')).toEqual([])
  }, 600_000)

  it('--bug half-dispatch: the requests at the open breaker fail, and the twin shows decode sent its half ' +
    'alone', async () => {
    const {r, row} = await inject(bad)
    expect(row('fault-effect', "prefill's circuit breaker")[0]?.verdict).toBe('pass')
    const probes = row('breaker', /^pdchaos-probe-/)
    expect(probes.length).toBeGreaterThanOrEqual(1)
    expect(probes[0]!.verdict, JSON.stringify(probes)).toBe('fail')
    expect(probes[0]!.summary).toMatch(/no answer within \d+ ms with prefill's breaker open|not 503/)
    // What the check says is what happened: the gateway's truth records the decode-only dispatches.
    expect(truth(bad, 'router').filter(e => e.event === 'half-dispatch').length).toBeGreaterThan(0)
    expect(r.code).toBe(1)
  }, 300_000)
})
