import {describe, expect, it} from 'vitest'

import {buildSimConfig} from '../../src/sim/lifecycle/options.js'
import {drawLag, parseLag} from '../../src/sim/server/lag.js'
import {TokenizerQueue} from '../../src/sim/server/tokenizer.js'

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
    expect(buildSimConfig({stateDir: '/tmp/x', entryLagMs: '100:50', answerLagMs: '150:100'}).lags).toEqual({
      entry: {ms: 100, jitterMs: 50},
      answer: {ms: 150, jitterMs: 100},
    })
    expect(buildSimConfig({stateDir: '/tmp/x', entryLagMs: '0'}).lags).toBeUndefined()
    expect(buildSimConfig({stateDir: '/tmp/x'}).lags).toBeUndefined()
    expect(() => buildSimConfig({stateDir: '/tmp/x', answerLagMs: '5:9'})).toThrow(/--answer-lag-ms: the jitter/)
    expect(buildSimConfig({stateDir: '/tmp/x', tokenizeMs: '250'}).lags).toEqual({tokenize: {ms: 250, jitterMs: 0}})
    expect(() => buildSimConfig({stateDir: '/tmp/x', tokenizeMs: 'x'})).toThrow(/--tokenize-ms: /)
  })

  it(
    '--tokenize-ms: requests are tokenized one at a time, and until then their rid is unknown (an abort is ' +
      'dropped)',
    async () => {
      const q = new TokenizerQueue({ms: 40, jitterMs: 0})
      const t0 = Date.now()
      const done: number[] = []
      const all = ['a', 'b', 'c'].map(rid => q.tokenize(rid).then(() => done.push(Date.now() - t0)))
      expect(['a', 'b', 'c'].map(rid => q.unknown(rid))).toEqual([true, true, true])
      await all[0]
      expect(q.unknown('a')).toBe(false)
      expect(q.unknown('c')).toBe(true)
      await Promise.all(all)
      // In line: the third is known only after three tokenizations (timers may run late, never early).
      expect(done[2]!).toBeGreaterThanOrEqual(115)
      expect(q.unknown('c')).toBe(false)
      const off = new TokenizerQueue(undefined)
      await off.tokenize('x')
      expect(off.unknown('x')).toBe(false)
    },
  )
})
