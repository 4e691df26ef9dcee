import {describe, expect, it} from 'vitest'

import {vllmProcessTrees} from '../../../src/engines/vllm/detect.js'
import {stopTiming} from '../../../src/engines/vllm/faults/heartbeat-stop.js'
import {killTargets, vllmKillDecodePlan} from '../../../src/engines/vllm/faults/kill-decode.js'
import {pickWedgeTarget, vllmWedgePlan} from '../../../src/engines/vllm/faults/wedge-rank.js'
import {leaseContract} from '../../../src/engines/vllm/lease-contract.js'
import {logsAtDebug, parseRenewalLog} from '../../../src/engines/vllm/renewal-log.js'

const config = (extra: Record<string, unknown> = {}) => ({
  kv_connector: 'NixlConnector',
  kv_role: 'kv_both',
  kv_connector_extra_config: extra,
})
const lease12 = leaseContract(config({kv_lease_duration: 12}), {})
const serve = 'vllm serve m --port 8200 --kv-transfer-config {}'
const rows = [
  {pid: 100, ppid: 1, args: serve},
  {pid: 101, ppid: 100, args: 'VLLM::EngineCore'},
  {pid: 102, ppid: 101, args: 'VLLM::Worker_TP0'},
  {pid: 103, ppid: 101, args: 'VLLM::Worker_TP1'},
]
const tree = vllmProcessTrees(rows)[0]!

describe('wedge-rank on vLLM (plan)', () => {
  it("stops D's TP worker N with --gpu N, its engine core without", () => {
    expect(pickWedgeTarget(tree, 1)).toEqual({title: 'VLLM::Worker_TP1', pid: 103, tpRank: 1})
    expect(pickWedgeTarget(tree, undefined)).toEqual({title: 'VLLM::EngineCore', pid: 101})
  })

  it('refuses a TP rank D has no worker for (at TP 1 the worker runs in the engine core)', () => {
    const tp1 = vllmProcessTrees(rows.slice(0, 2))[0]!
    const r = pickWedgeTarget(tp1, 0)
    expect('refusal' in r && r.refusal).toContain('no VLLM::Worker_TP0')
    expect('hint' in r && r.hint).toContain('omit --gpu')
  })

  it('refuses --side prefill with the reason: nothing to judge', () => {
    const r = vllmWedgePlan({
      side: 'prefill',
      target: {title: 'x', pid: 5, startTicks: 1},
      p: lease12,
      d: lease12,
      requests: 2,
      logFile: undefined,
    })
    expect('refusal' in r && r.refusal).toContain('nothing to judge')
  })

  it("refuses a P whose kv_lease_duration is not on its command line (lease or legacy can't be told)", () => {
    const r = vllmWedgePlan({
      side: 'decode',
      target: {title: 'VLLM::EngineCore', pid: 101, startTicks: 7},
      p: leaseContract(config(), {}),
      d: undefined,
      requests: 2,
      logFile: undefined,
    })
    expect('refusal' in r && r.refusal).toContain('kv_lease_duration')
  })

  it("plans SIGSTOP by identity, D's interval and P's duration and extension, and a TTL covering the run", () => {
    const p = vllmWedgePlan({
      side: 'decode',
      target: {title: 'VLLM::Worker_TP1', pid: 103, startTicks: 42},
      p: lease12,
      d: leaseContract(config({kv_lease_duration: 30}), {}),
      requests: 2,
      logFile: '/l',
    })
    if ('refusal' in p) throw new Error(p.refusal)
    expect(p.sigstop.inject[0]!.slice(-3)).toEqual(['103', '42', 'STOP'])
    expect(p.sigstop.revert[0]!.slice(-3)).toEqual(['103', '42', 'CONT'])
    expect([p.settings.duration!.seconds, p.settings.extension!.seconds]).toEqual([12, 8])
    expect(p.settings.heartbeatInterval!.seconds).toBe(5)
    expect(p.leaseTtlMs).toBeGreaterThan(p.timing.holdRenewedMs + p.timing.holdStopMs)
  })

  it('refuses a --ttl shorter than the run (the host would SIGCONT mid-run)', () => {
    const o = {side: 'decode' as const, target: {title: 'E', pid: 101, startTicks: 1}, p: lease12, d: lease12}
    const r = vllmWedgePlan({...o, requests: 2, ttlS: 10, logFile: undefined})
    expect('refusal' in r && r.refusal).toContain('--ttl 10 s is shorter than the run')
    expect('refusal' in vllmWedgePlan({...o, requests: 2, ttlS: 60, logFile: undefined})).toBe(false)
  })

  it('holds the renewed requests past duration − extension + interval, and the stop past every window', () => {
    const s = {
      mode: 'lease' as const,
      duration: {seconds: 12, source: ''},
      extension: {seconds: 8, source: ''},
      heartbeatInterval: {seconds: 2, source: ''},
      stepMs: 500,
      reaperMs: 500,
    }
    expect(stopTiming(s, 2)).toEqual({renewed: 1, fresh: 1, holdRenewedMs: 7500, holdStopMs: 15_500})
    expect(stopTiming(s, 1)).toMatchObject({renewed: 1, fresh: 0})
  })
})

