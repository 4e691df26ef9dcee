import {spawn, spawnSync} from 'node:child_process'
import {readFileSync} from 'node:fs'
import {createServer} from 'node:net'
import {describe, expect, it} from 'vitest'

import {PdError} from '../../src/errors.js'
import type {RankInfo} from '../../src/engines/sglang/discovery/discover.js'
import type {FaultDiscovery} from '../../src/faults/fault.js'
import {KILL_SCRIPT, killPrefill, RESTART_UNLESS_SERVING} from '../../src/faults/kill-prefill.js'
import {parseFaultParams} from '../../src/faults/params.js'

/** kill-prefill's plan (pure) and its two host scripts run for real against processes and a port of this test. */

function rank(service: 'prefill' | 'decode', tp: number): RankInfo {
  const base = service === 'prefill' ? 1000 : 2000
  return {
    service,
    tpRank: tp,
    pid: base + tp,
    startTicks: 50_000 + base + tp,
    state: 'S',
    title: `sglang::scheduler_TP${tp}`,
    gpu: service === 'prefill' ? tp : 4 + tp,
  }
}

const RESTART = ['node', 'bin/run.js', 'sim', 'restart', 'prefill']
const discovery = (over: Partial<FaultDiscovery> = {}): FaultDiscovery => ({
  ranks: [0, 1].flatMap(k => [rank('prefill', k), rank('decode', k)]),
  transport: {backend: 'nixl', source: 'test'},
  servicePorts: [30_000],
  prefillServer: {pid: 900, port: 30_000},
  restart: {prefill: RESTART},
  heartbeat: {intervalSeconds: 2, maxFailure: 2, boundSeconds: 4, source: "decode's environment"},
  ...over,
})
const facts = {processes: [{pid: 900, startTicks: 4242, state: 'S'}]}
const plan = (params: Record<string, unknown>, d = discovery(), f: typeof facts | object = facts) =>
  killPrefill.plan({discovery: d, params: parseFaultParams(killPrefill, params, 'suite'), leaseId: 'L1', facts: f})

function refusal(fn: () => unknown): PdError {
  try {
    fn()
  } catch (error) {
    if (error instanceof PdError) return error
    throw error
  }
  throw new Error('expected a refusal')
}

