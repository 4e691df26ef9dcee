import {describe, expect, it} from 'vitest'

import {renderRestart} from '../../src/report/restart-text.js'

describe('the co-restart text', () => {
  it('names each step by its role, or by its instance where the role has several', () => {
    const step = (service: 'prefill' | 'decode' | 'router', instance?: string) => ({
      service,
      ...(instance ? {instance} : {}),
      command: ['x'],
      exitCode: 0,
      commandMs: 1000,
      healthyAfterMs: 1500,
    })
    const text = renderRestart({
      steps: [
        step('prefill', 'services.prefill[0]'),
        step('prefill', 'services.prefill[1]'),
        step('decode'),
        step('router'),
      ],
      totalMs: 9000,
      canaries: [],
      watch: {samples: [], requests: []},
      verdicts: [],
      observations: [],
    })
    expect(text.split('\n').slice(0, 4)).toEqual([
      'prefill[0] restart ok in 1.00s, healthy after 1.50s',
      'prefill[1] restart ok in 1.00s, healthy after 1.50s',
      'decode     restart ok in 1.00s, healthy after 1.50s',
      'router     restart ok in 1.00s, healthy after 1.50s',
    ])
  })
})
