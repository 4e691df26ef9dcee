import type {AbortCoverage, AbortRecord} from '../model/run.js'
import {PATH_NAMES} from '../checks/abort-path.js'
import {OUTCOME_MARK} from './verdicts-text.js'

/**
 * Abort trials for people: whether they covered the transfer window (one line, in every report) and each trial's
 * landing and release (the inject report). A coverage that is not verified says so next to its count.
 */

/** "aborts in window: 5/6, filter matched 312 packets" (and, when too few landed, that no abort could pass). */
export function coverageShort(c: AbortCoverage): string {
  const held = c.filterMatchedPackets === null ? '' : `, filter matched ${c.filterMatchedPackets} packets`
  return `aborts in window: ${c.inWindow}/${c.trials}${held}${
    c.verified ? '' : ` (at least ${c.required} needed: ` + `aborts unverified)`
  }`
}

/** The whole coverage: the count, the filter, the offsets against the window, and for an unverified one why and how. */
export function coverageLines(c: AbortCoverage): string[] {
  const lines = [`${c.verified ? 'PASS' : OUTCOME_MARK.unverified} ${c.summary}`]
  if (!c.verified)
    lines.push(
      `     unverified: ${c.why ?? 'too few aborts landed in the window'}`,
      `     to verify: ${c.toVerify ?? 'run more trials'}`,
    )
  return lines
}

export function abortTrialLines(aborts: AbortRecord[]): string[] {
  return aborts.map(a => {
    const planned = a.plannedOffsetMs === null ? '' : ` (planned ${a.plannedOffsetMs.toFixed(1)})`
    const after = a.releasedAt === null ? 0 : (a.releasedAt - a.abortedAt) / 1000
    const released =
      a.releasedAt === null
        ? 'never released'
        : `released ${Math.abs(after).toFixed(3)}s ${after < 0 ? 'before' : 'after'} ` +
          `it${a.releaseStatus === null ? '' : ` (${a.releaseStatus}, from ${a.releasedFrom})`}`
    const landing = a.inWindow ? 'in window' : `not in window: ${a.notInWindow ?? '?'}`
    const sides = a.sides ? ` on ${a.sides.join('+')}` : ''
    const by = a.releasedBy ? `  released by: ${PATH_NAMES[a.releasedBy.path]}` : ''
    const honour = `honour by ${a.bounds.honourBySeconds.toFixed(3)}s`
    return (
      `  ${OUTCOME_MARK[a.verdict]} ${a.rid}  abort${sides} at ${a.offsetMs.toFixed(1)} ` +
      `ms${planned}  ${released}  ${honour}  ${landing}${by}`
    )
  })
}
