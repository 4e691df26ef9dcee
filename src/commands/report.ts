import {resolve} from 'node:path'

import {Args, Flags} from '@oclif/core'

import {BaseCommand} from '../cli/base-command.js'
import {checkFleetOutputs, finishFleet} from '../cli/fleet-outputs.js'
import {badInput} from '../errors.js'
import {fleetRunId} from '../model/fleet.js'
import {checkOutputFile, outputWriter} from '../cli/outputs.js'
import {DEFAULT_DRIFT_MS} from '../model/trend.js'
import {renderTrendHtml} from '../report/trend-html.js'
import {renderTrend, trendJson} from '../report/trend-text.js'
import {fleetFromJournals} from '../suite/fleet-journals.js'
import {trendFromJournals} from '../suite/trend-journals.js'

export default class Report extends BaseCommand<typeof Report> {
  static override summary =
    'Combine the journals of separate runs (one per deployment) into one report: summary, JUnit, HTML, Pushgateway ' +
    'push and exit code; with --trend, many runs over time into trends.'
  static override description = [
    'Each JOURNAL is a file written by `pdchaos suite --journal FILE` (or inject, or `suite --fleet --journal-dir ' +
      'DIR`), e.g. by a CronJob or a CI job per deployment.',
    'A run that reached no verdict (an unreachable deployment) writes its error as its journal and is reported ' +
      'with its reason.',
    "Each deployment is named by its --label, else by its deployment file's name; two journals of one name are " +
      'refused.',
    'Exit code: the worst across deployments, 4 cleanup unverified > 3 stopped > 1 a check failed > 5 unreachable ' +
      '> 2 refused > 0 all passed.',
    'With --trend, the JOURNALs (files, or directories of them) are many runs over time: per scenario and check the' +
      " verdicts run by run, every eviction's margin to the deadline and to deadline + poll, and the drift of those" +
      ' margins named in words (exit 0; 2 on bad input).',
  ].join(' ')
  static override examples = [
    '<%= config.bin %> report /var/lib/pdchaos/nightly/*.json',
    '<%= config.bin %> report eu1.json us2.json --junit junit.xml --html fleet.html --push http://127.0.0.1:9091',
    '<%= config.bin %> report --trend /var/lib/pdchaos/nightly --html trend.html',
  ]
  static override strict = false
  static override args = {
    journals: Args.string({
      description:
        'Journal files (JSON), one per deployment (any number); with --trend, journals' +
        ' of many runs or directories of them.',
    }),
  }
  static override flags = {
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

  async run(): Promise<Record<string, unknown>> {
    const journals = this.positionals
    if (journals.length === 0)
      throw badInput(
        'no journal given',
        'pass the journal files, e.g. `pdchaos report /var/lib/pdchaos/nightly/*.json`',
      )
    if (this.flags.trend) return this.trend(journals)
    checkFleetOutputs(this.flags)
    const fleet = await fleetFromJournals(
      journals.map(j => resolve(j)),
      {name: this.flags.name},
    )
    const runId = this.flags['run-id'] ?? fleetRunId(fleet.startedAt)
    return finishFleet(fleet, {json: this.jsonEnabled(), log: t => this.log(t), files: this.flags, runId})
  }

  private async trend(paths: string[]): Promise<Record<string, unknown>> {
    const f = this.flags
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
    if (!this.jsonEnabled()) {
      this.log(renderTrend(trend))
      for (const s of skipped) process.stderr.write(`skipped ${s}\n`)
    }
    const {errors, attempt, write} = outputWriter()
    const title = f.name === 'fleet' ? 'trend' : f.name
    if (f.html) await attempt(`the trend page to ${f.html}`, () => write(f.html!, renderTrendHtml(trend, title)))
    return {...trendJson(trend), ...(skipped.length ? {skipped} : {}), ...(errors.length ? {outputErrors: errors} : {})}
  }
}
