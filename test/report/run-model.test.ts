import {describe, expect, it} from 'vitest'
import type {RestartResult} from '../../src/model/restart.js'
import {failedChecks, runCounts, runIdOf, runPassed, type SuiteRun} from '../../src/model/run.js'
import {renderHtml} from '../../src/report/html.js'
import {injectFields, runJournal} from '../../src/report/journal-fields.js'
import {restartScenario} from '../../src/suite/runner.js'
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
    expect(runCounts(failing)).toEqual({
      verdicts: 15,
      passed: 14,
      failed: 1,
      unverified: 0,
      scenarios: 3,
      errored: 0,
      faultsLeftBehind: 0,
    })
    expect(failedChecks(failing).map(f => [f.scenario, f.verdict.check, f.verdict.subject])).toEqual([
      ['drop-dest-info', 'eviction', NASTY],
    ])
    expect(runPassed(failing)).toBe(false)
    const passing = syntheticRun({failing: false})
    expect(runPassed(passing)).toBe(true)
    // A fault not verified clean, a stop, or an errored scenario each fail an otherwise green run; a gate decides
    // alone.
    const dirty = syntheticRun({failing: false})
    dirty.scenarios[0].leases[0].verifiedClean = false
    expect(runCounts(dirty).faultsLeftBehind).toBe(1)
    expect(runPassed(dirty)).toBe(false)
    expect(runPassed({...passing, stopped: {reason: 'interrupted'}})).toBe(false)
    expect(runPassed({...passing, scenarios: [{...passing.scenarios[0], error: 'prefill unreachable'}]})).toBe(false)
    expect(runPassed({...failing, gate: {passed: true, reasons: []}})).toBe(true)
    expect(runIdOf({...passing, runId: undefined})).toBe(
      `r-${new Date(T0)
        .toISOString()
        .replace(/[-:]/g, '')
        .replace(/\.\d+Z$/, 'Z')}`,
    )
  })

  it('gives a one-scenario run (inject) its top-level fields, and adapts a restart result into a scenario', () => {
    const run = syntheticRun({failing: true})
    const s = run.scenarios[0]
    const one: SuiteRun = {...run, scenarios: [s]}
    const f = injectFields(one)
    const failed = s.verdicts.filter(v => v.verdict === 'fail').length
    expect(failed).toBeGreaterThan(0)
    expect(f).toMatchObject({
      fault: 'drop-dest-info',
      deployment: run.deployment,
      leases: [s.leases[0]],
      summary: {passed: s.verdicts.length - failed, failed},
    })
    expect((f.pins as unknown[]).length).toBe(s.pins.length)
    for (const pin of f.pins as Array<Record<string, unknown>>)
      expect(Object.keys(pin)).toEqual([
        'rid',
        'fault',
        'sentAt',
        'evictedAt',
        'evictionSeconds',
        'bounds',
        'verdict',
        'evidence',
      ])
    // The journal is the suite's shape with those fields on top: the run's scenarios are all there.
    const j = runJournal(one, 'inject', f)
    expect(j).toMatchObject({command: 'inject', name: run.name, fault: 'drop-dest-info'})
    expect((j.scenarios as unknown[]).length).toBe(1)
    const r = syntheticRun({failing: false}).scenarios[2]
    const restart: RestartResult = {
      steps: [],
      totalMs: 6100,
      canaries: [],
      watch: {samples: [], requests: []},
      verdicts: r.verdicts,
      observations: [...(r.timeline?.observations ?? [])].reverse(),
    }
    const b = restartScenario('co-restart', restart, {
      contract: r.contract,
      startedAt: r.startedAt,
      finishedAt: r.finishedAt,
    })
    expect(b.kind).toBe('restart')
    const times = (b.timeline?.observations ?? []).map(o => o.t)
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

describe('three outcomes', () => {
  it('an unverified eviction blocks the run by default, names why, and shows in every report', async () => {
    const {evaluateGate} = await import('../../src/suite/gate.js')
    const {renderJUnit} = await import('../../src/report/junit.js')
    const {renderSuite} = await import('../../src/report/suite-text.js')
    const {GateSchema} = await import('../../src/suite/suite-file.js')
    const run = syntheticRun({failing: false})
    const ev = run.scenarios[0].verdicts.find(v => v.check === 'eviction')!
    Object.assign(ev, {
      verdict: 'unverified',
      summary: 'released by a transport error after 1.2s',
      evidence: {why: 'a transport error released it first', toVerify: 'raise UCX_RC_TIMEOUT'},
    })
    expect(runCounts(run)).toMatchObject({failed: 0, unverified: 1})
    expect(runPassed(run)).toBe(false)
    const gate = evaluateGate(run, GateSchema.parse({}))
    expect(gate.passed).toBe(false)
    expect(gate.reasons.join('\n')).toMatch(/UNVERIFIED eviction .*transport error/)
    // A gate that lets unverified evictions through passes the same run.
    expect(evaluateGate(run, GateSchema.parse({unverifiedBlocks: []})).passed).toBe(true)
    expect(renderJUnit(run)).toMatch(
      /<skipped message="unverified: released by a transport error after 1\.2s \(a transport error released it first; to verify: raise UCX_RC_TIMEOUT\)"\/>/,
    )
    expect(renderSuite(run, {wallMs: 1000})).toMatch(/unverified checks[\s\S]*to verify: raise UCX_RC_TIMEOUT/)
    expect(renderHtml(run)).toContain('<td class="verdict">UNVERIFIED</td>')
  })

  it('a scenario on a stated instance pair says so in the summary line and the HTML report', async () => {
    const {renderSuite} = await import('../../src/report/suite-text.js')
    const run = syntheticRun({failing: false})
    run.scenarios[0]!.pair = {prefill: 'services.prefill[1]', decode: 'services.decode'}
    expect(renderSuite(run, {wallMs: 1000})).toContain(`PASS  ${run.scenarios[0]!.name} (on prefill[1] + decode): `)
    expect(renderHtml(run)).toContain('<small>on services.prefill[1] + services.decode</small></h2>')
  })

  it('an unverified check outside the blocking list does not fail the run', () => {
    const run = syntheticRun({failing: false})
    const rec = run.scenarios.flatMap(s => s.verdicts).find(v => v.check === 'recovery')!
    Object.assign(rec, {verdict: 'unverified', evidence: {why: 'the counter is missing', toVerify: 'export it'}})
    expect(runPassed(run)).toBe(true)
  })
})
