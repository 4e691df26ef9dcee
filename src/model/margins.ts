import type {Contract, PinRecord, ScenarioRun} from './run.js'

/**
 * How far an eviction landed from each bound of the watchdog contract, in ms: `early` from the deadline (negative:
 * evicted before it, a false timeout), `late` from deadline + poll (negative: evicted after it). A watchdog drifting
 * late shows as a late margin shrinking run after run, long before a pin fails. The bounds are the contract's own,
 * without the ε a verdict allows, so the margins of two runs with different calibrations compare.
 */
export interface EvictionMargin {
  rid: string
  evictionSeconds: number
  earlyMs: number
  lateMs: number
}

export const MARGIN_BOUNDS = ['early', 'late'] as const
export type MarginBound = (typeof MARGIN_BOUNDS)[number]

/** What each bound is, as people read it. */
export const BOUND_TEXT: Record<MarginBound, string> = {early: 'deadline', late: 'deadline + poll'}

/** The margins of one pin evicted under `contract`; undefined for a pin never evicted (no eviction to measure). */
export function pinMargin(
  p: Pick<PinRecord, 'rid' | 'evictionSeconds'>,
  contract: Contract,
): EvictionMargin | undefined {
  if (p.evictionSeconds === null || !Number.isFinite(p.evictionSeconds)) return undefined
  const ms = p.evictionSeconds * 1000
  const deadline = contract.deadlineSeconds * 1000
  const late = deadline + contract.pollSeconds * 1000
  return {rid: p.rid, evictionSeconds: p.evictionSeconds, earlyMs: round(ms - deadline), lateMs: round(late - ms)}
}

/** Every evicted pin's margins in a scenario, in pin order. */
export function scenarioMargins(s: Pick<ScenarioRun, 'pins' | 'contract'>): EvictionMargin[] {
  return s.pins.map(p => pinMargin(p, s.contract)).filter((m): m is EvictionMargin => m !== undefined)
}

/** The smallest margin to each bound across margins (undefined without any). */
export function smallestMargins(ms: EvictionMargin[]): {earlyMs: number; lateMs: number} | undefined {
  if (ms.length === 0) return undefined
  return {earlyMs: Math.min(...ms.map(m => m.earlyMs)), lateMs: Math.min(...ms.map(m => m.lateMs))}
}

const round = (n: number) => Math.round(n * 10) / 10
