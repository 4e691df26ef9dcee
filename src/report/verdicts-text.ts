import type {Verdict} from '../model/verdict.js'

/** How a person reads an outcome, in one column. */
export const OUTCOME_MARK = {pass: 'PASS', fail: 'FAIL', unverified: 'UNVR'} as const

/**
 * Verdicts for a person: failures first, then the unverified with why, each with its one-line summary; a closing count.
 */
export function renderVerdicts(verdicts: Verdict[]): string {
  const of = (o: Verdict['verdict']) => verdicts.filter(v => v.verdict === o)
  const [failed, unverified, passed] = [of('fail'), of('unverified'), of('pass')]
  const line = (v: Verdict) =>
    `  ${OUTCOME_MARK[v.verdict]}  ${v.check.padEnd(11)} ${v.subject}: ${v.summary}` +
    (v.verdict === 'unverified'
      ? ` (unverified: ${String(v.evidence.why)}; to verify: ${String(v.evidence.toVerify)})`
      : '')
  return [
    ...failed.map(line),
    ...unverified.map(line),
    ...passed.map(line),
    '',
    `${passed.length} passed, ${failed.length} failed${unverified.length ? `, ${unverified.length} unverified` : ''}`,
  ].join('\n')
}
