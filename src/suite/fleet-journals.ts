import {readFile, stat} from 'node:fs/promises'
import {basename} from 'node:path'

import {z} from 'zod'

import {foldIssues} from '../deployment/yaml-file.js'
import {badInput, PdError} from '../errors.js'
import {type FleetMember, type FleetRun, fleetOf, memberOfFailure, memberOfRun} from '../model/fleet.js'
import type {SuiteRun} from '../model/run.js'

/**
 * Journals back into a fleet: `pdchaos report JOURNAL...` combines the journals of separate runs (a CronJob or a CI
 * job per deployment), and `suite --fleet` reads its own members' journals the same way. A journal is either a run
 * (`pdchaos suite`/`inject --journal`) or, when the run reached no verdict, the error it ended with (exit code, one
 * line, suggestion), so an unreachable deployment is in the combined report with its reason.
 */

/** Journals of very large runs (thousands of pins with their timelines) are tens of MB; more is not a journal. */
export const MAX_JOURNAL_BYTES = 256 * 1024 * 1024

const Num = z.number()
const Stamp = z.number().nullable()
const Verdict = z.looseObject({check: z.string(), subject: z.string(), verdict: z.enum(['pass', 'fail', 'unverified']), summary: z.string(), evidence: z.record(z.string(), z.unknown())})
const Pin = z.looseObject({rid: z.string(), sentAt: Num, evictedAt: Stamp, evictionSeconds: Stamp, bounds: z.tuple([Num, Num]), verdict: z.enum(['pass', 'fail', 'unverified']), evidence: z.record(z.string(), z.unknown())})
const Lease = z.looseObject({id: z.string(), fault: z.string(), mechanism: z.string(), injectedAt: Stamp, revertedAt: Stamp, verifiedInjected: z.boolean(), verifiedClean: z.boolean(), expiresAt: Num})
const Contract = z.looseObject({scope: z.enum(['all', 'inflight', 'off']), deadlineSeconds: Num, pollSeconds: Num})
const Scenario = z.looseObject({
  name: z.string(), kind: z.enum(['inject', 'restart']), startedAt: Num, finishedAt: Num, verdicts: z.array(Verdict), pins: z.array(Pin), leases: z.array(Lease), contract: Contract,
  error: z.string().optional(),
  timeline: z.looseObject({contract: Contract, observations: z.array(z.looseObject({kind: z.string(), t: Num}))}).optional(),
})
const Common = {pdchaos: z.literal(1), command: z.string(), label: z.string().min(1).optional(), config: z.string().optional(), deployment: z.string().optional()}
const RunJournal = z.looseObject({
  ...Common, name: z.string(), deployment: z.string(), startedAt: Num, finishedAt: Num, scenarios: z.array(Scenario),
  gate: z.object({passed: z.boolean(), reasons: z.array(z.string())}).optional(), stopped: z.object({reason: z.string()}).optional(),
})
const FailureJournal = z.looseObject({
  ...Common, name: z.string().optional(), startedAt: Num.optional(), finishedAt: Num.optional(),
  error: z.looseObject({exitCode: z.number().int(), message: z.string(), code: z.string().optional(), suggestions: z.array(z.string()).optional()}),
})

/** One journal as a fleet member: named by its label, else its deployment's name, else the file's name. */
export async function readJournal(file: string, name?: string): Promise<FleetMember> {
  const data = await readJson(file)
  const failure = typeof data === 'object' && data !== null && 'error' in data
  const parsed = failure ? FailureJournal.safeParse(data) : RunJournal.safeParse(data)
  if (!parsed.success) {
    const issues = foldIssues(z.prettifyError(parsed.error))
    throw badInput(`${file} is not a pdchaos journal: ${issues.slice(0, 3).join('; ')}${issues.length > 3 ? ` (and ${issues.length - 3} more)` : ''}`,
      'pass the files written by `pdchaos suite --journal FILE` (or inject --journal)')
  }
  const j = parsed.data
  const label = name ?? j.label ?? j.deployment ?? basename(file).replace(/\.json$/, '')
  const more: Partial<FleetMember> = {journal: file, ...(j.config ? {config: j.config} : {}), ...(j.deployment ? {deployment: j.deployment} : {})}
  if (failure) {
    const f = j as z.infer<typeof FailureJournal>
    const e = f.error
    const times = f.startedAt !== undefined && f.finishedAt !== undefined ? {startedAt: f.startedAt, finishedAt: f.finishedAt} : {}
    return memberOfFailure(label, {exitCode: e.exitCode, reason: e.message, ...(e.code ? {code: e.code} : {}), ...(e.suggestions?.[0] ? {suggestion: e.suggestions[0]} : {})},
      {...more, ...times, ...(f.name ? {suite: f.name} : {})})
  }
  return memberOfRun(label, j as unknown as SuiteRun, more)
}

/** The combined report of separate runs' journals. Two journals with one name are refused: which is current? */
export async function fleetFromJournals(files: string[], o: {name?: string} = {}): Promise<FleetRun> {
  const members: FleetMember[] = []
  for (const f of files) members.push(await readJournal(f))
  const byName = new Map<string, string>()
  for (const m of members) {
    const other = byName.get(m.name)
    if (other !== undefined) {
      throw badInput(`${other} and ${m.journal} are both journals of ${m.name}: a combined report holds one run per deployment`,
        'pass one journal per deployment (the newest), or give each run its own --label')
    }
    byName.set(m.name, m.journal!)
  }
  const times = members.flatMap((m) => [m.startedAt, m.finishedAt].filter((t): t is number => t !== undefined))
  const startedAt = times.length > 0 ? Math.min(...times) : Date.now()
  const finishedAt = times.length > 0 ? Math.max(...times) : startedAt
  return fleetOf({name: o.name ?? 'fleet', startedAt, finishedAt, members})
}

async function readJson(file: string): Promise<unknown> {
  let text: string
  try {
    const s = await stat(file)
    if (s.isDirectory()) throw badInput(`${file} is a directory, not a journal`, `pass the journal files, e.g. ${file.replace(/\/+$/, '')}/*.json`)
    if (s.size > MAX_JOURNAL_BYTES) throw badInput(`${file} is larger than ${MAX_JOURNAL_BYTES / 1024 / 1024} MiB: not a pdchaos journal`, 'pass the files written by `pdchaos suite --journal FILE`')
    text = await readFile(file, 'utf8')
  } catch (error) {
    if (error instanceof PdError) throw error
    const code = (error as NodeJS.ErrnoException).code
    if (code === 'ENOENT') throw badInput(`no journal at ${file}`, 'pass the files written by `pdchaos suite --journal FILE`')
    throw badInput(`cannot read journal ${file}: ${code ?? String(error)}`, 'check the path and its permissions')
  }
  try {
    return JSON.parse(text)
  } catch (error) {
    throw badInput(`${file} is not JSON (${(error as Error).message}): a journal cut short, or not a journal`, 'pass the files written by `pdchaos suite --journal FILE`')
  }
}