describe('kill-prefill plan', () => {
  it('kills the server and every prefill rank by pid and start time; the revert is the guarded restart command', () => {
    const p = plan({instance: true})
    expect(p.mechanism).toBe('sigkill')
    expect(p.inject).toEqual([
      ['sh', '-c', KILL_SCRIPT, 'pdchaos-kill', '900', '4242', '1000', '51000', '1001', '51001'],
    ])
    expect(p.revert).toEqual([['sh', '-c', RESTART_UNLESS_SERVING, 'pdchaos-restart', '30000', ...RESTART]])
    expect(p.targets.map(t => t.pid)).toEqual([1000, 1001])
    expect(p.expected).toMatchObject({
      kind: 'decode-release',
      heartbeat: {boundSeconds: 4},
      epsilonSeconds: 1,
      pins: 2,
      waitSeconds: 7,
    })
    expect(p.description).toMatch(/within decode's heartbeat bound 2 s × 2 = 4 s \+ ε 1 s/)
    // --gpu N of a prefill rank: the same instance.
    expect(plan({gpu: 1}).inject).toEqual(p.inject)
  })

  it('judges the probes: killed only when no identity is alive; clean when the port has a listener', () => {
    const p = plan({instance: true})
    const stat = (pid: number, start: number, state = 'S') => `${pid} (x) ${state} ${'1 '.repeat(18)}${start} 0`
    const killed = p.verifyInjected[0]!
    expect(killed.judge('', 0).ok).toBe(true)
    expect(killed.judge(`${stat(1000, 51_000, 'Z')}\n${stat(1001, 7)}`, 0).ok).toBe(true)
    expect(killed.judge(stat(1001, 51_001), 0)).toMatchObject({ok: false, evidence: expect.stringMatching(/pid 1001/)})
    const clean = p.verifyClean[0]!
    expect(clean.argv).toEqual(['ss', '-Hltn', 'sport = :30000'])
    expect(clean.judge('LISTEN 0 511 127.0.0.1:30000 0.0.0.0:*', 0).ok).toBe(true)
    expect(clean.judge('', 0).ok).toBe(false)
  })

  it('refuses what it cannot do safely, naming why', () => {
    expect(refusal(() => plan({})).message).toMatch(/needs params.gpu N or params.instance/)
    expect(refusal(() => plan({gpu: 0, instance: true})).message).toMatch(/one of them/)
    expect(refusal(() => plan({gpu: 5})).message).toMatch(/GPU 5 runs decode TP1 .*not a prefill rank/)
    expect(refusal(() => plan({instance: true}, discovery({restart: {}}))).suggestion).toMatch(
      /services\.prefill\.restart/,
    )
    expect(refusal(() => plan({instance: true}, discovery(), {})).message).toMatch(/no start time/)
    const {prefillServer: _, ...noServer} = discovery()
    expect(refusal(() => plan({instance: true}, noServer)).message).toMatch(/prefill server's process/)
  })

  it('without decode heartbeat settings the bound is unknown and said so', () => {
    const {heartbeat: _, ...d} = discovery()
    const p = plan({instance: true, halves: 3}, d)
    expect(p.expected).toMatchObject({kind: 'decode-release', pins: 3, waitSeconds: 13})
    expect(p.expected && 'heartbeat' in p.expected).toBe(false)
    expect(p.description).toMatch(/could not be read/)
  })
})

const startOf = (pid: number): string => {
  const s = readFileSync(`/proc/${pid}/stat`, 'utf8')
  return s.slice(s.lastIndexOf(')') + 2).split(' ')[19]!
}

describe('kill-prefill host scripts (real processes)', () => {
  it('SIGKILLs a process whose start time matches, and never one whose start time does not', async () => {
    const a = spawn('sleep', ['30'])
    const b = spawn('sleep', ['30'])
    try {
      const exited = new Promise(r => a.once('exit', (_c, sig) => r(sig)))
      const ok = spawnSync('sh', ['-c', KILL_SCRIPT, 'k', String(a.pid), startOf(a.pid!), String(b.pid), '1'], {
        encoding: 'utf8',
      })
      expect(ok.status).toBe(0)
      expect(ok.stdout).toMatch(new RegExp(`SIGKILL sent to pid ${a.pid}`))
      // It returns once the killed process has exited (a zombie until this test reaps it), never in its last moments.
      const state = (() => {
        try {
          return readFileSync(`/proc/${a.pid}/stat`, 'utf8').split(') ')[1]!.charAt(0)
        } catch {
          return 'gone'
        }
      })()
      expect(['Z', 'X', 'gone']).toContain(state)
      expect(ok.stdout).toMatch(new RegExp(`pid ${b.pid} now has start time .*not signalled`))
      expect(await exited).toBe('SIGKILL')
      expect(b.exitCode).toBeNull()
      const none = spawnSync('sh', ['-c', KILL_SCRIPT, 'k', String(b.pid), '1'], {encoding: 'utf8'})
      expect(none.status).toBe(3)
      expect(spawnSync('sh', ['-c', KILL_SCRIPT, 'k', '12x', '1']).status).toBe(2)
    } finally {
      a.kill('SIGKILL')
      b.kill('SIGKILL')
    }
  })

  it('runs the restart command only when nothing listens on the port', async () => {
    const server = createServer()
    await new Promise<void>(r => server.listen(0, '127.0.0.1', () => r()))
    const port = (server.address() as {port: number}).port
    try {
      const up = spawnSync('sh', ['-c', RESTART_UNLESS_SERVING, 'r', String(port), 'echo', 'RESTARTED'], {
        encoding: 'utf8',
      })
      expect(up.status).toBe(0)
      expect(up.stdout).toMatch(/has a listener: prefill is back, not restarted/)
      expect(up.stdout).not.toMatch(/RESTARTED/)
    } finally {
      await new Promise(r => server.close(r))
    }
    const down = spawnSync('sh', ['-c', RESTART_UNLESS_SERVING, 'r', String(port), 'echo', 'RESTARTED'], {
      encoding: 'utf8',
    })
    expect(down.stdout).toMatch(/RESTARTED/)
  })
})
