import {basename} from 'node:path'

import type {z} from 'zod'

import {badInput} from '../errors.js'
import {type FleetMember, type FleetRun, fleetOf, memberOfFailure, memberOfRun} from '../model/fleet.js'
import type {SuiteRun} from '../model/run.js'
import {checkJournal, type FailureJournal, issuesLine} from '../report/journal-schema.js'
import {readInputText} from '../util/safe-file.js'

/**
 * Journals back into a fleet: `pdchaos report JOURNAL...` combines the journals of separate runs (a CronJob or a CI
 * job per deployment), and `suite --fleet` reads its own members' journals the same way. A journal is either a run
 * (`pdchaos suite`/`inject --journal`) or, when the run reached no verdict, the error it ended with (exit code, one
 * line, suggestion), so an unreachable deployment is in the combined report with its reason.
 */

/** Journals of very large runs (thousands of pins with their timelines) are tens of MB; more is not a journal. */
export const MAX_JOURNAL_BYTES = 256 * 1024 * 1024

/** One journal as a fleet member: named by its label, else its deployment's name, else the file's name. */
export async function readJournal(file: string, name?: string): Promise<FleetMember> {
  const data = readJson(file)
  const checked = checkJournal(data)
  if (!checked.ok) {
    throw badInput(
      `${file} is not a pdchaos journal: ${issuesLine(checked.issues)}`,
      'pass the files written by `pdchaos suite --journal FILE` (or inject --journal)',
    )
  }
  const {failure, journal: j} = checked.value
  const label = name ?? j.label ?? j.deployment ?? basename(file).replace(/\.json$/, '')
  const more: Partial<FleetMember> = {
    journal: file,
    ...(j.config ? {config: j.config} : {}),
    ...(j.deployment ? {deployment: j.deployment} : {}),
  }
  if (failure) {
    const f = j as z.infer<typeof FailureJournal>
    const e = f.error
    const times =
      f.startedAt !== undefined && f.finishedAt !== undefined ? {startedAt: f.startedAt, finishedAt: f.finishedAt} : {}
    return memberOfFailure(
      label,
      {
        exitCode: e.exitCode,
        reason: e.message,
        ...(e.code ? {code: e.code} : {}),
        ...(e.suggestions?.[0] ? {suggestion: e.suggestions[0]} : {}),
      },
      {...more, ...times, ...(f.name ? {suite: f.name} : {})},
    )
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
      throw badInput(
        `${other} and ${m.journal} are both journals of ${m.name}: a combined report holds one run per deployment`,
        'pass one journal per deployment (the newest), or give each run its own --label',
      )
    }
    byName.set(m.name, m.journal!)
  }
  const times = members.flatMap(m => [m.startedAt, m.finishedAt].filter((t): t is number => t !== undefined))
  const startedAt = times.length > 0 ? Math.min(...times) : Date.now()
  const finishedAt = times.length > 0 ? Math.max(...times) : startedAt
  return fleetOf({name: o.name ?? 'fleet', startedAt, finishedAt, members})
}

function readJson(file: string): unknown {
  const text = readInputText(file, {
    what: 'journal',
    maxBytes: MAX_JOURNAL_BYTES,
    missing: {message: `no journal at ${file}`, suggestion: HINT},
    notAFile: HINT,
  })!
  try {
    return JSON.parse(text)
  } catch (error) {
    throw badInput(`${file} is not JSON (${(error as Error).message}): a journal cut short, or not a journal`, HINT)
  }
}

const HINT = 'pass the files written by `pdchaos suite --journal FILE`'
