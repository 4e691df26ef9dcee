import {z} from 'zod'

import {foldIssues} from '../deployment/yaml-file.js'

/**
 * The journal's shape, one schema for both directions: writeJournal checks a run's (or a failure's) journal against
 * it before the file is written, and `pdchaos report` (and `suite --fleet`) checks what it reads back, so a journal
 * pdchaos writes is one it can read, and a hand-edited one is refused naming the file and the field (exit 2) instead
 * of failing later in a renderer ("Invalid time value" from a time out of range).
 */

/** Epoch ms a Date can hold (ECMA-262: ±8.64e15), and not before 1970: every time pdchaos writes is a clock reading. */
const Time = z.number().finite().min(0).max(8.64e15)
const Stamp = Time.nullable()
const Num = z.number().finite()
const Verdict = z.looseObject({
  check: z.string(),
  subject: z.string(),
  verdict: z.enum(['pass', 'fail', 'unverified']),
  summary: z.string(),
  evidence: z.record(z.string(), z.unknown()),
})
const Pin = z.looseObject({
  rid: z.string(),
  sentAt: Time,
  evictedAt: Stamp,
  evictionSeconds: Num.nullable(),
  bounds: z.tuple([Num, Num]),
  verdict: z.enum(['pass', 'fail', 'unverified']),
  evidence: z.record(z.string(), z.unknown()),
})
const Lease = z.looseObject({
  id: z.string(),
  fault: z.string(),
  mechanism: z.string(),
  injectedAt: Stamp,
  revertedAt: Stamp,
  verifiedInjected: z.boolean(),
  verifiedClean: z.boolean(),
  expiresAt: Time,
})
const Contract = z.looseObject({scope: z.enum(['all', 'inflight', 'off']), deadlineSeconds: Num, pollSeconds: Num})
const Scenario = z.looseObject({
  name: z.string(),
  kind: z.enum(['inject', 'restart']),
  startedAt: Time,
  finishedAt: Time,
  verdicts: z.array(Verdict),
  pins: z.array(Pin),
  leases: z.array(Lease),
  contract: Contract,
  error: z.string().optional(),
  status: z.enum(['halted']).optional(),
  timeline: z
    .looseObject({contract: Contract, observations: z.array(z.looseObject({kind: z.string(), t: Time}))})
    .optional(),
})
const Common = {
  pdchaos: z.literal(1),
  command: z.string(),
  label: z.string().min(1).optional(),
  config: z.string().optional(),
  deployment: z.string().optional(),
}

/** A run's journal (`suite --journal`, `inject --journal`). */
export const RunJournal = z.looseObject({
  ...Common,
  name: z.string(),
  deployment: z.string(),
  startedAt: Time,
  finishedAt: Time,
  scenarios: z.array(Scenario),
  gate: z.object({passed: z.boolean(), reasons: z.array(z.string())}).optional(),
  stopped: z
    .object({
      reason: z.string(),
      halt: z.object({by: z.string(), at: Num, reason: z.string(), host: z.string().optional()}).optional(),
    })
    .optional(),
})

/** The journal of a run that reached no verdict: the error it ended with. */
export const FailureJournal = z.looseObject({
  ...Common,
  name: z.string().optional(),
  startedAt: Time.optional(),
  finishedAt: Time.optional(),
  error: z.looseObject({
    exitCode: z.number().int(),
    message: z.string(),
    code: z.string().optional(),
    suggestions: z.array(z.string()).optional(),
  }),
})

export type Journal =
  | {failure: true; journal: z.infer<typeof FailureJournal>}
  | {failure: false; journal: z.infer<typeof RunJournal>}

/** A failure journal's error is an object; an inject journal's top-level `error` is its scenario's error text. */
export function isFailureJournal(data: unknown): boolean {
  const e = typeof data === 'object' && data !== null ? (data as {error?: unknown}).error : undefined
  return typeof e === 'object' && e !== null
}

/** The journal, or its problems ("scenarios.0.startedAt: Too big: …"), at most `most` of them. */
export function checkJournal(data: unknown): {ok: true; value: Journal} | {ok: false; issues: string[]} {
  const failure = isFailureJournal(data)
  const parsed = failure ? FailureJournal.safeParse(data) : RunJournal.safeParse(data)
  if (parsed.success) return {ok: true, value: {failure, journal: parsed.data} as Journal}
  return {ok: false, issues: foldIssues(z.prettifyError(parsed.error))}
}

/** Issues as one line: the first three, then how many more. */
export function issuesLine(issues: string[]): string {
  return `${issues.slice(0, 3).join('; ')}${issues.length > 3 ? ` (and ${issues.length - 3} more)` : ''}`
}
