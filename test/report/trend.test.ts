import {describe, expect, it} from 'vitest'

import {pinMargin} from '../../src/model/margins.js'
import type {PinRecord, ScenarioRun, SuiteRun} from '../../src/model/run.js'
import {linearFit, trendOf} from '../../src/model/trend.js'
import {labelLanes, renderHtml, timelineSpan} from '../../src/report/html.js'
import {marginRange, renderTrendHtml} from '../../src/report/trend-html.js'
import {renderTrend} from '../../src/report/trend-text.js'
import {evaluateGate} from '../../src/suite/gate.js'
import {GateSchema} from '../../src/suite/suite-file.js'
import {syntheticRun, T0} from './synthetic-run.js'

const contract = {scope: 'all' as const, deadlineSeconds: 2, pollSeconds: 0.5}

function pin(rid: string, evictionSeconds: number | null): PinRecord {
  const inWindow = evictionSeconds !== null && evictionSeconds >= 2 && evictionSeconds <= 2.5
  const evictedAt = evictionSeconds === null ? null : T0 + evictionSeconds * 1000
  return {
    rid,
    sentAt: T0,
    evictedAt,
    evictionSeconds,
    bounds: [1.98, 2.52],
    verdict: inWindow ? 'pass' : 'fail',
    evidence: {},
  }
}

/** A night: one stall-kv scenario whose pins were evicted after these seconds. */
function night(i: number, evictions: Array<number | null>, deployment = 'eu1'): SuiteRun {
  const pins = evictions.map((e, k) => pin(`n${i}-${k}`, e))
  const s: ScenarioRun = {
    name: 'stall-kv gpu1',
    kind: 'inject',
    fault: 'stall-kv',
    startedAt: T0 + i * 86_400_000,
    finishedAt: T0 + i * 86_400_000 + 5000,
    verdicts: pins.map(p => ({
      check: 'eviction' as const,
      subject: p.rid,
      verdict: p.verdict,
      summary: '',
      evidence: {},
    })),
    pins,
    leases: [],
    contract,
  }
  return {name: 'nightly', deployment, startedAt: s.startedAt, finishedAt: s.finishedAt, scenarios: [s]}
}

describe('eviction margins', () => {
  it('measures each eviction from the deadline and from deadline + poll; a pin never evicted has none', () => {
    expect(pinMargin(pin('a', 2.1), contract)).toEqual({rid: 'a', evictionSeconds: 2.1, earlyMs: 100, lateMs: 400})
    expect(pinMargin(pin('b', 2.7), contract)?.lateMs).toBe(-200)
    expect(pinMargin(pin('c', null), contract)).toBeUndefined()
  })

  it('gate.minMarginMs fails a run whose eviction came closer than that to a bound, naming pin and bound', () => {
    const run = night(0, [2.1, 2.46])
    expect(evaluateGate(run, GateSchema.parse({})).passed).toBe(true)
    const gate = evaluateGate(run, GateSchema.parse({minMarginMs: 100}))
    expect(gate.passed).toBe(false)
    expect(gate.reasons).toEqual([
      'MARGIN eviction [stall-kv gpu1] n0-1: evicted after 2.46 s, 40 ms from deadline + poll (gate.minMarginMs 100)',
    ])
    expect(evaluateGate(run, GateSchema.parse({minMarginMs: 30})).passed).toBe(true)
  })
})

describe('trendOf', () => {
  it('names a late margin falling night by night, oldest first whatever the order given', () => {
    const runs = Array.from({length: 14}, (_, i) => night(i, [2.09 + i * 0.027, 2.05 + i * 0.027]))
    const t = trendOf([...runs].reverse())
    expect(t.runs.map(r => r.index)).toEqual([...Array(14).keys()])
    expect(t.drifts).toHaveLength(1)
    expect(t.drifts[0]!.text).toBe(
      'stall-kv gpu1: late margin fell from 410 ms to 59 ms over 14 runs' +
        ' (to deadline + poll; smallest in the last run 59 ms)',
    )
    expect(renderTrend(t)).toContain('  stall-kv gpu1 eviction  PPPPPPPPPPPPPP')
  })

  it('names no drift for margins that only scatter within a poll, nor for one that grows', () => {
    const phase = [0.31, 0.02, 0.44, 0.17, 0.29, 0.05, 0.38, 0.12, 0.47, 0.21]
    expect(trendOf(phase.map((p, i) => night(i, [2 + p]))).drifts).toEqual([])
    // Early margin growing = late margin falling: only the falling one is named.
    const t = trendOf(Array.from({length: 6}, (_, i) => night(i, [2.45 - i * 0.08])))
    expect(t.drifts.map(d => d.bound)).toEqual(['early'])
    expect(renderTrend(t)).toMatch(/stall-kv gpu1: early margin fell from 450 ms to 50 ms over 6 runs/)
  })

  it('keeps deployments apart and says which; runs without evictions still count in the verdict grid', () => {
    const runs = [night(0, [2.1], 'eu1'), night(1, [2.1], 'us2'), night(2, [null], 'eu1')]
    const t = trendOf(runs)
    expect(t.deployments).toEqual(['eu1', 'us2'])
    expect(t.checks.map(c => [c.deployment, c.perRun.map(x => (x === null ? null : x.fail))])).toEqual([
      ['eu1', [0, null, 1]],
      ['us2', [null, 0, null]],
    ])
    expect(renderTrend(t)).toContain('eu1 · stall-kv gpu1 eviction  P-F')
  })

  it('fits a line with its slope error; too few points fit nothing', () => {
    const fit = linearFit([
      {x: 0, y: 1},
      {x: 1, y: 3},
      {x: 2, y: 5},
    ])!
    expect(fit.slope).toBeCloseTo(2)
    expect(fit.slopeError).toBeCloseTo(0)
    expect(
      linearFit([
        {x: 0, y: 1},
        {x: 1, y: 2},
      ]),
    ).toBeUndefined()
  })
})

