import {describe, expect, it} from 'vitest'

import {judgeKvLeases} from '../../../src/checks/kv-lease.js'
import {leaseContract} from '../../../src/engines/vllm/lease-contract.js'
import {
  renderVllmDropPlan,
  VLLM_STEP_BOUND_MS,
  type VllmDropPlan,
  vllmDropPlan,
  vllmDropScenario,
} from '../../../src/engines/vllm/faults/drop-dest-info.js'
import {runExitCode, type SuiteRun} from '../../../src/model/run.js'

const config = (extra?: Record<string, unknown>) => ({
  kv_connector: 'NixlConnector',
  kv_role: 'kv_both',
  ...(extra ? {kv_connector_extra_config: extra} : {}),
})

const planOf = (lease: ReturnType<typeof leaseContract>): VllmDropPlan => {
  const p = vllmDropPlan(lease, {requests: 2, logFile: '/var/log/p.log', problems: []})
  if ('refusal' in p) throw new Error(p.refusal)
  return p
}

const runOf = (plan: VllmDropPlan, verdicts: ReturnType<typeof judgeKvLeases>): SuiteRun => {
  const s = vllmDropScenario(plan, {startedAt: 0, finishedAt: 1, verdicts})
  return {name: 'x', startedAt: 0, finishedAt: 1, deployment: 'd', scenarios: [s]}
}

describe('drop-dest-info on vLLM: the plan', () => {
  it("takes the lease duration from P's command line, with its source, and waits past the last window", () => {
    const p = planOf(leaseContract(config({kv_lease_duration: 12}), {}))
    expect(p.settings.mode).toBe('lease')
    expect(p.settings.duration).toEqual({
      seconds: 12,
      source: 'cmdline: --kv-transfer-config kv_connector_extra_config.kv_lease_duration',
    })
    // 12 s + step + reaper + the log's whole second: a read before that could miss a release in the window.
    expect(p.waitAfterLastGrantMs).toBeGreaterThanOrEqual(12_000 + 2 * VLLM_STEP_BOUND_MS + 1000)
    const text = renderVllmDropPlan(p).join('\n')
    expect(text).toContain('kv_lease_duration 12 s (cmdline')
    expect(text).toContain('no fault lease is taken')
    expect(text).toContain('/var/log/p.log')
  })

  it('refuses when kv_lease_duration is not on the command line (lease or legacy cannot be told)', () => {
    const p = vllmDropPlan(leaseContract(config(), {}), {requests: 2, logFile: undefined, problems: []})
    expect('refusal' in p && p.refusal).toMatch(/no kv_connector_extra_config\.kv_lease_duration/)
  })

  it('uses the legacy timeout when the deployment file states a build before the lease, env over file', () => {
    const declared = {mode: 'legacy', abortRequestTimeoutSeconds: 90}
    const fromFile = vllmDropPlan(leaseContract(config(), {}), {
      requests: 1,
      logFile: undefined,
      problems: [],
      declared,
    })
    if ('refusal' in fromFile) throw new Error(fromFile.refusal)
    expect(fromFile.settings.mode).toBe('legacy')
    expect(fromFile.settings.duration).toEqual({seconds: 90, source: 'file: vllm.lease.abortRequestTimeoutSeconds'})
    const env = leaseContract(config(), {VLLM_NIXL_ABORT_REQUEST_TIMEOUT: '120'})
    const fromEnv = vllmDropPlan(env, {requests: 1, logFile: undefined, problems: [], declared})
    if ('refusal' in fromEnv) throw new Error(fromEnv.refusal)
    expect(fromEnv.settings.duration).toEqual({seconds: 120, source: 'env: VLLM_NIXL_ABORT_REQUEST_TIMEOUT'})
    expect(renderVllmDropPlan(fromEnv)[0]).toContain('legacy abort timeout')
  })

  it("refuses when P's process was not found, naming discovery's problem", () => {
    const p = vllmDropPlan(undefined, {requests: 2, logFile: undefined, problems: ['no `vllm serve` process']})
    expect('refusal' in p && p.refusal).toContain('no `vllm serve` process')
  })

  it('says where the log would be when the deployment file names none', () => {
    const p = vllmDropPlan(leaseContract(config({kv_lease_duration: 4}), {}), {
      requests: 1,
      logFile: undefined,
      problems: [],
    })
    if ('refusal' in p) throw new Error(p.refusal)
    expect(p.evidence[0]).toContain('unreadable, verdicts unverified')
  })
})

describe('drop-dest-info on vLLM: the run record', () => {
  const plan = planOf(leaseContract(config({kv_lease_duration: 4}), {}))
  const request = {requestId: 'cmpl-a-0', sentMs: 1_000_000, answeredMs: 1_000_050, decodeSent: false}
  const line = (t: number) => ({
    t,
    resolutionMs: 1000,
    requestId: 'cmpl-a-0',
    cause: 'lease-expired' as const,
    line: 'WARNING ... Releasing expired KV blocks',
  })
  const judge = (logReleases?: ReturnType<typeof line>[]) =>
    judgeKvLeases({
      requests: [request],
      settings: plan.settings,
      ...(logReleases ? {logReleases} : {}),
      observedUntilMs: 1_010_000,
    })

  it('a release in the window is a kv-lease pass and exit 0, with the engine named', () => {
    const run = runOf(plan, judge([line(1_004_000)]))
    const s = run.scenarios[0]!
    expect(s.name).toBe('drop-dest-info (vllm)')
    expect(s.notes).toContain('engine: vllm')
    expect(s.verdicts.map(v => [v.check, v.verdict])).toEqual([['kv-lease', 'pass']])
    expect(runExitCode(run)).toBe(0)
  })

  it('a release before the lease ends fails early, exit 1', () => {
    const run = runOf(plan, judge([line(1_001_000)]))
    expect(run.scenarios[0]!.verdicts[0]!.evidence.failure).toBe('early')
    expect(runExitCode(run)).toBe(1)
  })

  it('no release line after the window closed fails never, exit 1', () => {
    const run = runOf(plan, judge([]))
    expect(run.scenarios[0]!.verdicts[0]!.evidence.failure).toBe('never')
    expect(runExitCode(run)).toBe(1)
  })

  it('an unreadable log leaves the request unverified, which blocks (exit 1) as the watchdog check does', () => {
    const run = runOf(plan, judge(undefined))
    expect(run.scenarios[0]!.verdicts[0]!.verdict).toBe('unverified')
    expect(runExitCode(run)).toBe(1)
  })
})
