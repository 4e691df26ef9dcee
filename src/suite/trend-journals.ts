import {readdir, stat} from 'node:fs/promises'
import {join} from 'node:path'

import {badInput} from '../errors.js'
import type {SuiteRun} from '../model/run.js'
import {type Trend, trendOf, type TrendOptions} from '../model/trend.js'
import {readJournal} from './fleet-journals.js'

/**
 * Journals of many runs (a directory of nightly journals, or the files) for `pdchaos report --trend`. A directory
 * stands for the *.json files directly in it. A journal of a run that reached no verdict (its error) has nothing to
 * trend: it is listed as skipped, with its reason.
 */
export async function trendFromJournals(
  paths: string[],
  o: Omit<TrendOptions, 'sources'> = {},
): Promise<{trend: Trend; skipped: string[]}> {
  const files: string[] = []
  for (const p of paths) {
    let isDir = false
    try {
      isDir = (await stat(p)).isDirectory()
    } catch {
      /* readJournal names a missing file */
    }
    if (!isDir) {
      files.push(p)
      continue
    }
    const inDir = (await readdir(p))
      .filter(f => f.endsWith('.json'))
      .sort()
      .map(f => join(p, f))
    if (inDir.length === 0) {
      throw badInput(
        `${p} holds no journal (*.json)`,
        'pass the directory the nightly runs write their --journal files to',
      )
    }
    files.push(...inDir)
  }
  const runs: SuiteRun[] = []
  const sources: string[] = []
  const skipped: string[] = []
  for (const f of files) {
    const m = await readJournal(f)
    if (m.run) {
      runs.push(m.run)
      sources.push(f)
    } else {
      skipped.push(`${f}: no verdict (${m.reason ?? m.status})`)
    }
  }
  if (runs.length === 0) {
    throw badInput(
      'none of these journals holds a run with verdicts',
      'pass the journals of runs that reached their checks',
    )
  }
  return {trend: trendOf(runs, {...o, sources}), skipped}
}