describe('the trend page', () => {
  it('draws two points per eviction inside a y axis fitted to the data and the bound', () => {
    const runs = Array.from({length: 5}, (_, i) => night(i, [2.1 + i * 0.1, 2.2]))
    const t = trendOf(runs)
    const html = renderTrendHtml(t)
    expect(html.match(/<circle class="pt late"/g)).toHaveLength(10)
    expect(html.match(/<circle class="pt early"/g)).toHaveLength(10)
    const {lo, hi} = marginRange(t.margins[0]!)
    // Margins span 0 (late, last night: 2.5 s) .. 500 ms (early): the axis adds 8 % of that each side, no more.
    expect(lo).toBeCloseTo(-40)
    expect(hi).toBeCloseTo(540)
    expect(html).not.toMatch(/<script|<link|<img|src=/i)
  })
})

describe('the single-run timeline', () => {
  it('spans the action (fault window and pins), not the calibration and load around it', () => {
    const run = syntheticRun({failing: false})
    const s = run.scenarios[0]!
    // Stretch the scenario: twenty seconds of calibration before the fault and load after it.
    const stretched: ScenarioRun = {
      ...s,
      startedAt: s.startedAt - 20_000,
      finishedAt: s.finishedAt + 10_000,
      timeline: {
        ...s.timeline!,
        observations: [
          {kind: 'request-sent', t: s.startedAt - 20_000, rid: 'cal', role: 'baseline'},
          ...s.timeline!.observations,
        ],
      },
    }
    const span = timelineSpan(stretched)
    const action = [s.leases[0]!.injectedAt!, s.leases[0]!.revertedAt!, ...s.pins.map(p => p.sentAt)]
    expect(span.from).toBeLessThanOrEqual(Math.min(...action))
    expect(span.to).toBeGreaterThanOrEqual(Math.max(...action))
    expect(span.to - span.from).toBeLessThan(1.3 * (s.pins[0]!.sentAt + 2500 - Math.min(...action)) + 1000)
    expect(span.from).toBeGreaterThan(stretched.startedAt + 15_000)
    // A gauge sampled before the span starts at its left edge with the value it held, not off the plot.
    stretched.timeline!.observations.unshift({
      kind: 'metric',
      t: s.startedAt - 19_000,
      service: 'prefill',
      name: 'sglang:token_usage',
      value: 0.25,
    })
    const html = renderHtml({...run, scenarios: [stretched]})
    expect(html).toMatch(/data-from="\d+" data-to="\d+"/)
    const paths = [...html.matchAll(/<path d="M([\d.]+),/g)].map(m => Number(m[1]))
    expect(paths.length).toBeGreaterThan(0)
    for (const x of paths) expect(x).toBeGreaterThanOrEqual(170)
    expect(html).toContain('sglang:token_usage (min 0.25, max 0.25)')
  })

  it('puts labels that would overlap in separate lanes', () => {
    const items = [
      {x: 100, text: 'restart prefill'},
      {x: 120, text: 'restart decode'},
      {x: 400, text: 'restart router'},
    ]
    expect(labelLanes(items)).toEqual([0, 1, 0])
    const run = syntheticRun({failing: false})
    const html = renderHtml(run)
    const restart = html.slice(html.indexOf('aria-label="timeline of co-restart"'))
    const ys = [...restart.matchAll(/<text x="([\d.]+)" y="([\d.]+)" class="marker">([^<]+)</g)].map(m => ({
      x: Number(m[1]),
      y: Number(m[2]),
      text: m[3]!,
    }))
    expect(ys.map(m => m.text)).toEqual(['restart prefill', 'restart decode', 'restart router'])
    for (let i = 0; i < ys.length; i++) {
      for (let j = i + 1; j < ys.length; j++) {
        const a = ys[i]!
        const b = ys[j]!
        const overlapX = a.x < b.x + b.text.length * 6.2 && b.x < a.x + a.text.length * 6.2
        if (overlapX) expect(a.y).not.toBe(b.y)
      }
    }
  })
})
