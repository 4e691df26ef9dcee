import {existsSync, mkdtempSync, rmSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {afterAll, describe, expect, it} from 'vitest'

import type {Config} from '@oclif/core'

import {errorDocument} from '../../src/cli/error-output.js'
import {TargetCommand} from '../../src/cli/target-command.js'
import {PdError, unreachable} from '../../src/errors.js'
import type {FleetRun} from '../../src/model/fleet.js'
import type {SuiteRun} from '../../src/model/run.js'
import {renderFleetHtml} from '../../src/report/fleet-html.js'
import {renderFleetJUnit} from '../../src/report/fleet-junit.js'
import {fleetJson, renderFleet} from '../../src/report/fleet-text.js'
import {writeJournal} from '../../src/report/journal.js'
import {failureJournal, runJournal} from '../../src/report/journal-fields.js'
import {fleetRegistry} from '../../src/report/push.js'
import {fleetFromJournals, readJournal} from '../../src/suite/fleet-journals.js'
import {NASTY, syntheticRun, T0} from './synthetic-run.js'

/**
 * The combined report of separate runs: journals written as `pdchaos suite --journal` writes them (a run, or the error
 * of a run that reached no verdict), read back by `pdchaos report`, rendered as text, JSON, JUnit, HTML and metrics.
 */

const dir = mkdtempSync(join(tmpdir(), 'pdchaos-fleet-report-'))
afterAll(() => rmSync(dir, {recursive: true, force: true}))

function runOf(deployment: string, failing: boolean, shift = 0): SuiteRun {
  const r = syntheticRun({failing})
  return {
    ...r,
    deployment,
    target: `ssh root@${deployment}.example:22`,
    startedAt: r.startedAt + shift,
    finishedAt: r.finishedAt + shift,
  }
}

/** A journal as `suite --journal` writes one. */
function journal(name: string, run: SuiteRun, extra: Record<string, unknown> = {}): string {
  const file = join(dir, `${name}.json`)
  writeJournal(file, runJournal(run, 'suite', {wallMs: 16_200, config: `/etc/pdchaos/${name}.yaml`, ...extra}))
  return file
}

/**
 * The journal `suite --journal` writes on its way out of a run that reached no verdict (TargetCommand's own method).
 */
class Probe extends TargetCommand<typeof Probe> {
  async run(): Promise<void> {}
  failed(
    file: string,
    fields: Parameters<TargetCommand<typeof Probe>['writeFailureJournal']>[2],
    error: unknown,
  ): void {
    this.writeFailureJournal(file, 'suite', fields, error)
  }
}

/** The same journal with fixed times, for the reports' tests. */
function failed(name: string, error: PdError, deployment?: string): string {
  const file = join(dir, `${name}.json`)
  writeJournal(
    file,
    failureJournal(
      'suite',
      {name: 'nightly', config: `/etc/pdchaos/${name}.yaml`, deployment, startedAt: T0, finishedAt: T0 + 5000},
      errorDocument(error, 'suite').error,
    ),
  )
  return file
}

async function threeDeployments(): Promise<FleetRun> {
  const files = [
    journal('eu1', runOf('pd-eu1', false)),
    journal('us2', runOf('pd-us2', true, 30_000)),
    failed(
      'ap3',
      unreachable(
        'prefill at http://10.9.0.3:30000 did not answer within 5 s',
        'is it up? `pdchaos status` shows every service',
      ),
      'pd-ap3',
    ),
  ]
  return fleetFromJournals(files, {name: 'nightly-fleet'})
}

describe('pdchaos report: journals of separate runs, one combined report', () => {
  it(
    'reads each journal back as its deployment, the unreachable one with its reason; the exit code is the ' + 'worst',
    async () => {
      const fleet = await threeDeployments()
      expect(fleet.members.map(m => [m.name, m.status, m.exitCode])).toEqual([
        ['pd-eu1', 'pass', 0],
        ['pd-us2', 'fail', 1],
        ['pd-ap3', 'unreachable', 5],
      ])
      expect(fleet.exitCode).toBe(1)
      expect(fleet.members[0]).toMatchObject({
        deployment: 'pd-eu1',
        target: 'ssh root@pd-eu1.example:22',
        config: '/etc/pdchaos/eu1.yaml',
        suite: 'nightly',
        journal: join(dir, 'eu1.json'),
      })
      // The run came back whole: the reports render it as the run itself rendered.
      expect(fleet.members[0]!.run!.scenarios).toEqual(runOf('pd-eu1', false).scenarios)
      expect(fleet.members[2]).toMatchObject({
        reason: 'prefill at http://10.9.0.3:30000 did not answer within 5 s',
        suggestion: 'is it up? `pdchaos status` shows every service',
        suite: 'nightly',
      })
      // From the first run's start to the last one's end.
      expect([fleet.startedAt, fleet.finishedAt]).toEqual([T0, T0 + 30_000 + 16_200])
    },
  )

  it(
    'a run that reached no verdict leaves its error as its journal (as `suite --journal` writes it), even an ' +
      "error not pdchaos's own",
    async () => {
      const probe = new Probe([], {scopedEnvVar: () => undefined} as unknown as Config)
      const t0 = Date.now()
      const file = join(dir, 'locked.json')
      probe.failed(
        file,
        {
          name: 'nightly',
          runId: 'fleet-1.eu1',
          label: 'eu1',
          config: '/etc/pdchaos/eu1.yaml',
          deployment: 'pd-eu1',
          startedAt: t0,
        },
        new PdError('another chaos run holds the lock on ssh root@gpu7:22: root@ci pid 7 (suite nightly)', {
          exit: 2,
          code: 'E_LOCKED',
          suggestion: 'wait for it',
        }),
      )
      expect(await readJournal(file)).toMatchObject({
        name: 'eu1',
        status: 'error',
        exitCode: 2,
        deployment: 'pd-eu1',
        config: '/etc/pdchaos/eu1.yaml',
        suite: 'nightly',
        reason: 'another chaos run holds the lock on ssh root@gpu7:22: root@ci pid 7 (suite nightly)',
        suggestion: 'wait for it',
        startedAt: t0,
      })
      const crash = join(dir, 'crash.json')
      probe.failed(crash, {startedAt: t0}, new TypeError("Cannot read properties of undefined (reading 'pid')"))
      expect(await readJournal(crash)).toMatchObject({
        name: 'crash',
        status: 'error',
        exitCode: 5,
        reason: "Cannot read properties of undefined (reading 'pid')",
      })
      // No journal asked for: nothing written, nothing thrown.
      expect(() => probe.failed(undefined as unknown as string, {startedAt: t0}, new Error('x'))).not.toThrow()
    },
  )

  it('names a deployment by its --label first; two journals of one name are refused, exit 2', async () => {
    const a = await readJournal(journal('lab', runOf('pd-eu1', false), {label: 'eu1-canary'}))
    expect(a.name).toBe('eu1-canary')
    const e = await fleetFromJournals([
      journal('x1', runOf('pd-eu1', false)),
      journal('x2', runOf('pd-eu1', false, 86_400_000)),
    ]).catch((error: unknown) => error as PdError)
    expect(e).toBeInstanceOf(PdError)
    expect((e as PdError).exitCode).toBe(2)
    expect((e as PdError).message).toBe(
      `${join(dir, 'x1.json')} and ${join(dir, 'x2.json')} are both journals of pd-eu1: a combined report holds ` +
        `one run per deployment`,
    )
  })

  it('refuses what is not a journal, in one line naming the file', async () => {
    const bad = async (name: string, text: string) => {
      writeFileSync(join(dir, name), text)
      return readJournal(join(dir, name)).then(
        () => undefined,
        (error: unknown) => error as PdError,
      )
    }
    expect((await bad('cut.json', '{"pdchaos": 1, "scen'))?.message).toMatch(
      /cut\.json is not JSON \(.*\): a journal cut short, or not a journal$/,
    )
    const notOurs = await bad(
      'other.json',
      JSON.stringify({
        pdchaos: 1,
        command: 'suite',
        name: 'x',
        deployment: 'd',
        startedAt: 1,
        finishedAt: 2,
        scenarios: [{name: 's'}],
      }),
    )
    expect(notOurs?.exitCode).toBe(2)
    expect(notOurs?.message).toMatch(/other\.json is not a pdchaos journal: scenarios\[0\]\.kind/)
    expect(notOurs?.message).not.toMatch(/\n/)
    expect((await readJournal(join(dir, 'missing.json')).catch((error: unknown) => error as PdError))?.message).toBe(
      `no journal at ${join(dir, 'missing.json')}`,
    )
  })

  it(
    'one schema writes and reads a journal: a time out of range is refused at both ends, naming the field ' +
      '(issue 28)',
    async () => {
      const run = runOf('pd-range', false)
      const broken = {...run, scenarios: [{...run.scenarios[0]!, startedAt: 1e300}]} as SuiteRun
      expect(() => writeJournal(join(dir, 'range.json'), runJournal(broken, 'suite'))).toThrow(
        /the journal does not match its schema: scenarios\[0\]\.startedAt: /,
      )
      expect(existsSync(join(dir, 'range.json')), 'a journal that could not be read back is not written').toBe(false)
      writeFileSync(join(dir, 'range.json'), JSON.stringify({...runJournal(run, 'suite'), pdchaos: 1, finishedAt: -5}))
      const e = await readJournal(join(dir, 'range.json')).catch((error: unknown) => error as PdError)
      expect(e).toBeInstanceOf(PdError)
      expect((e as PdError).exitCode).toBe(2)
      expect((e as PdError).message).toMatch(/range\.json is not a pdchaos journal: finishedAt: Too small/)
    },
  )

  it(
    'text: one line per deployment, every failed check with its deployment, the exit code and what it ' + 'means',
    async () => {
      const text = renderFleet(await threeDeployments())
      const lines = text.split('\n')
      expect(lines[0]).toBe('fleet nightly-fleet: 3 deployment(s), 46.2s')
      expect(lines[1]).toMatch(
        /^ {2}PASS {8}pd-eu1: suite nightly on pd-eu1 \(ssh root@pd-eu1\.example:22\): 3 scenario\(s\), 15\/15 checks passed$/,
      )
      expect(lines[2]).toMatch(/^ {2}FAIL {8}pd-us2: .*1 of 15 checks failed/)
      expect(lines[3]).toBe(
        '  UNREACHABLE pd-ap3 [pd-ap3]: prefill at http://10.9.0.3:30000 did not answer within 5 s — try this: is it ' +
          'up? `pdchaos status` shows every service',
      )
      expect(text).toContain(`failed checks:\n  [pd-us2] eviction [drop-dest-info] ${NASTY}:`)
      expect(lines.at(-1)).toBe('fleet: exit 1 (a check failed); 1 pass, 1 fail, 1 unreachable')
    },
  )

  it(
    'JSON: the exit code, counts by status, and per deployment its status, reason, counts and failed ' + 'checks',
    async () => {
      const doc = fleetJson(await threeDeployments()) as {
        exitCode: number
        counts: Record<string, number>
        deployments: Array<Record<string, unknown>>
      }
      expect(doc.exitCode).toBe(1)
      expect(doc.counts).toMatchObject({pass: 1, fail: 1, unreachable: 1, stopped: 0})
      expect(doc.deployments[1]).toMatchObject({
        name: 'pd-us2',
        status: 'fail',
        exitCode: 1,
        runId: 'r-test-1',
        summary: {failed: 1, passed: 14},
        failedChecks: [{scenario: 'drop-dest-info', check: 'eviction', subject: NASTY}],
      })
      expect(doc.deployments[2]).toEqual({
        name: 'pd-ap3',
        status: 'unreachable',
        exitCode: 5,
        reason: 'prefill at http://10.9.0.3:30000 did not answer within 5 s',
        suggestion: 'is it up? `pdchaos status` shows every service',
        journal: join(dir, 'ap3.json'),
        config: '/etc/pdchaos/ap3.yaml',
        deployment: 'pd-ap3',
        suite: 'nightly',
        startedAt: T0,
        finishedAt: T0 + 5000,
      })
      // The scenarios' details stay in the journals: the document holds no run.
      expect(JSON.stringify(doc)).not.toContain('"observations"')
    },
  )

  it(
    'JUnit: a testsuite per deployment, classnames by deployment, the unreachable one an error with its ' + 'reason',
    async () => {
      const xml = renderFleetJUnit(await threeDeployments())
      const suites = [
        ...xml.matchAll(/<testsuite name="([^"]+)" tests="(\d+)" failures="(\d+)" errors="(\d+)" skipped="(\d+)"/g),
      ].map(m => m.slice(1))
      expect(suites).toEqual([
        ['pd-eu1', '15', '0', '0', '0'],
        ['pd-us2', '15', '1', '0', '0'],
        ['pd-ap3', '1', '0', '1', '0'],
      ])
      expect(xml).toMatch(/<testsuites name="nightly-fleet" tests="31" failures="1" errors="1" skipped="0"/)
      expect(xml).toContain('classname="pdchaos.pd-us2.drop-dest-info.eviction"')
      expect(xml).toContain('<testcase name="deployment pd-ap3" classname="pdchaos.pd-ap3.run" time="0.000">')
      expect(xml).toContain(
        '<error message="unreachable: prefill at http://10.9.0.3:30000 did not answer within 5 s" type="unreachable">',
      )
      expect(xml).toContain('<property name="target" value="ssh root@pd-eu1.example:22"/>')
      // Markup in a rid stays text; every testsuite has the timestamp the Ant schema requires.
      expect(xml).not.toContain('<script>')
      expect([...xml.matchAll(/<testsuite /g)].length).toBe(
        [...xml.matchAll(/<testsuite [^>]*timestamp="\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d"/g)].length,
      )
    },
  )

  it(
    'HTML: one file, an index linking each deployment to its own embedded report, the unreachable one with its ' +
      'reason',
    async () => {
      const html = renderFleetHtml(await threeDeployments())
      expect(html).toMatch(/<title>pdchaos fleet nightly-fleet: FAIL \(exit 1\)<\/title>/)
      const rows = [
        ...html.matchAll(
          /<tr><td><a href="#([^"]+)">([^<]+)<\/a><\/td><td><span class="badge [a-z]+">([A-Z-]+)<\/span><\/td><td>(\d)<\/td>/g,
        ),
      ].map(m => m.slice(1))
      expect(rows).toEqual([
        ['deployment-pd-eu1', 'pd-eu1', 'PASS', '0'],
        ['deployment-pd-us2', 'pd-us2', 'FAIL', '1'],
        ['deployment-pd-ap3', 'pd-ap3', 'UNREACHABLE', '5'],
      ])
      for (const [anchor] of rows) expect(html).toContain(`<section class="deployment" id="${anchor}">`)
      // Each deployment's scenarios keep their own anchors; the unreachable one says why and what to try.
      expect(html).toContain('id="deployment-pd-eu1-scenario-0"')
      expect(html).toContain('id="deployment-pd-us2-scenario-0"')
      expect(html).toMatch(
        /id="deployment-pd-ap3">[\s\S]*prefill at http:\/\/10\.9\.0\.3:30000 did not answer within 5 s[\s\S]*Try this: is it up\?/,
      )
      expect([...html.matchAll(/<svg /g)].length).toBe(6)
      // Self-contained: no script, no resource from elsewhere.
      expect(html).not.toMatch(/<script|src=|<link /)
    },
  )

  it(
    'metrics: one registry, every series labelled with its deployment, and an unreachable deployment counted ' +
      'as such',
    async () => {
      const {registry, series} = fleetRegistry(await threeDeployments())
      const text = await registry.metrics()
      expect(text).toMatch(/pdchaos_run_passed\{deployment="pd-eu1"\} 1/)
      expect(text).toMatch(/pdchaos_run_passed\{deployment="pd-us2"\} 0/)
      expect(text).toMatch(/pdchaos_run_passed\{deployment="pd-ap3"\} 0/)
      expect(text).toMatch(/pdchaos_deployment_reachable\{deployment="pd-ap3"\} 0/)
      expect(text).toMatch(/pdchaos_deployment_exit_code\{deployment="pd-us2"\} 1/)
      expect(text).toMatch(/pdchaos_fleet_exit_code 1/)
      expect(text).toMatch(
        /pdchaos_check_passed\{deployment="pd-eu1",scenario="stall-kv gpu2",check="eviction",subject="pin-s1"\} 1/,
      )
      expect(text).not.toMatch(/pdchaos_check_passed\{scenario=/)
      expect(series).toBeGreaterThan(60)
    },
  )
})
