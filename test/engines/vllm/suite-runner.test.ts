import {describe, expect, it} from 'vitest'

import {checkEngineFlags, vllmSimDir} from '../../../src/cli/engine-target.js'
import {VLLM_BUILTIN_SUITE} from '../../../src/engines/vllm/experiments/builtin-suite.js'
import type {VllmContext, VllmExperiment} from '../../../src/engines/vllm/experiments/experiment.js'
import {VLLM_FAULT_NAMES} from '../../../src/engines/vllm/experiments/registry.js'
import {runVllmSuiteIn, type VllmSuiteOptions} from '../../../src/engines/vllm/experiments/suite.js'
import {PdError} from '../../../src/errors.js'
import {ExitCode} from '../../../src/exit-codes.js'
import {runExitCode, type ScenarioRun} from '../../../src/model/run.js'
import {renderJUnit} from '../../../src/report/junit.js'
import {renderSuite} from '../../../src/report/suite-text.js'
import {GateSchema} from '../../../src/suite/suite-file.js'

/**
 * The vLLM suite runner (engines/vllm/experiments/suite.ts) with stand-in experiments: entries run in order into one
 * run with engine: vllm; one that refuses or throws is that scenario's error and the others still run; a stop while
 * one runs marks the run stopped (exit 3) and runs nothing after it; --gate judges the run as SGLang's.
 */

const scenario = (fault: string, verdict: 'pass' | 'fail'): ScenarioRun => ({
  name: `${fault} (vllm)`,
  kind: 'inject',
  fault,
  startedAt: 1,
  finishedAt: 2,
  verdicts: [{check: 'kv-lease', subject: `cmpl-${fault}-0`, verdict, summary: verdict, evidence: {}}],
  pins: [],
  leases: [],
  contract: {scope: 'all', deadlineSeconds: 4, pollSeconds: 1},
})

const experiment = (fault: string, run: () => Promise<ScenarioRun>, refuse = false): VllmExperiment => ({
  fault,
  summary: fault,
  takes: [],
  prepare: async () =>
    refuse
      ? {refusal: `${fault} cannot be judged here`, hint: 'read status'}
      : {lines: [`plan of ${fault}`], plan: {}, run},
})

function context(controller: AbortController): VllmContext {
  return {
    file: '/x/pdchaos.yaml',
    deployment: {name: 'twin', host: {kind: 'local'}} as VllmContext['deployment'],
    host: {} as VllmContext['host'],
    discovery: {
      engine: 'vllm',
      host: 'local',
      declared: undefined,
      servers: [],
      router: {url: '', health: {ok: true, detail: ''}},
    },
    signal: controller.signal,
    progress: () => {},
  }
}

const options = (controller: AbortController, experiments: Record<string, VllmExperiment>): VllmSuiteOptions => ({
  file: '/x/pdchaos.yaml',
  signal: controller.signal,
  progress: () => {},
  restart: {healthTimeoutS: 1, commandTimeoutS: 1, canaries: 0, settleS: 0, canaryTimeoutS: 1},
  experiments,
})

const suiteOf = (...faults: string[]) => ({
  name: 'test',
  entries: faults.map(fault => ({fault, options: {}})),
  coRestart: false,
})

