import {describe, expect, it} from 'vitest'

import type {PdError} from '../../src/errors.js'
import {defaultSuite, parseSuite, suiteJsonSchema} from '../../src/suite/suite-file.js'

const bad = (text: string): PdError => {
  try {
    parseSuite(text, 'nightly.yaml')
  } catch (error) {
    return error as PdError
  }
  throw new Error('expected a PdError')
}

describe('suite file', () => {
  it('parses a suite with defaults filled in', () => {
    const s = parseSuite(
      'scenarios:\n  - name: a\n    fault: stall-kv\n    params: {gpu: 1}\n  - name: r\n    restart: {services: ' +
        '[router]}\ngate: {}\n',
      'x.yaml',
    )
    expect(s.scenarios[0]).toMatchObject({pins: 2, repetitions: 1, params: {gpu: 1}})
    expect(s.scenarios[1].restart).toMatchObject({services: ['router'], watchSeconds: 5})
    expect(s.gate).toEqual({
      maxFailedChecks: 0,
      maxFaultsLeftBehind: 0,
      requiredChecks: [],
      unverifiedBlocks: ['eviction', 'kv-lease'],
    })
    expect(s.stop.kernelXid).toBe(true)
  })

  it('names the file and the path of every mistake, exit 2', () => {
    const e = bad('scenarios:\n  - name: a\n    fault: stall-kv\n    pins: 0\n  - name: a\n    fault: nope\n')
    expect(e.exitCode).toBe(2)
    expect(e.message).toMatch(/^nightly\.yaml: /)
    expect(e.message).toMatch(/scenarios\[0\]\.pins/)
    expect(e.message).toMatch(/scenarios\[1\]\.fault/)
    expect(e.message).toMatch(/params\.gpu: stall-kv needs params\.gpu/)
  })

  it('refuses a scenario with both or neither of fault and restart, unknown keys and duplicate names', () => {
    expect(bad('scenarios:\n  - name: a\n').message).toMatch(/exactly one of fault or restart/)
    expect(bad('scenarios:\n  - {name: a, fault: drop-dest-info, restart: {}}\n').message).toMatch(
      /exactly one of fault or restart/,
    )
    expect(bad('scenarios:\n  - {name: a, fault: drop-dest-info, pinz: 3}\n').message).toMatch(/pinz/)
    expect(
      bad('scenarios:\n  - {name: a, fault: drop-dest-info}\n  - {name: a, fault: drop-dest-info}\n').message,
    ).toMatch(/duplicate scenario name "a"/)
  })

  it('points at the line of a YAML syntax error', () => {
    expect(bad('scenarios:\n  - name: [a\n').message).toMatch(/^nightly\.yaml:\d+:\d+: YAML syntax error/)
  })

  it("the built-in suite covers the three faults on several GPUs, the gateway's breaker and a co-restart", () => {
    const s = defaultSuite()
    expect(new Set(s.scenarios.map(x => x.fault ?? 'restart'))).toEqual(
      new Set(['stall-kv', 'abort-mid-transfer', 'drop-dest-info', 'trip-breaker', 'kill-prefill', 'restart']),
    )
    expect(new Set(s.scenarios.map(x => x.params.gpu).filter(g => g !== undefined)).size).toBeGreaterThanOrEqual(3)
  })

  it('has a JSON Schema', () => {
    const j = suiteJsonSchema() as {title: string; properties: Record<string, unknown>}
    expect(j.title).toBe('pdchaos suite file')
    expect(Object.keys(j.properties)).toEqual(expect.arrayContaining(['scenarios', 'stop', 'gate']))
  })
})
