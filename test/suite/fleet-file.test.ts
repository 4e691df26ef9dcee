import {mkdtempSync, rmSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {afterAll, describe, expect, it} from 'vitest'

import {checkFleet} from '../../src/cli/fleet-run.js'
import {PdError} from '../../src/errors.js'
import {fleetJsonSchema, loadFleet, parseFleet} from '../../src/suite/fleet-file.js'
import {deploymentYaml, SUITE_YAML, writeTree} from './fleet-fixtures.js'

const root = mkdtempSync(join(tmpdir(), 'pdchaos-fleet-file-'))
afterAll(() => rmSync(root, {recursive: true, force: true}))
let n = 0

async function refusal(p: Promise<unknown> | (() => unknown)): Promise<PdError> {
  try {
    await (typeof p === 'function' ? p() : p)
  } catch (error) {
    if (error instanceof PdError) return error
    throw error
  }
  throw new Error('expected a PdError')
}

/** A fleet directory: fleet.yaml plus the files it names. */
function fleetDir(files: Record<string, string>): string {
  return writeTree(join(root, `f${++n}`), files)
}

describe('the fleet file', () => {
  it(
    'resolves every path against the fleet file, fills the defaults, and reads each deployment and ' + 'suite',
    async () => {
      const dir = fleetDir({
        'fleet.yaml':
          'name: nightly-fleet\nsuite: suites/nightly.yaml\ndeployments:\n  - {name: eu1, deployment: ' +
          'eu1/pdchaos.yaml}\n  - {name: us2, deployment: us2.yaml, suite: other.yaml}\n  - {name: ap3, ' +
          'deployment: ap3.yaml}\n',
        'suites/nightly.yaml': SUITE_YAML,
        'other.yaml': 'name: other\nscenarios:\n  - {name: a, fault: stall-kv, params: {gpu: 1}}\n',
        'eu1/pdchaos.yaml': deploymentYaml('pd-eu1'),
        'us2.yaml': deploymentYaml('pd-us2', {port: 31_000}),
        'ap3.yaml': deploymentYaml('pd-ap3', {port: 32_000}),
      })
      const plan = await loadFleet(join(dir, 'fleet.yaml'))
      expect(plan.name).toBe('nightly-fleet')
      expect(plan.maxParallel).toBe(4)
      expect(plan.entries.map(e => [e.name, e.deploymentFile, e.suiteFile, e.deployment.name, e.suite.name])).toEqual([
        ['eu1', join(dir, 'eu1/pdchaos.yaml'), join(dir, 'suites/nightly.yaml'), 'pd-eu1', 'nightly'],
        ['us2', join(dir, 'us2.yaml'), join(dir, 'other.yaml'), 'pd-us2', 'other'],
        ['ap3', join(dir, 'ap3.yaml'), join(dir, 'suites/nightly.yaml'), 'pd-ap3', 'nightly'],
      ])
    },
  )

  it('without a suite anywhere, each deployment runs the built-in suite', async () => {
    const dir = fleetDir({
      'fleet.yaml': 'deployments:\n  - {name: a, deployment: a.yaml}\nmaxParallel: 2\n',
      'a.yaml': deploymentYaml('a'),
    })
    const plan = await loadFleet(join(dir, 'fleet.yaml'))
    expect(plan).toMatchObject({name: 'fleet', maxParallel: 2})
    expect(plan.entries[0]!.suite.name).toBe('default')
    expect(plan.entries[0]!.suiteFile).toBeUndefined()
  })

  it('names the file and the path of each mistake, exit 2', async () => {
    const e = await refusal(() =>
      parseFleet(
        'deployments:\n  - {name: "eu 1", deployment: a.yaml}\n  - {name: b}\n  - {name: c, deployment: c.yaml, ' +
          'gpus: 8}\nmaxParallel: 0\n',
        'fleet.yaml',
      ),
    )
    expect(e.exitCode).toBe(2)
    expect(e.message).toMatch(/^fleet\.yaml: /)
    expect(e.message).toMatch(/deployments\[0\]\.name: .*letters, digits and _ \. - only/)
    expect(e.message).toMatch(/deployments\[1\]\.deployment/)
    expect(e.message).toMatch(/deployments\[2\].*gpus/)
    expect(e.message).toMatch(/maxParallel/)
    expect(e.suggestion).toMatch(/pdchaos schema fleet/)
    expect((await refusal(() => parseFleet('deployments: []\n', 'f.yaml'))).message).toMatch(/deployments/)
    expect(
      (
        await refusal(() =>
          parseFleet('deployments:\n  - {name: a, deployment: a.yaml}\n  - {name: a, deployment: b.yaml}\n', 'f.yaml'),
        )
      ).message,
    ).toMatch(/deployments\[1\]\.name: duplicate name "a" \(also deployments\[0\]\)/)
  })

  it(
    'refuses, before anything runs, a deployment or suite file that is missing or wrong, naming ' + 'that file',
    async () => {
      const missing = fleetDir({
        'fleet.yaml': 'deployments:\n  - {name: a, deployment: a.yaml}\n  - {name: b, deployment: nope.yaml}\n',
        'a.yaml': deploymentYaml('a'),
      })
      const e1 = await refusal(loadFleet(join(missing, 'fleet.yaml')))
      expect(e1.exitCode).toBe(2)
      expect(e1.message).toBe(`no deployment file at ${join(missing, 'nope.yaml')}`)
      const badSuite = fleetDir({
        'fleet.yaml': 'suite: s.yaml\ndeployments:\n  - {name: a, deployment: a.yaml}\n',
        'a.yaml': deploymentYaml('a'),
        's.yaml': 'scenarios: []\n',
      })
      const e2 = await refusal(loadFleet(join(badSuite, 'fleet.yaml')))
      expect(e2.message).toMatch(new RegExp(`^${join(badSuite, 's.yaml')}: scenarios`))
      expect((await refusal(loadFleet(join(root, 'no-such-fleet.yaml')))).message).toMatch(/^no fleet file at /)
    },
  )

  it(
    'refuses one deployment listed twice (same file, or same host and state dir): the runs would fight over ' +
      'its lock',
    async () => {
      const twice = fleetDir({
        'fleet.yaml': 'deployments:\n  - {name: a, deployment: a.yaml}\n  - {name: b, deployment: ./sub/../a.yaml}\n',
        'a.yaml': deploymentYaml('a'),
      })
      const e = await refusal(loadFleet(join(twice, 'fleet.yaml')))
      expect(e.exitCode).toBe(2)
      expect(e.message).toMatch(
        /deployments a and b use the same deployment file .*a\.yaml: two runs of one deployment would contend for its host lock/,
      )
      const sameHost = fleetDir({
        'fleet.yaml': 'deployments:\n  - {name: a, deployment: a.yaml}\n  - {name: b, deployment: b.yaml}\n',
        'a.yaml': deploymentYaml('a', {stateDir: '/run/pdchaos'}),
        'b.yaml': deploymentYaml('b', {stateDir: '/run/pdchaos', port: 31_000}),
      })
      expect((await refusal(loadFleet(join(sameHost, 'fleet.yaml')))).message).toMatch(
        /deployments a and b use the same host and stateDir \/run\/pdchaos/,
      )
    },
  )

  it(
    'before anything runs: a production deployment needs --allow-production, and every journal must be ' + 'writable',
    async () => {
      const dir = fleetDir({
        'fleet.yaml': 'deployments:\n  - {name: a, deployment: a.yaml}\n  - {name: prod, deployment: p.yaml}\n',
        'a.yaml': deploymentYaml('a'),
        'p.yaml': deploymentYaml('pd-prod', {port: 31_000, labels: {environment: 'production'}}),
        file: 'x',
      })
      const plan = await loadFleet(join(dir, 'fleet.yaml'))
      const e = await refusal(() => checkFleet(plan, {allowProduction: false}))
      expect(e).toMatchObject({
        exitCode: 2,
        code: 'E_PRODUCTION',
        message:
          'refusing to run fleet fleet (deployment prod) against deployment pd-prod: it is labelled environment: ' +
          'production',
      })
      expect(() => checkFleet(plan, {allowProduction: true, journalDir: join(dir, 'journals')})).not.toThrow()
      const j = await refusal(() => checkFleet(plan, {allowProduction: true, journalDir: join(dir, 'file')}))
      expect(j.message).toMatch(
        /^--journal-dir .*\/file\/a\.json cannot be written: a part of its path is a file, not a directory/,
      )
    },
  )

  it('has a JSON Schema (`pdchaos schema fleet`)', () => {
    const j = fleetJsonSchema() as {
      title: string
      properties: Record<string, {items?: {required?: string[]}}>
      required: string[]
    }
    expect(j.title).toBe('pdchaos fleet file')
    expect(Object.keys(j.properties)).toEqual(expect.arrayContaining(['name', 'maxParallel', 'suite', 'deployments']))
    expect(j.required).toEqual(['deployments'])
    expect(j.properties.deployments!.items!.required).toEqual(['name', 'deployment'])
  })
})