describe('kill-decode on vLLM (plan)', () => {
  const base = {port: 8200, p: lease12, d: lease12, requests: 2, logFile: undefined}
  it("kills D's server, engine core and workers, each by pid and start time; reverts by its restart command", () => {
    const targets = killTargets(tree)!.map((t, i) => ({...t, startTicks: 10 + i}))
    const p = vllmKillDecodePlan({...base, targets, restart: ['restart-d']})
    if ('refusal' in p) throw new Error(p.refusal)
    expect(p.kill.slice(4)).toEqual(['100', '10', '101', '11', '102', '12', '103', '13'])
    expect(p.revert.slice(3)).toEqual(['pdchaos-restart', '8200', 'restart-d'])
    expect(p.targets.map(t => t.label)).toEqual([
      "D's API server",
      "D's VLLM::EngineCore",
      "D's VLLM::Worker_TP0",
      "D's VLLM::Worker_TP1",
    ])
  })

  it('refuses without a restart command for D', () => {
    const r = vllmKillDecodePlan({...base, targets: killTargets(tree), restart: undefined})
    expect('refusal' in r && r.refusal).toContain('needs a restart command')
  })

  it('refuses a target whose start time could not be read (a recycled pid could not be told)', () => {
    expect(() => vllmKillDecodePlan({...base, targets: killTargets(tree), restart: ['r']})).toThrow(/start time/)
  })

  it('judges a killed process by its identity: a pid now owned by another process counts as gone', async () => {
    const targets = [{pid: 100, startTicks: 10, label: 'D'}]
    const p = vllmKillDecodePlan({...base, targets, restart: ['r']})
    if ('refusal' in p) throw new Error(p.refusal)
    const stat = (start: number, state = 'S') => `100 (node) ${state} ${Array(18).fill(0).join(' ')} ${start} 0`
    expect(p.verifyKilled.judge(stat(10), 0).ok).toBe(false)
    expect(p.verifyKilled.judge(stat(10, 'Z'), 0).ok).toBe(true)
    expect(p.verifyKilled.judge(stat(99), 0).ok).toBe(true)
  })
})

describe("P's renewals in its log (DEBUG)", () => {
  const clock = {nearMs: Date.UTC(2026, 11, 4, 12, 0, 0), utcOffsetMin: 0}
  const log = [
    '(EngineCore_DP0 pid=7) DEBUG 12-04 11:59:58 [base_worker.py:_handle_heartbeat] Heartbeat extended lease for ' +
      'request cmpl-a-0 by 8s (old_expiry=100.0, new_expiry=108.0)',
    '(EngineCore_DP0 pid=7) WARNING 12-04 12:00:01 [base_worker.py:1] Releasing expired KV blocks for request ' +
      'cmpl-a-0 which were retrieved by 0 remote worker(s) before lease expired.',
  ].join('\n')
  it('reads each renewal with its time and extension', () => {
    expect(parseRenewalLog(log, clock)).toEqual([
      expect.objectContaining({requestId: 'cmpl-a-0', extensionS: 8, t: Date.UTC(2026, 11, 4, 11, 59, 58)}),
    ])
  })
  it('tells a log at DEBUG from one that is not', () => {
    expect(logsAtDebug(log)).toBe(true)
    expect(logsAtDebug(log.split('\n')[1]!)).toBe(false)
  })
})
