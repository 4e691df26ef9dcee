import {resolve} from 'node:path'

import {Args, Flags} from '@oclif/core'

import {badInput} from '../errors.js'
import {DEFAULT_DRIFT_MS} from '../model/trend.js'
import {renderTrendHtml} from '../report/trend-html.js'
import {renderTrend, trendJson} from '../report/trend-text.js'
import {trendFromJournals} from '../suite/trend-journals.js'
import {checkOutputFile, outputWriter} from './outputs.js'

/** `pdchaos report`'s arguments and flags, and its --trend run (commands/report.ts holds its help). */

export const reportArgs = {
  journals: Args.string({
    description:
      'Journal files (JSON), one per deployment (any number); with --trend, journals' +
      ' of many runs or directories of them.',
  }),
}

export const reportFlags = {
  name: Flags.string({summary: 'Name of the combined report.', default: 'fleet'}),
  junit: Flags.string({summary: 'Write JUnit XML (one testsuite per deployment) to this file.'}),
  html: Flags.string({
    summary:
      "Write the single-file HTML report (an index, then each deployment's report; with" +
      ' --trend, the trend page) to this file.',
  }),
  push: Flags.string({
    summary: "Push every deployment's metrics, labelled deployment=NAME, to this Pushgateway URL.",
  }),
  'run-id': Flags.string({
    summary: "The Pushgateway grouping of the push. Default: derived from the earliest run's start.",
  }),
  trend: Flags.boolean({
    summary:
      'The journals are many runs over time (files or directories): verdicts run by run,' +
      ' eviction margins and their drift.',
  }),
  'drift-ms': Flags.integer({
    min: 1,
    max: 3_600_000,
    dependsOn: ['trend'],
    summary: `With --trend: the smallest fall of a margin named as drift, ms (default ${DEFAULT_DRIFT_MS}).`,
  }),
}

/** The flags --trend reads. */
export interface TrendFlags {
  name: string
  junit?: string
  push?: string
  'run-id'?: string
  html?: string
  'drift-ms'?: number
}

/** --trend: many runs over time, read from journals (files or directories), as text and, with --html, a page. */
export async function reportTrend(
  paths: string[],
  f: TrendFlags,
  o: {json: boolean; log: (text: string) => void},
): Promise<Record<string, unknown>> {
  for (const flag of ['junit', 'push', 'run-id'] as const) {
    if (f[flag] !== undefined) {
      throw badInput(
        `--${flag} does not apply to --trend`,
        'drop it: a trend writes its summary and, with --html, its page',
      )
    }
  }
  if (f.html !== undefined) checkOutputFile('--html', f.html)
  const drift = f['drift-ms'] === undefined ? {} : {driftMs: f['drift-ms']}
  const {trend, skipped} = await trendFromJournals(
    paths.map(p => resolve(p)),
    drift,
  )
  if (!o.json) {
    o.log(renderTrend(trend))
    for (const s of skipped) process.stderr.write(`skipped ${s}\n`)
  }
  const {errors, attempt, write} = outputWriter()
  const title = f.name === 'fleet' ? 'trend' : f.name
  if (f.html) await attempt(`the trend page to ${f.html}`, () => write(f.html!, renderTrendHtml(trend, title)))
  return {...trendJson(trend), ...(skipped.length ? {skipped} : {}), ...(errors.length ? {outputErrors: errors} : {})}
}
