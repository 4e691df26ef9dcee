import {mkdtempSync, rmSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {afterAll, describe, expect, it} from 'vitest'

import {memberArgv, memberDeadlineMs} from '../../src/cli/fleet-member.js'
import {checkFleet} from '../../src/cli/fleet-run.js'
import {vllmFileNoStart} from '../../src/cli/vllm-hosts.js'
import {renderVllmStatus} from '../../src/engines/vllm/status-text.js'
import {vllmDeploymentJsonSchema} from '../../src/engines/vllm/deployment-file.js'
import {VLLM_BUILTIN_SUITE} from '../../src/engines/vllm/experiments/builtin-suite.js'
import {vllmSuiteJsonSchema} from '../../src/engines/vllm/experiments/suite-file.js'
import {PdError} from '../../src/errors.js'
import {ExitCode} from '../../src/exit-codes.js'
import {entryStateDir, loadFleet} from '../../src/suite/fleet-file.js'
import {deploymentYaml, SUITE_YAML, writeTree} from './fleet-fixtures.js'

/**
 * vLLM deployments among a fleet's members (issue 31, round 2): an `engine: vllm` file runs the built-in vLLM suite or
 * its own vLLM suite file, as `pdchaos suite -c FILE` would alone; a suite of the other engine is refused before
 * anything runs, naming the deployment and the file; the member's deadline is its vLLM run lock's. Also the commands
 * that never start the twin find a vLLM file (-c, --sim on its state dir), and `pdchaos schema` knows both vLLM files.
 */

const root = mkdtempSync(join(process.env.TMPDIR ?? tmpdir(), 'pdchaos-fleet-vllm-'))
afterAll(() => rmSync(root, {recursive: true, force: true}))
let n = 0

const vllmYaml = (name: string, o: {stateDir?: string; labels?: string} = {}): string =>
  [
    'engine: vllm',
    `name: ${name}`,
    ...(o.labels ? [`labels: ${o.labels}`] : []),
    'host: {kind: local}',
    ...(o.stateDir ? [`stateDir: ${o.stateDir}`] : []),
    'services:',
    "  prefill: {url: 'http://127.0.0.1:8100', sideChannelPort: 5600}",
    "  decode: {url: 'http://127.0.0.1:8200', sideChannelPort: 5601}",
    "  router: {url: 'http://127.0.0.1:8000', healthPath: /healthcheck}",
    '',
  ].join('\n')

const VLLM_SUITE =
  'engine: vllm\nname: quick-vllm\nscenarios:\n  - {fault: drop-dest-info, pins: 1}\ncoRestart: false\n'

const dirOf = (files: Record<string, string>): string => writeTree(join(root, `f${++n}`), files)

async function refusal(p: Promise<unknown>): Promise<PdError> {
  try {
    await p
  } catch (error) {
    if (error instanceof PdError) return error
    throw error
  }
  throw new Error('expected a PdError')
}

describe('a fleet with engine: vllm deployments', () => {
  it('reads each vLLM member with its vLLM suite, or the built-in vLLM suite, beside SGLang members', async () => {
    const dir = dirOf({
      'fleet.yaml':
        'name: mixed\ndeployments:\n  - {name: sg, deployment: sg.yaml}\n  - {name: v1, deployment: v1.yaml}\n' +
        '  - {name: v2, deployment: v2.yaml, suite: vs.yaml}\n',
      'sg.yaml': deploymentYaml('pd-sg'),
      'v1.yaml': vllmYaml('pd-v1', {stateDir: '/tmp/pdchaos-fleet-test/v1'}),
      'v2.yaml': vllmYaml('pd-v2'),
      'vs.yaml': VLLM_SUITE,
    })
    const plan = await loadFleet(join(dir, 'fleet.yaml'))
    expect(plan.entries.map(e => [e.name, e.engine ?? 'sglang', e.deployment.name, e.suite.name])).toEqual([
      ['sg', 'sglang', 'pd-sg', 'default'],
      ['v1', 'vllm', 'pd-v1', VLLM_BUILTIN_SUITE.name],
      ['v2', 'vllm', 'pd-v2', 'quick-vllm'],
    ])
    // The state dir its run lock and halt use: the file's, else /run/pdchaos (where its faults keep their leases).
    expect(plan.entries.map(entryStateDir)).toEqual([
      '/tmp/pdchaos-fleet-test/pd-sg',
      '/tmp/pdchaos-fleet-test/v1',
      '/run/pdchaos',
    ])
    // Each runs as `pdchaos suite [ITS SUITE] -c FILE` would alone: the vLLM path of that command.
    const v2 = plan.entries[2]!
    expect(memberArgv(v2, {journalDir: '/j', pass: {}}).slice(0, 4)).toEqual([
      'suite',
      join(dir, 'vs.yaml'),
      '-c',
      join(dir, 'v2.yaml'),
    ])
    // Bounded by its vLLM run lock's TTL plus 5 minutes: 1 entry x 600 s + 3 x 240 s + 300 s, + 300 s.
    expect(memberDeadlineMs(v2)).toBe((600 + 720 + 300 + 300) * 1000)
  })

  it('refuses a suite of the other engine for a member (exit 2, naming the deployment and the suite)', async () => {
    const dir = dirOf({
      'fleet.yaml': 'suite: sg-suite.yaml\ndeployments:\n  - {name: v1, deployment: v1.yaml}\n',
      'v1.yaml': vllmYaml('pd-v1'),
      'sg-suite.yaml': SUITE_YAML,
      'fleet2.yaml': 'deployments:\n  - {name: sg, deployment: sg.yaml, suite: vs.yaml}\n',
      'sg.yaml': deploymentYaml('pd-sg'),
      'vs.yaml': VLLM_SUITE,
    })
    const a = await refusal(loadFleet(join(dir, 'fleet.yaml')))
    expect(a.exitCode).toBe(ExitCode.badInput)
    expect(a.message).toBe(
      `${join(dir, 'fleet.yaml')}: deployment v1 is a vLLM deployment and its suite ${join(dir, 'sg-suite.yaml')} ` +
        'is an SGLang suite file',
    )
    expect(a.suggestion).toMatch(/vLLM suite file \(engine: vllm\)/)
    const b = await refusal(loadFleet(join(dir, 'fleet2.yaml')))
    expect(b.message).toMatch(/deployment sg is an SGLang deployment and its suite .*vs\.yaml is a vLLM suite file/)
  })

  it('refuses a production vLLM member without --allow-production, and one host and stateDir listed twice', async () => {
    const dir = dirOf({
      'fleet.yaml': 'deployments:\n  - {name: v1, deployment: v1.yaml}\n',
      'v1.yaml': vllmYaml('pd-v1', {labels: '{environment: production}'}),
      'twice.yaml': 'deployments:\n  - {name: a, deployment: a.yaml}\n  - {name: b, deployment: b.yaml}\n',
      'a.yaml': vllmYaml('pd-a'),
      'b.yaml': vllmYaml('pd-b'),
    })
    const plan = await loadFleet(join(dir, 'fleet.yaml'))
    let error: unknown
    try {
      checkFleet(plan, {allowProduction: false})
    } catch (e) {
      error = e
    }
    expect((error as PdError).message).toMatch(/deployment pd-v1: it is labelled environment: production/)
    expect(() => checkFleet(plan, {allowProduction: true})).not.toThrow()
    const twice = await refusal(loadFleet(join(dir, 'twice.yaml')))
    expect(twice.message).toMatch(/deployments a and b use the same host and stateDir \/run\/pdchaos/)
  })
})

describe('commands that never start the twin, on a vLLM file (halt, resume, recover)', () => {
  it('find the vLLM file of -c and of --sim on its state dir; an SGLang file is left to their own path', async () => {
    const dir = dirOf({
      'v.yaml': vllmYaml('pd-v'),
      'sg.yaml': deploymentYaml('pd-sg'),
      'tw/pdchaos.yaml': vllmYaml('t'),
    })
    expect(await vllmFileNoStart({config: join(dir, 'v.yaml'), sim: false})).toBe(join(dir, 'v.yaml'))
    expect(await vllmFileNoStart({config: join(dir, 'sg.yaml'), sim: false})).toBeUndefined()
    const tw = join(dir, 'tw')
    const sim = {config: 'pdchaos.yaml', sim: true, 'state-dir': tw}
    expect(await vllmFileNoStart(sim)).toBe(join(tw, 'pdchaos.yaml'))
    expect(await vllmFileNoStart({...sim, engine: 'vllm'})).toBe(join(tw, 'pdchaos.yaml'))
    const wrong = await refusal(vllmFileNoStart({...sim, engine: 'sglang'}))
    expect(wrong.message).toBe(`the twin in ${tw} is the vLLM twin, not --engine sglang`)
    const none = await refusal(vllmFileNoStart({...sim, 'state-dir': join(dir, 'nothing'), engine: 'vllm'}))
    expect([none.exitCode, none.message]).toEqual([
      ExitCode.badInput,
      `no vLLM twin's deployment file in ${join(dir, 'nothing')}`,
    ])
    const noSim = await refusal(vllmFileNoStart({config: join(dir, 'v.yaml'), sim: false, engine: 'vllm'}))
    expect(noSim.message).toMatch(/^--engine applies only with --sim/)
  })

  it("status of a vLLM deployment shows pdchaos's leases, the run lock and the halt, as SGLang's does", () => {
    const text = renderVllmStatus({
      engine: 'vllm',
      host: 'local',
      declared: undefined,
      servers: [],
      router: {url: 'http://127.0.0.1:8000', health: {ok: true, detail: 'GET /healthcheck: 200'}},
      hostState: {
        leases: [{file: '/s/leases/stall-kv-1.json', id: 'stall-kv-1', fault: 'stall-kv'}],
        lock: {file: '/s/lock.json', owner: 'me@here pid 7', command: 'inject stall-kv'},
      },
      halt: {by: 'alice@ops', at: Date.UTC(2026, 11, 4, 15), reason: 'INC-7', host: 'host'},
    })
    expect(text).toContain('leases      stall-kv-1 (stall-kv)')
    expect(text).toContain('lock        held by me@here pid 7 for inject stall-kv')
    expect(text).toMatch(/HALTED {6}halted by alice@ops at 2026-12-04T15:00:00.000Z: INC-7/)
  })
})

describe('pdchaos schema vllm-deployment | vllm-suite', () => {
  it('are the vLLM files as a user writes them: engine: vllm required, the rest of each schema', () => {
    const d = vllmDeploymentJsonSchema() as {title: string; required: string[]; properties: Record<string, unknown>}
    expect(d.title).toBe('pdchaos vLLM deployment file (engine: vllm)')
    expect(d.required).toEqual(expect.arrayContaining(['engine', 'host', 'services']))
    expect(d.properties.engine).toEqual({type: 'string', const: 'vllm'})
    expect(Object.keys(d.properties)).toEqual(expect.arrayContaining(['stateDir', 'sudo', 'vllm', 'labels']))
    const s = vllmSuiteJsonSchema() as {title: string; required: string[]; properties: Record<string, unknown>}
    expect(s.title).toBe('pdchaos vLLM suite file (engine: vllm)')
    expect(s.required).toEqual(expect.arrayContaining(['engine', 'name', 'scenarios']))
    expect(Object.keys(s.properties)).toEqual(['engine', 'name', 'scenarios', 'coRestart'])
  })
})
