import {BOUND_TEXT, MARGIN_BOUNDS, type EvictionMargin, type MarginBound, scenarioMargins} from './margins.js'
import {runIdOf, runPassed, type SuiteRun} from './run.js'
import type {Outcome} from './verdict.js'

/**
 * Trends across runs (`pdchaos report --trend`): many runs' journals, oldest first, as per scenario and check the
 * verdicts of each run, and per scenario every eviction's margin to each bound with the drift of the smallest margin
 * per run. Pure: the command reads the journals, the reports render this.
 */

export interface TrendRun {
  index: number
  runId: string
  startedAt: number
  deployment: string
  passed: boolean
  /** The journal it came from. */
  source?: string
}

/** One scenario's (and deployment's) verdicts of one check, run by run; null where that run did not judge it. */
export interface CheckTrend {
  deployment: string
  scenario: string
  check: string
  perRun: Array<{pass: number; fail: number; unverified: number} | null>
}

/** One run's evictions in a scenario with their margins (ms). */
export interface MarginRun {
  run: number
  margins: EvictionMargin[]
  /** The contract they were measured against, seconds. */
  deadlineSeconds: number
  pollSeconds: number
}

export interface MarginTrend {
  deployment: string
  scenario: string
  runs: MarginRun[]
}

/** A margin that moved towards its bound across the runs, by more than the drift threshold and more than the noise. */
export interface Drift {
  deployment: string
  scenario: string
  bound: MarginBound
  /** The least-squares line through each run's smallest margin, at the first and the last run that had one. */
  fromMs: number
  toMs: number
  /** The smallest margin of the last run. */
  lastMs: number
  runs: number
  /** Two standard errors of the fitted change: a change within it is noise (the poll tick's phase, load). */
  noiseMs: number
  text: string
}

export interface Trend {
  runs: TrendRun[]
  /** More than one deployment: scenario names are then given with their deployment. */
  deployments: string[]
  checks: CheckTrend[]
  margins: MarginTrend[]
  drifts: Drift[]
  /** The smallest margin to either bound in the newest run that has evictions, per scenario. */
  latest: Array<{deployment: string; scenario: string; run: number; earlyMs: number; lateMs: number}>
  driftMs: number
}

export interface TrendOptions {
  /** The smallest change of a margin (ms) named as drift. Default 100. */
  driftMs?: number
  /** Where each run came from (journal files), by index. */
  sources?: string[]
}

export const DEFAULT_DRIFT_MS = 100

