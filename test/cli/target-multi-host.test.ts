import {mkdtempSync, rmSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {afterAll, describe, expect, it} from 'vitest'

import {checkScenarioPairs, pairViews, resolveTarget, restartTargetsOf, type Target} from '../../src/cli/target.js'
import {loadDeploymentModel} from '../../src/deployment/load.js'
import {acrossHosts, hostView, singleHostRefusal} from '../../src/deployment/single-host.js'
import {PdError} from '../../src/errors.js'
import type {Host} from '../../src/hosts/host.js'
import {planFleet} from '../../src/suite/fleet-file.js'
import {SuiteSchema} from '../../src/suite/suite-file.js'

/**
 * A deployment file that spans two hosts, and one with two prefill instances: every command that acts on a
 * deployment acts across its hosts and instances (inject and suite on one instance pair); what it cannot act on is
 * refused with exit 2 before any host is reached.
 */

const dir = mkdtempSync(join(tmpdir(), 'pdchaos-multi-host-'))
afterAll(() => rmSync(dir, {recursive: true, force: true}))

// Hosts no test could reach: a command that tried would fail with exit 5, not refuse with exit 2.
const TWO_HOSTS = `name: pd-two
hosts:
  gpu-a: {kind: ssh, hostname: gpu-a.invalid, connectTimeoutSeconds: 1}
  gpu-b: {kind: ssh, hostname: gpu-b.invalid, connectTimeoutSeconds: 1}
services:
  prefill: {url: "http://10.0.3.7:30000", host: gpu-a}
  decode: {url: "http://10.0.3.8:30001", host: gpu-b}
  router: {url: "http://10.0.3.7:8000", host: gpu-a}
watchdog: {deadlineSeconds: 60, pollSeconds: 1}
`
const file = join(dir, 'pdchaos.yaml')
writeFileSync(file, TWO_HOSTS)

const COMMANDS = ['inject', 'suite', 'restart', 'status', 'recover']

/**
 * Two prefill instances over the two hosts: status reads them, inject and suite act on a pair, restart and recover on
 * each.
 */
const TWO_INSTANCES = TWO_HOSTS.replace(
  '  prefill: {url: "http://10.0.3.7:30000", host: gpu-a}',
  '  prefill:\n    - {url: "http://10.0.3.7:30000", host: gpu-a}\n    - {url: "http://10.0.3.8:30002", ' +
    'bootstrapPort: 8999, host: gpu-b}',
)
const instancesFile = join(dir, 'instances.yaml')
writeFileSync(instancesFile, TWO_INSTANCES)

async function refusal(p: Promise<unknown>): Promise<PdError> {
  const error = await p.then(
    () => undefined,
    (e: unknown) => e,
  )
  expect(error).toBeInstanceOf(PdError)
  return error as PdError
}

describe('a deployment that spans two hosts', () => {
  it('the file itself is valid', async () => {
    const m = await loadDeploymentModel(file)
    expect(m.hosts.map(h => h.name)).toEqual(['gpu-a', 'gpu-b'])
  })

  it.each(COMMANDS)(
    '%s acts across the two hosts: not refused (each host is reached for what runs there)',
    async command => {
      expect(singleHostRefusal(await loadDeploymentModel(file), command)).toBeUndefined()
    },
  )

  it.each(COMMANDS)('%s acts on two prefill instances, each on a host of its own: not refused', async command => {
    expect(singleHostRefusal(await loadDeploymentModel(instancesFile), command)).toBeUndefined()
  })

  it.each(['inject', 'suite'])(
    '%s: an instance pair that names no instance is exit 2, one line with the numbers there are; no host is reached',
    async command => {
      let checked = false
      const e = await refusal(
        resolveTarget(
          {config: instancesFile, sim: false},
          {
            command,
            pair: {prefill: 2, decode: 0},
            check: () => {
              checked = true
            },
          },
        ),
      )
      expect(e.exitCode).toBe(2)
      expect(e.message).toBe(
        `${instancesFile}: --prefill-instance 2: the deployment has 2 prefill instances, numbered 0 to 1 ` +
          `(services.prefill[0] to services.prefill[1])`,
      )
      expect(e.message).not.toContain('\n')
      // Refused before the command's own checks and before any connection.
      expect(checked).toBe(false)
    },
  )

  it('each host in use with the roles that run there, and the view of the deployment from each', async () => {
    const m = await loadDeploymentModel(file)
    expect(acrossHosts(m)).toEqual([
      {name: 'gpu-a', roles: ['prefill', 'router'], nodeRanks: []},
      {name: 'gpu-b', roles: ['decode'], nodeRanks: []},
    ])
    expect(hostView(m, 'gpu-b')).toMatchObject({
      host: {hostname: 'gpu-b.invalid'},
      services: {decode: {url: 'http://10.0.3.8:30001'}, prefill: {url: 'http://10.0.3.7:30000'}},
    })
  })

  it(
    'suite --fleet takes a deployment with several instances: each member acts on its first pair, as ' + 'suite does',
    async () => {
      const plan = await planFleet(
        {version: 1, name: 'f', maxParallel: 2, deployments: [{name: 'two', deployment: 'instances.yaml'}]},
        join(dir, 'fleet.yaml'),
      )
      expect(plan.entries[0]!.deployment.services.prefill.url).toBe('http://10.0.3.7:30000')
    },
  )
})

describe('a suite whose scenarios name instance pairs', () => {
  const suite = SuiteSchema.parse({
    scenarios: [
      {name: 'first', fault: 'drop-dest-info'},
      {name: 'second prefill', fault: 'drop-dest-info', pair: {prefill: 1}},
    ],
  })

  it('each pair is viewed on its own hosts, named as the file states it', async () => {
    const model = await loadDeploymentModel(instancesFile)
    const host = (name: string) => ({name}) as unknown as Host
    const t = {
      model,
      file: instancesFile,
      across: [
        {name: 'gpu-a', roles: ['prefill', 'router'], host: host('gpu-a')},
        {name: 'gpu-b', roles: ['prefill', 'decode'], host: host('gpu-b')},
      ],
    } as unknown as Target
    checkScenarioPairs(model, suite, 'suite.yaml', {prefill: 0, decode: 0})
    const views = pairViews(t)!
    expect(views.default).toEqual({prefill: 0, decode: 0})
    const second = views.viewOf({prefill: 1, decode: 0})
    expect(second.paths).toEqual({prefill: 'services.prefill[1]', decode: 'services.decode'})
    expect(second.deployment.services.prefill.url).toBe('http://10.0.3.8:30002')
    // prefill[1] and decode on gpu-b, the router on gpu-a: the fault acts on gpu-b.
    expect(second.placement.hosts.map(h => [h.name, h.roles])).toEqual([
      ['gpu-a', ['router']],
      ['gpu-b', ['prefill', 'decode']],
    ])
    // One instance per role: no pairs to view.
    expect(pairViews({...t, model: await loadDeploymentModel(file)})).toBeUndefined()
  })

  it('a pair the deployment does not have is exit 2 naming the scenario, before any host is reached', async () => {
    const model = await loadDeploymentModel(instancesFile)
    const bad = SuiteSchema.parse({scenarios: [{name: 'third', fault: 'drop-dest-info', pair: {prefill: 2}}]})
    let e: unknown
    try {
      checkScenarioPairs(model, bad, 'suite.yaml', {prefill: 0, decode: 0})
    } catch (error) {
      e = error
    }
    expect(e).toBeInstanceOf(PdError)
    expect((e as PdError).exitCode).toBe(2)
    expect((e as PdError).message).toBe(
      'suite.yaml: scenarios[0] (third) pair.prefill 2: the deployment has 2 prefill instances, numbered 0 to 1 ' +
        '(services.prefill[0] to services.prefill[1])',
    )
  })
})

describe('a co-restart of a deployment with several instances', () => {
  it("is a step per instance, in the file's order within each role, each on the host of its node rank 0", async () => {
    const model = await loadDeploymentModel(instancesFile)
    const host = (name: string) => ({name}) as unknown as Host
    const t = {
      model,
      across: model.hosts.map(h => ({name: h.name, roles: [], host: host(h.name)})),
    } as unknown as Target
    const steps = restartTargetsOf(t, ['prefill', 'decode', 'router'])
    expect(steps.map(s => [s.name, s.path, s.service.url, (s.host as unknown as {name: string}).name])).toEqual([
      ['prefill[0]', 'services.prefill[0]', 'http://10.0.3.7:30000', 'gpu-a'],
      ['prefill[1]', 'services.prefill[1]', 'http://10.0.3.8:30002', 'gpu-b'],
      ['decode', 'services.decode', 'http://10.0.3.8:30001', 'gpu-b'],
      ['router', 'services.router', 'http://10.0.3.7:8000', 'gpu-a'],
    ])
    // The order given is kept; a role with one instance is named by its role, as a single-instance file always was.
    expect(restartTargetsOf(t, ['router', 'prefill']).map(s => s.name)).toEqual(['router', 'prefill[0]', 'prefill[1]'])
    expect(restartTargetsOf({...t, model: await loadDeploymentModel(file)}, ['prefill']).map(s => s.name)).toEqual([
      'prefill',
    ])
  })

  it(
    'in the order the file states (restartOrder:), also for the default roles; roles named otherwise keep the ' +
      "file's order within each",
    async () => {
      const ordered = join(dir, 'ordered.yaml')
      // A block list: no quotes needed around the brackets.
      writeFileSync(ordered, `${TWO_INSTANCES}restartOrder:\n  - prefill[1]\n  - decode\n  - prefill[0]\n  - router\n`)
      const model = await loadDeploymentModel(ordered)
      expect(model.restartOrder).toEqual([
        'services.prefill[1]',
        'services.decode',
        'services.prefill[0]',
        'services.router',
      ])
      const t = {
        model,
        across: model.hosts.map(h => ({name: h.name, roles: [], host: {name: h.name} as unknown as Host})),
      } as unknown as Target
      const named = (roles?: Array<'prefill' | 'decode' | 'router'>) =>
        restartTargetsOf(t, roles).map(s => `${s.name}@${(s.host as unknown as {name: string}).name}`)
      expect(named()).toEqual(['prefill[1]@gpu-b', 'decode@gpu-b', 'prefill[0]@gpu-a', 'router@gpu-a'])
      expect(named(['prefill', 'decode', 'router'])).toEqual(named())
      expect(named(['decode', 'prefill'])).toEqual(['decode@gpu-b', 'prefill[1]@gpu-b', 'prefill[0]@gpu-a'])
      // A file that states no order: prefill instances, decode, router, as before.
      expect(restartTargetsOf({...t, model: await loadDeploymentModel(instancesFile)}).map(s => s.name)).toEqual([
        'prefill[0]',
        'prefill[1]',
        'decode',
        'router',
      ])
    },
  )
})
