import {describe, expect, it} from 'vitest'

import {watchdogRuleBreaks} from '../../src/engines/sglang/deployment/watchdog-rules.js'

describe('watchdogRuleBreaks: the watchdog contract rules in one place', () => {
  it('a contract within every bound breaks none', () => {
    expect(watchdogRuleBreaks({deadlineSeconds: 30, pollSeconds: 1})).toEqual([])
    expect(watchdogRuleBreaks({deadlineSeconds: 2, pollSeconds: 2})).toEqual([])
  })

  it('a poll longer than the deadline breaks poll <= deadline, naming both', () => {
    expect(watchdogRuleBreaks({deadlineSeconds: 2, pollSeconds: 5})).toEqual([
      {rule: 'poll-over-deadline', value: 5, limit: 2},
    ])
  })

  it('each bound, in the order a user fixes them; a field not given is not checked', () => {
    expect(watchdogRuleBreaks({deadlineSeconds: 0.01, pollSeconds: 0.001}).map(b => b.rule)).toEqual([
      'deadline-min',
      'poll-min',
    ])
    expect(watchdogRuleBreaks({deadlineSeconds: 5000, pollSeconds: 400}).map(b => b.rule)).toEqual([
      'deadline-max',
      'poll-max',
    ])
    expect(watchdogRuleBreaks({pollSeconds: 999_999})).toEqual([{rule: 'poll-max', value: 999_999, limit: 300}])
    expect(watchdogRuleBreaks({})).toEqual([])
  })

  it('a value that is not a number breaks the minimum', () => {
    expect(watchdogRuleBreaks({deadlineSeconds: Number.NaN}).map(b => b.rule)).toEqual(['deadline-min'])
  })
})
