import type {Verdict} from '../model/verdict.js'

/** Verdicts for a person: failures first, each with its one-line summary; a closing count. */
export function renderVerdicts(verdicts: Verdict[]): string {
  const failed = verdicts.filter((v) => v.verdict === 'fail')
  const passed = verdicts.filter((v) => v.verdict === 'pass')
  const line = (v: Verdict) => `  ${v.verdict === 'pass' ? 'PASS' : 'FAIL'}  ${v.check.padEnd(11)} ${v.subject}: ${v.summary}`
  return [...failed.map(line), ...passed.map(line), '', `${passed.length} passed, ${failed.length} failed`].join('\n')
}
