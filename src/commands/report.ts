import {resolve} from 'node:path'

import {BaseCommand} from '../cli/base-command.js'
import {checkFleetOutputs, finishFleet} from '../cli/fleet-outputs.js'
import {badInput} from '../errors.js'
import {fleetRunId} from '../model/fleet.js'
import {reportArgs, reportFlags, reportTrend} from '../cli/report-run.js'
import {fleetFromJournals} from '../suite/fleet-journals.js'

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
  static override args = reportArgs
  static override flags = reportFlags

  async run(): Promise<Record<string, unknown>> {
    const journals = this.positionals
    if (journals.length === 0)
      throw badInput(
        'no journal given',
        'pass the journal files, e.g. `pdchaos report /var/lib/pdchaos/nightly/*.json`',
      )
    if (this.flags.trend) return reportTrend(journals, this.flags, {json: this.jsonEnabled(), log: t => this.log(t)})
    checkFleetOutputs(this.flags)
    const fleet = await fleetFromJournals(
      journals.map(j => resolve(j)),
      {name: this.flags.name},
    )
    const runId = this.flags['run-id'] ?? fleetRunId(fleet.startedAt)
    return finishFleet(fleet, {json: this.jsonEnabled(), log: t => this.log(t), files: this.flags, runId})
  }
}
