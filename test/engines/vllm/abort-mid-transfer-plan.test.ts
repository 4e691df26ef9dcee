import {describe, expect, it} from 'vitest'

import {judgeAbortedLease} from '../../../src/checks/kv-lease-abort.js'
import {waitingGauges} from '../../../src/engines/vllm/experiments/abort-mid-transfer.js'
import {
  renderVllmAbortPlan,
  type VllmAbortPlan,
  vllmAbortPlan,
  vllmAbortScenario,
} from '../../../src/engines/vllm/faults/abort-mid-transfer.js'
import {leaseContract} from '../../../src/engines/vllm/lease-contract.js'
import {runExitCode, type SuiteRun} from '../../../src/model/run.js'

const config = (extra?: Record<string, unknown>) => ({
  kv_connector: 'NixlConnector',
  kv_role: 'kv_both',
  ...(extra ? {kv_connector_extra_config: extra} : {}),
})

const planOf = (extra: Record<string, unknown>, ttlS?: number): VllmAbortPlan => {
  const p = vllmAbortPlan(leaseContract(config(extra), {}), {
    requests: 2,
    logFile: '/var/log/p.log',
    problems: [],
    ...(ttlS === undefined ? {} : {ttlS}),
  })
  if ('refusal' in p) throw new Error(p.refusal)
  return p
}

describe('abort-mid-transfer on vLLM: the plan and the record', () => {
  it("takes duration and extension from P's command line and holds the READ past every window", () => {
    const p = planOf({kv_lease_duration: 12})
    expect(p.settings.duration?.seconds).toBe(12)
    expect(p.settings.extension?.seconds).toBe(8)
    // Two trials' waits, the lease, the extension and the log's second all fit in the stall's TTL.
    expect(p.stallTtlS).toBeGreaterThan(2 * 15 + 12 + 8 + 1)
    expect(p.sources.join('\n')).toContain('D heartbeats until the abort')
    const lines = renderVllmAbortPlan(p).join('\n')
    expect(lines).toContain('not from the send')
    expect(lines).toContain('reverted on every exit path')
  })

  it('warns when --ttl would lift the stall before the windows close, and refuses what drop-dest-info refuses', () => {
    expect(planOf({kv_lease_duration: 12}, 5).notes.join('\n')).toMatch(/--ttl 5 s is shorter/)
    const r = vllmAbortPlan(leaseContract(config(), {}), {requests: 1, logFile: undefined, problems: []})
    expect('refusal' in r && r.refusal).toMatch(/legacy/)
  })

  it('records each abort epoch ms, the stall lease, and a failing verdict as exit 1', () => {
    const p = planOf({kv_lease_duration: 4})
    const trial = {requestId: 'cmpl-a-0', sentMs: 1000, answeredMs: 1010, decodeSentMs: 1011, abortedMs: 1070}
    const v = judgeAbortedLease({
      ...trial,
      abortMs: trial.abortedMs,
      entry: {by: 'deferred', atMs: 1069, detail: 'x'},
      readHeld: {held: true, evidence: 'in place'},
      settings: p.settings,
      logReleases: [],
      observedUntilMs: 60_000,
    })
    const s = vllmAbortScenario(p, {startedAt: 0, finishedAt: 1, verdicts: [v], trials: [trial], leases: []})
    expect(s.params).toEqual({pins: 2, abortedAt: [1070]})
    expect(s.notes!.join('\n')).toContain('aborted at 1070 (+70 ms)')
    expect(s.verdicts[0]).toMatchObject({check: 'kv-lease', verdict: 'fail'})
    const run: SuiteRun = {name: 'x', startedAt: 0, finishedAt: 1, deployment: 'd', scenarios: [s]}
    expect(runExitCode(run)).toBe(1)
  })

  it("reads D's deferred and waiting gauges from /metrics, absent series left undefined", () => {
    const text = [
      '# HELP vllm:num_requests_waiting Number of requests waiting.',
      'vllm:num_requests_waiting{engine="0",model_name="m"} 1.0',
      'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 0.0',
      'vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="deferred"} 1.0',
    ].join('\n')
    expect(waitingGauges(text, 5)).toEqual({t: 5, waiting: 1, deferred: 1})
    expect(waitingGauges('vllm:num_requests_waiting{engine="0"} 2', 5)).toEqual({t: 5, waiting: 2})
  })
})