describe('the vLLM suite runner', () => {
  it("runs every entry in order into one run with engine: vllm; a refusal and a throw are their scenarios' errors", async () => {
    const c = new AbortController()
    const ran: string[] = []
    const ok = (f: string) =>
      experiment(f, async () => {
        ran.push(f)
        return scenario(f, 'pass')
      })
    const experiments = {
      a: ok('a'),
      refused: experiment('refused', async () => scenario('refused', 'pass'), true),
      broken: experiment('broken', async () => {
        throw new Error('P answered 500')
      }),
      b: ok('b'),
    }
    const run = await runVllmSuiteIn(context(c), suiteOf('a', 'refused', 'broken', 'b'), options(c, experiments))
    expect(run.engine).toBe('vllm')
    expect(ran).toEqual(['a', 'b'])
    expect(run.scenarios.map(s => [s.name, s.error])).toEqual([
      ['a (vllm)', undefined],
      ['refused (vllm)', 'refused cannot be judged here (read status)'],
      ['broken (vllm)', 'P answered 500'],
      ['b (vllm)', undefined],
    ])
    expect(run.plan!.join('\n')).toContain('2. refused (vllm): NOT RUN: refused cannot be judged here')
    expect(run.batches!.map(b => b.scenarios)).toEqual([
      ['a (vllm)'],
      ['refused (vllm)'],
      ['broken (vllm)'],
      ['b (vllm)'],
    ])
    // Errored scenarios fail the run (exit 1), and the text names the engine.
    expect(runExitCode(run)).toBe(ExitCode.checkFailed)
    expect(renderSuite(run, {wallMs: 1000})).toMatch(/^suite test on twin \(engine vllm\): 4 scenario\(s\)/m)
    expect(renderJUnit(run)).toContain('<property name="engine" value="vllm"/>')
  })

  it('a stop while an entry runs marks the run stopped (exit 3) and runs nothing after it', async () => {
    const c = new AbortController()
    const ran: string[] = []
    const experiments = {
      a: experiment('a', async () => {
        ran.push('a')
        c.abort('interrupted (SIGINT)')
        throw new PdError('interrupted: nothing to revert', {exit: ExitCode.stopped})
      }),
      b: experiment('b', async () => {
        ran.push('b')
        return scenario('b', 'pass')
      }),
    }
    const run = await runVllmSuiteIn(context(c), suiteOf('a', 'b'), options(c, experiments))
    expect(ran).toEqual(['a'])
    expect(run.stopped).toEqual({reason: 'interrupted (SIGINT)'})
    expect(run.scenarios.map(s => s.name)).toEqual(['a (vllm)'])
    expect(runExitCode(run)).toBe(ExitCode.stopped)
  })

  it('--gate judges a vLLM run as an SGLang one: a failed kv-lease check fails the gate', async () => {
    const c = new AbortController()
    const experiments = {
      a: experiment('a', async () => scenario('a', 'pass')),
      b: experiment('b', async () => scenario('b', 'fail')),
    }
    const gate = GateSchema.parse({})
    const passed = await runVllmSuiteIn(context(c), suiteOf('a'), {...options(c, experiments), gate})
    expect(passed.gate).toEqual({passed: true, reasons: []})
    const failed = await runVllmSuiteIn(context(c), suiteOf('a', 'b'), {...options(c, experiments), gate})
    expect(failed.gate?.passed).toBe(false)
    expect(failed.gate?.reasons.join('\n')).toContain('FAILED kv-lease [b (vllm)] cmpl-b-0')
  })

  it('the built-in vLLM suite lists only registered faults, and ends with the co-restart', () => {
    for (const e of VLLM_BUILTIN_SUITE.entries) expect(VLLM_FAULT_NAMES()).toContain(e.fault)
    expect(VLLM_BUILTIN_SUITE.coRestart).toBe(true)
  })
})

describe('--engine and the vLLM twin flags', () => {
  const base = {config: './pdchaos.yaml', sim: false}
  it('--engine without --sim is bad input (the file decides); a twin flag needs --sim --engine vllm', () => {
    expect(() => checkEngineFlags({...base, engine: 'vllm'})).toThrow(/--engine applies only with --sim/)
    expect(() => checkEngineFlags({...base, sim: true, 'sim-lease': '4'})).toThrow(
      /--sim-lease applies only with --sim --engine vllm/,
    )
    expect(() => checkEngineFlags({...base, sim: true, engine: 'vllm', 'sim-lease': '4'})).not.toThrow()
  })
  it("the vLLM twin's default state dir is the SGLang twin's + -vllm", () => {
    expect(vllmSimDir({PDCHAOS_SIM_DIR: '/tmp/sim'})).toBe('/tmp/sim-vllm')
    expect(vllmSimDir({XDG_STATE_HOME: '/s'})).toBe('/s/pdchaos/sim-vllm')
  })
})
