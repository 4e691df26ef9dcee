import {createServer, type Server, type Socket} from 'node:net'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {histogramSeries, parsePromText, sampleValue, type Sample} from '../../src/deployment/prom-text.js'
import {PdError} from '../../src/errors.js'
import {deleteRun, evictionBuckets, pushRun} from '../../src/report/push.js'
import {NASTY, syntheticRun} from './synthetic-run.js'
import {freePort, type Gateway, startPushgateway} from './gateway.js'

let gw: Gateway
let url: string

async function get(path: string): Promise<{status: number; body: string}> {
  const r = await fetch(url + path, {signal: AbortSignal.timeout(5000)})
  return {status: r.status, body: await r.text()}
}

beforeAll(async () => {
  gw = await startPushgateway()
  url = gw.url
}, 200_000)

afterAll(async () => {
  await gw?.stop()
})

const pdchaos = (samples: Sample[]) => samples.filter(s => s.name.startsWith('pdchaos_'))

describe('pushRun against a real Pushgateway', () => {
  it(
    'pushes eviction histogram, per-check gauges, faults left behind, duration and the run verdict; DELETE ' +
      'removes them',
    async () => {
      const run = syntheticRun({failing: true})
      const result = await pushRun(url, run, {jobName: 'pdchaos', groupings: {run_id: 'r-test-1'}})
      expect(result.groupings).toEqual({run_id: 'r-test-1'})
      const {status, body} = await get('/metrics')
      expect(status).toBe(200)
      const {samples} = parsePromText(body, {source: 'pushgateway /metrics'})
      const group = {job: 'pdchaos', run_id: 'r-test-1'}

      expect(sampleValue(samples, 'pdchaos_run_passed', group)).toBe(0)
      expect(sampleValue(samples, 'pdchaos_faults_left_behind', group)).toBe(0)
      expect(sampleValue(samples, 'pdchaos_run_duration_seconds', group)).toBeCloseTo(16.2, 6)
      // Pass/fail per check and subject; the failing rid keeps its quotes and markup through the text format.
      expect(
        sampleValue(samples, 'pdchaos_check_passed', {
          ...group,
          scenario: 'drop-dest-info',
          check: 'eviction',
          subject: 'pin-d1',
        }),
      ).toBe(1)
      expect(
        sampleValue(samples, 'pdchaos_check_passed', {
          ...group,
          scenario: 'drop-dest-info',
          check: 'eviction',
          subject: NASTY,
        }),
      ).toBe(0)
      expect(
        sampleValue(samples, 'pdchaos_check_passed', {
          ...group,
          scenario: 'co-restart',
          check: 'restart',
          subject: 'router',
        }),
      ).toBe(1)
      const verdicts = run.scenarios.reduce((n, s) => n + s.verdicts.length, 0)
      expect(samples.filter(s => s.name === 'pdchaos_check_passed')).toHaveLength(verdicts)

      // Eviction seconds: three pins of drop-dest-info evicted (2.02, 2.15, 2.2 s; the fourth never), three of
      // stall-kv.
      const drop = histogramSeries(samples, 'pdchaos_eviction_seconds', {
        scenario: 'drop-dest-info',
        fault: 'drop-dest-info',
      })
      expect(drop).toHaveLength(1)
      expect(drop[0].count).toBe(3)
      expect(drop[0].sum).toBeCloseTo(2.02 + 2.15 + 2.2, 6)
      const le = (v: number) => drop[0].buckets.find(b => b.le === v)?.count
      expect(le(2)).toBe(0)
      expect(le(2.5)).toBe(3)
      const stall = histogramSeries(samples, 'pdchaos_eviction_seconds', {scenario: 'stall-kv gpu2', fault: 'stall-kv'})
      expect(stall[0].count).toBe(3)
      expect(evictionBuckets(run)).toContain(2.5)

      await deleteRun(url, {jobName: 'pdchaos', groupings: {run_id: 'r-test-1'}})
      const after = parsePromText((await get('/metrics')).body).samples
      expect(pdchaos(after)).toHaveLength(0)
    },
  )

  it(
    'a second push to the same run replaces the group: a cleanup that failed shows up as a fault left ' + 'behind',
    async () => {
      const run = syntheticRun({failing: false})
      await pushRun(url, run, {groupings: {run_id: 'r-test-2'}})
      let samples = parsePromText((await get('/metrics')).body).samples
      expect(sampleValue(samples, 'pdchaos_run_passed', {run_id: 'r-test-2'})).toBe(1)
      run.scenarios[1].leases[0].verifiedClean = false
      await pushRun(url, run, {groupings: {run_id: 'r-test-2'}})
      samples = parsePromText((await get('/metrics')).body).samples
      expect(sampleValue(samples, 'pdchaos_faults_left_behind', {run_id: 'r-test-2'})).toBe(1)
      expect(sampleValue(samples, 'pdchaos_run_passed', {run_id: 'r-test-2'})).toBe(0)
      expect(samples.filter(s => s.name === 'pdchaos_run_passed' && s.labels.run_id === 'r-test-2')).toHaveLength(1)
      await deleteRun(url, {groupings: {run_id: 'r-test-2'}})
      expect(pdchaos(parsePromText((await get('/metrics')).body).samples)).toHaveLength(0)
    },
  )

  it('an unreachable gateway gives a PdError with exit 5 naming the URL, quickly', async () => {
    const dead = `http://127.0.0.1:${await freePort()}`
    const started = Date.now()
    const error = await pushRun(dead, syntheticRun({failing: false})).catch((e: unknown) => e)
    expect(error).toBeInstanceOf(PdError)
    expect((error as PdError).exitCode).toBe(5)
    expect((error as PdError).message).toContain(dead)
    expect((error as PdError).message).toMatch(/ECONNREFUSED/)
    expect(Date.now() - started).toBeLessThan(3000)
  })

  it('a gateway that accepts but never answers is given up on at the deadline', async () => {
    const sockets: Socket[] = []
    const silent: Server = createServer(s => {
      sockets.push(s)
    })
    await new Promise<void>(r => silent.listen(0, '127.0.0.1', r))
    const silentUrl = `http://127.0.0.1:${(silent.address() as {port: number}).port}`
    try {
      const started = Date.now()
      const error = await pushRun(silentUrl, syntheticRun({failing: false}), {timeoutMs: 400}).catch((e: unknown) => e)
      expect(error).toBeInstanceOf(PdError)
      expect((error as PdError).exitCode).toBe(5)
      expect((error as PdError).message).toContain(silentUrl)
      expect(Date.now() - started).toBeLessThan(4000)
    } finally {
      for (const s of sockets) s.destroy()
      await new Promise(r => silent.close(r))
    }
  })

  it('a URL that is not http is bad input (exit 2), before any connection', async () => {
    const error = await pushRun('ftp://127.0.0.1:1/', syntheticRun({failing: false})).catch((e: unknown) => e)
    expect((error as PdError).exitCode).toBe(2)
  })
})