export function trendOf(input: SuiteRun[], o: TrendOptions = {}): Trend {
  const driftMs = o.driftMs ?? DEFAULT_DRIFT_MS
  const order = input.map((run, i) => ({run, source: o.sources?.[i]})).sort((a, b) => a.run.startedAt - b.run.startedAt)
  const runs: TrendRun[] = order.map(({run, source}, index) => ({
    index,
    runId: runIdOf(run),
    startedAt: run.startedAt,
    deployment: run.deployment,
    passed: runPassed(run),
    ...(source ? {source} : {}),
  }))
  const deployments = [...new Set(runs.map(r => r.deployment))]
  const checks = new Map<string, CheckTrend>()
  const margins = new Map<string, MarginTrend>()
  order.forEach(({run}, index) => {
    for (const s of run.scenarios) {
      const key = `${run.deployment}\u0000${s.name}`
      for (const v of s.verdicts) {
        const ck = `${key}\u0000${v.check}`
        let c = checks.get(ck)
        if (!c) {
          c = {deployment: run.deployment, scenario: s.name, check: v.check, perRun: runs.map(() => null)}
          checks.set(ck, c)
        }
        const cell = (c.perRun[index] ??= {pass: 0, fail: 0, unverified: 0})
        cell[v.verdict as Outcome]++
      }
      const ms = scenarioMargins(s)
      if (ms.length === 0) continue
      let m = margins.get(key)
      if (!m) margins.set(key, (m = {deployment: run.deployment, scenario: s.name, runs: []}))
      const same = m.runs.find(r => r.run === index)
      if (same) same.margins.push(...ms)
      else {
        const {deadlineSeconds, pollSeconds} = s.contract
        m.runs.push({run: index, margins: ms, deadlineSeconds, pollSeconds})
      }
    }
  })
  const named = (d: string, s: string) => (deployments.length > 1 ? `${d} · ${s}` : s)
  const drifts: Drift[] = []
  const latest: Trend['latest'] = []
  for (const m of margins.values()) {
    const last = m.runs.at(-1)!
    latest.push({deployment: m.deployment, scenario: m.scenario, run: last.run, ...smallest(last)})
    for (const bound of MARGIN_BOUNDS) {
      const pts = m.runs.map(r => ({x: r.run, y: smallest(r)[bound === 'early' ? 'earlyMs' : 'lateMs']}))
      const fit = linearFit(pts)
      if (!fit) continue
      const x0 = pts[0]!.x
      const x1 = pts.at(-1)!.x
      const fromMs = fit.at(x0)
      const toMs = fit.at(x1)
      const change = toMs - fromMs
      const noiseMs = 2 * fit.slopeError * (x1 - x0)
      // Only a margin that shrinks is drift towards a bound (the other margin then grows: they sum to the poll).
      if (change < 0 && -change >= driftMs && -change > noiseMs) {
        const lastMs = pts.at(-1)!.y
        const text =
          `${named(m.deployment, m.scenario)}: ${bound} margin fell from ${ms(fromMs)} to ${ms(toMs)}` +
          ` over ${pts.length} runs` +
          ` (to ${BOUND_TEXT[bound]}; smallest in the last run ${ms(lastMs)}${lastMs < 0 ? ', past the bound' : ''})`
        drifts.push({
          deployment: m.deployment,
          scenario: m.scenario,
          bound,
          fromMs: round(fromMs),
          toMs: round(toMs),
          lastMs,
          runs: pts.length,
          noiseMs: round(noiseMs),
          text,
        })
      }
    }
  }
  return {runs, deployments, checks: [...checks.values()], margins: [...margins.values()], drifts, latest, driftMs}
}

/** The smallest margin to each bound among one run's evictions. */
export function smallest(r: MarginRun): {earlyMs: number; lateMs: number} {
  return {earlyMs: Math.min(...r.margins.map(m => m.earlyMs)), lateMs: Math.min(...r.margins.map(m => m.lateMs))}
}

/** Least squares y = a + b x, with the standard error of b; undefined below three points or without spread in x. */
export function linearFit(
  pts: Array<{x: number; y: number}>,
): {at: (x: number) => number; slope: number; slopeError: number} | undefined {
  const n = pts.length
  if (n < 3) return undefined
  const mx = pts.reduce((s, p) => s + p.x, 0) / n
  const my = pts.reduce((s, p) => s + p.y, 0) / n
  const sxx = pts.reduce((s, p) => s + (p.x - mx) ** 2, 0)
  if (sxx === 0) return undefined
  const slope = pts.reduce((s, p) => s + (p.x - mx) * (p.y - my), 0) / sxx
  const a = my - slope * mx
  const sse = pts.reduce((s, p) => s + (p.y - (a + slope * p.x)) ** 2, 0)
  return {at: x => a + slope * x, slope, slopeError: Math.sqrt(sse / (n - 2) / sxx)}
}

/** One run's verdicts of a check as a letter: F any failed, U any unverified, P all passed, - not judged. */
export function verdictLetter(cell: CheckTrend['perRun'][number]): string {
  if (!cell) return '-'
  return cell.fail > 0 ? 'F' : cell.unverified > 0 ? 'U' : 'P'
}

const round = (n: number) => Math.round(n)
const ms = (n: number) => `${Math.round(n)} ms`
