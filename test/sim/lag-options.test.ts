import {describe, expect, it} from 'vitest'

import {buildSimConfig} from '../../src/sim/lifecycle/options.js'
import {drawLag, parseLag} from '../../src/sim/server/lag.js'

describe('the twin lag options (sim up --entry-lag-ms / --answer-lag-ms)', () => {
  it('parses N and N:JITTER in ms, and refuses what is not one', () => {
    expect(parseLag('150')).toEqual({ms: 150, jitterMs: 0})
    expect(parseLag('150:100')).toEqual({ms: 150, jitterMs: 100})
    expect(parseLag('abc')).toMatch(/not N or N:JITTER/)
    expect(parseLag('100:150')).toMatch(/jitter \(150 ms\) is larger than the lag/)
    expect(parseLag('70000')).toMatch(/more than 60000 ms/)
  })

  it('draws uniformly inside [N - J, N + J]', () => {
    const l = {ms: 150, jitterMs: 100}
    expect(drawLag(l, () => 0)).toBe(50)
    expect(drawLag(l, () => 1)).toBe(250)
    expect(drawLag({ms: 10, jitterMs: 0})).toBe(10)
  })

  it('sim up writes them to sim.json; 0 means off; a bad value is bad input naming the flag', () => {
    expect(buildSimConfig({stateDir: '/tmp/x', entryLagMs: '100:50', answerLagMs: '150:100'}).lags).toEqual({entry: {ms: 100, jitterMs: 50}, answer: {ms: 150, jitterMs: 100}})
    expect(buildSimConfig({stateDir: '/tmp/x', entryLagMs: '0'}).lags).toBeUndefined()
    expect(buildSimConfig({stateDir: '/tmp/x'}).lags).toBeUndefined()
    expect(() => buildSimConfig({stateDir: '/tmp/x', answerLagMs: '5:9'})).toThrow(/--answer-lag-ms: the jitter/)
  })
})
