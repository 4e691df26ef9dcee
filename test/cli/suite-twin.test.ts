import {describe, expect, it} from 'vitest'

import {suiteTwin} from '../../src/cli/sim-flags.js'
import type {PdError} from '../../src/errors.js'

/**
 * The twin `suite --sim` starts when none runs (README command 1): a short watchdog, and a gateway whose breaker
 * half-opens after 5 s (a fault's failed load may open it; the suite waits for it before its canaries, and 60 s of
 * that made the quick start take 90-200 s instead of under a minute).
 */
describe('the twin suite --sim starts', () => {
  it("has a 3 s watchdog polled every 0.5 s, a breaker open for 5 s, and decode's heartbeat at 2 s x 2", () => {
    const hb = {heartbeatIntervalS: 2, heartbeatMaxFailure: 2}
    expect(suiteTwin({sim: true})).toEqual({deadlineS: 3, pollS: 0.5, cbTimeoutS: 5, ...hb})
    expect(suiteTwin({sim: true, 'sim-deadline': '5', 'sim-poll': '1'})).toEqual({
      deadlineS: 5,
      pollS: 1,
      cbTimeoutS: 5,
      ...hb,
    })
  })

  it('refuses flags that cannot start a twin (exit 2, one line)', () => {
    const refused = (f: Parameters<typeof suiteTwin>[0]) => {
      try {
        suiteTwin(f)
      } catch (error) {
        return error as PdError
      }
      throw new Error('not refused')
    }
    expect(refused({sim: false, 'sim-deadline': '5'}).message).toBe('--sim-deadline applies only with --sim')
    expect(refused({sim: true, 'sim-deadline': '1', 'sim-poll': '5'}).exitCode).toBe(2)
  })
})
