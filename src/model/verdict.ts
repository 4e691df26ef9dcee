/**
 * A check's judgement of one subject (a pin, a recovery, the collateral load), always with the evidence behind it.
 * Three outcomes: pass, fail, and unverified — the check lacked its data (a missing counter, stale gauges, no
 * coverage, a release by something other than what it judges); its evidence then says why and what would make it
 * verifiable. A verdict that could be wrong on a real host is worse than an honest "unverified".
 */
export type Outcome = 'pass' | 'fail' | 'unverified'

export const CHECKS = [
  'eviction',
  'abort',
  'scope',
  'recovery',
  'collateral',
  'fault-effect',
  'cleanup',
  'restart',
  'breaker',
  'decode-release',
  'kv-lease',
  'kv-pinned',
] as const
export type CheckName = (typeof CHECKS)[number]

export interface Verdict {
  check: CheckName
  /** What was judged: a rid, a lease id, or a service. */
  subject: string
  verdict: Outcome
  /** One line a person reads first. */
  summary: string
  evidence: Record<string, unknown>
}

export const pass = (
  check: Verdict['check'],
  subject: string,
  summary: string,
  evidence: Record<string, unknown>,
): Verdict => ({check, subject, verdict: 'pass', summary, evidence})
export const fail = (
  check: Verdict['check'],
  subject: string,
  summary: string,
  evidence: Record<string, unknown>,
): Verdict => ({check, subject, verdict: 'fail', summary, evidence})
/** Neither pass nor fail: `why` the check lacks its data, and what would make it verifiable. */
export const unverified = (
  check: Verdict['check'],
  subject: string,
  summary: string,
  evidence: Record<string, unknown> & {why: string; toVerify: string},
): Verdict => ({check, subject, verdict: 'unverified', summary, evidence})

/** Checks whose unverified verdicts block a run (and a release gate) unless told otherwise: the watchdog's own. */
export const UNVERIFIED_BLOCKS_BY_DEFAULT: readonly CheckName[] = ['eviction', 'kv-lease']
