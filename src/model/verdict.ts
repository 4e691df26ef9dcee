/** A check's judgement of one subject (a pin, a recovery, the collateral load), always with the evidence behind it. */
export interface Verdict {
  check: 'eviction' | 'abort' | 'scope' | 'recovery' | 'collateral' | 'fault-effect' | 'cleanup' | 'restart'
  /** What was judged: a rid, a lease id, or a service. */
  subject: string
  verdict: 'pass' | 'fail'
  /** One line a person reads first. */
  summary: string
  evidence: Record<string, unknown>
}

export const pass = (check: Verdict['check'], subject: string, summary: string, evidence: Record<string, unknown>): Verdict => ({check, subject, verdict: 'pass', summary, evidence})
export const fail = (check: Verdict['check'], subject: string, summary: string, evidence: Record<string, unknown>): Verdict => ({check, subject, verdict: 'fail', summary, evidence})
