import {describe, expect, it} from 'vitest'
import type {InjectResult} from '../../src/experiment/inject.js'
import {renderHtml} from '../../src/report/html.js'
import {failedChecks, runCounts, runIdOf, runPassed, scenarioFromInject, scenarioFromRestart, type SuiteRun} from '../../src/model/run.js'
import type {RestartResult} from '../../src/restart/co-restart.js'
import {NASTY, syntheticRun, T0} from './synthetic-run.js'

describe('the run model', () => {
  it('is plain JSON: a journal read back renders the same reports', () => {
    const run = syntheticRun({failing: true})
    const back = JSON.parse(JSON.stringify(run)) as SuiteRun
    expect(back).toEqual(run)
    expect(renderHtml(back)).toBe(renderHtml(run))
  })

  it('counts verdicts, names the failed checks, and judges the run', () => {
    const failing = syntheticRun({failing: true})
    expect(runCounts(failing)).toEqual({verdicts: 15, passed: 14, failed: 1, scenarios: 3, errored: 0, faultsLeftBehind: 0})
    expect(failedChecks(failing).map((f) => [f.scenario, f.verdict.check, f.verdict.subject])).toEqual([['drop-dest-info', 'eviction', NASTY]])
    expect(runPassed(failing)).toBe(false)
    const passing = syntheticRun({failing: false})
    expect(runPassed(passing)).toBe(true)
    // A fault not verified clean, a stop, or an errored scenario each fail an otherwise green run; a gate decides alone.
    const dirty = syntheticRun({failing: false})
    dirty.scenarios[0].leases[0].verifiedClean = false
    expect(runCounts(dirty).faultsLeftBehind).toBe(1)
    expect(runPassed(dirty)).toBe(false)
    expect(runPassed({...passing, stopped: {reason: 'interrupted'}})).toBe(false)
    expect(runPassed({...passing, scenarios: [{...passing.scenarios[0], error: 'prefill unreachable'}]})).toBe(false)
    expect(runPassed({...failing, gate: {passed: true, reasons: []}})).toBe(true)
    expect(runIdOf({...passing, runId: undefined})).toBe(`r-${new Date(T0).toISOString().replace(/[-:]/g, '').replace(/\.\d+Z$/, 'Z')}`)
  })

  it('adapts inject and restart results into scenarios', () => {
    const s = syntheticRun({failing: true}).scenarios[0]
    const inject = {
      fault: 'drop-dest-info', mechanism: 'packet-filter', description: '', plan: {} as InjectResult['plan'], pins: s.pins, verdicts: s.verdicts,
      summary: {passed: 5, failed: 1}, lease: s.leases[0], timeline: s.timeline,
    } satisfies InjectResult
    const a = scenarioFromInject('drop', inject, {contract: s.contract, params: {}, startedAt: s.startedAt, finishedAt: s.finishedAt})
    expect(a).toMatchObject({name: 'drop', kind: 'inject', fault: 'drop-dest-info', leases: [s.leases[0]], pins: s.pins})
    const r = syntheticRun({failing: false}).scenarios[2]
    const restart: RestartResult = {
      steps: [], totalMs: 6100, canaries: [], watch: {samples: [], requests: []}, verdicts: r.verdicts,
      observations: [...(r.timeline?.observations ?? [])].reverse(),
    }
    const b = scenarioFromRestart('co-restart', restart, {contract: r.contract, startedAt: r.startedAt, finishedAt: r.finishedAt})
    expect(b.kind).toBe('restart')
    const times = (b.timeline?.observations ?? []).map((o) => o.t)
    expect(times).toEqual([...times].sort((x, y) => x - y))
    expect(times).toHaveLength(r.timeline?.observations.length ?? -1)
  })

  it('draws a fault that was never reverted as open to the end of the scenario, and says so', () => {
    const run = syntheticRun({failing: false})
    run.scenarios[0].leases[0] = {...run.scenarios[0].leases[0], revertedAt: null, verifiedClean: false}
    const html = renderHtml(run)
    expect(html).toContain('drop-dest-info (L-drop-1) — not verified clean — not reverted')
    expect(html).toContain('<b>1</b> faults left behind')
    expect(html).toMatch(/<h1><span class="badge fail">FAIL<\/span>/)
  })
})
