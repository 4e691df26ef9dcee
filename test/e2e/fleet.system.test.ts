import {mkdtempSync, readFileSync, rmSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {parse as parseYaml, stringify} from 'yaml'

import {createTestHost, SMALL_TWIN, type TestHost} from '../harness/test-host.js'
import {freePort} from '../sim/launch-pair.js'
import {runCli} from './cli.js'
import {TWIN_ARGS} from './matrix-helpers.js'

/**
 * Issue 13's fleet: three deployments in one `suite --fleet` run, two twins over SSH in their own namespaces and one
 * whose host does not answer (its SSH port on loopback, where nothing listens). The two reachable ones are judged,
 * the third is reported unreachable with its reason, and the combined exit code follows the precedence (5 here).
 */
let dir: string
const hosts: TestHost[] = []

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'pdchaos-fleet-'))
  hosts.push(
    ...(await Promise.all(
      [0, 1].map(() =>
        createTestHost({twin: {...SMALL_TWIN, deadlineSeconds: 1.5, pollSeconds: 0.5, args: TWIN_ARGS}}),
      ),
    )),
  )
  // The third: the first twin's file, its SSH host moved to a loopback port nothing listens on.
  const gone = parseYaml(readFileSync(hosts[0]!.deploymentFile, 'utf8')) as {
    name: string
    host: Record<string, unknown>
  }
  gone.name = 'gone'
  gone.host = {...gone.host, hostname: '127.0.0.1', port: await freePort(), connectTimeoutSeconds: 2}
  writeFileSync(join(dir, 'gone.yaml'), stringify(gone))
  // One small scenario per deployment: the fleet is under test here, not the suite.
  writeFileSync(
    join(dir, 'suite.yaml'),
    stringify({
      name: 'fleet-smoke',
      scenarios: [{name: 'drop', fault: 'drop-dest-info', pins: 1}],
      stop: {kernelXid: false},
    }),
  )
  writeFileSync(
    join(dir, 'fleet.yaml'),
    stringify({
      name: 'e2e-fleet',
      suite: 'suite.yaml',
      maxParallel: 3,
      deployments: [
        {name: 'a', deployment: hosts[0]!.deploymentFile},
        {name: 'b', deployment: hosts[1]!.deploymentFile},
        {name: 'gone', deployment: 'gone.yaml'},
      ],
    }),
  )
}, 240_000)

afterAll(async () => {
  await Promise.all(hosts.map(h => h.destroy()))
  if (dir) rmSync(dir, {recursive: true, force: true})
}, 120_000)

describe('suite --fleet over three deployments, one unreachable', () => {
  it('judges the two that answer, reports the third unreachable with its reason, one combined report and ' +
    'exit code', async () => {
    const out = (f: string) => join(dir, f)
    const r = await runCli(
      [
        'suite',
        '--fleet',
        out('fleet.yaml'),
        '--json',
        '--journal-dir',
        out('journals'),
        '--junit',
        out('junit.xml'),
        '--html',
        out('fleet.html'),
      ],
      {timeoutMs: 300_000},
    )
    const j = JSON.parse(r.stdout) as {
      exitCode: number
      deployments: Array<{
        name: string
        status: string
        exitCode: number
        reason?: string
        summary?: {passed: number; failed: number}
      }>
    }
    const by = Object.fromEntries(j.deployments.map(d => [d.name, d]))
    const shown = JSON.stringify(j.deployments, null, 1).slice(0, 3000)
    expect(Object.keys(by).sort(), shown).toEqual(['a', 'b', 'gone'])
    for (const name of ['a', 'b']) {
      expect(by[name], shown).toMatchObject({status: 'pass', exitCode: 0})
      expect(by[name]!.summary!.passed, shown).toBeGreaterThan(0)
    }
    expect(by.gone, shown).toMatchObject({status: 'unreachable', exitCode: 5})
    expect(by.gone!.reason, shown).toMatch(/127\.0\.0\.1/)
    // One exit code: every judged deployment passed, one was unreachable.
    expect(j.exitCode).toBe(5)
    expect(r.code).toBe(5)
    // One combined report: a testsuite per deployment, each deployment in the HTML, a journal per deployment.
    expect(readFileSync(out('junit.xml'), 'utf8').match(/<testsuite /g)).toHaveLength(3)
    const html = readFileSync(out('fleet.html'), 'utf8')
    for (const name of ['a', 'b', 'gone']) expect(html).toContain(name)
    const report = await runCli([
      'report',
      out('journals/a.json'),
      out('journals/b.json'),
      out('journals/gone.json'),
      '--json',
    ])
    expect(JSON.parse(report.stdout)).toMatchObject({exitCode: 5})
    expect(report.code).toBe(5)
  }, 320_000)
})
