import {describe, expect, it} from 'vitest'

import {checkEvictions} from '../../src/checks/eviction.js'
import {WATCHDOG_EVICTED_TOTAL} from '../../src/engines/sglang/sglang-metrics.js'
import type {CompetingTimeout} from '../../src/model/competing.js'
import {TimelineBuilder, TIMEOUTS_READ} from './synthetic.js'

/**
 * A pass needs positive evidence (issue 27): a release inside the window that nothing names passes only when every
 * other path that could release the pin there is excluded by settings read from the servers. The case that was passed
 * wrongly: decode's waiting timeout inside the window, the watchdog off, an answer that only says the transfer failed.
 */

// Deadline 2 s, poll 0.5 s: the window is [1.995 s, 2.511 s] after send.
const inflight = {queue: 'inflight' as const, kvPoll: 'Transferring' as const}
const UNEXPLAINED = 'Prefill transfer failed: transfer failed'
const WATCHDOG = 'Request p1 evicted by the disaggregation watchdog after 2.104s in the inflight queue (Transferring)'
const waiting = (seconds: number): CompetingTimeout => ({
  cause: 'waiting-timeout',
  name: "decode's waiting timeout",
  setting: 'SGLANG_DISAGGREGATION_WAITING_TIMEOUT',
  seconds,
  source: 'the environment of pid 4242 (decode scheduler TP0)',
  known: true,
})
const timeline = (detail: string, atMs = 2213, counter?: [number, number]) => {
  const b = new TimelineBuilder().fault(0, 4000).pin('p1', 0, {ms: atMs, status: 500, detail}, inflight)
  if (counter)
    b.metric('prefill', WATCHDOG_EVICTED_TOTAL, -100, counter[0]).metric(
      'prefill',
      WATCHDOG_EVICTED_TOTAL,
      atMs + 200,
      counter[1],
    )
  return b.build()
}

describe('the evidence rule for a pass', () => {
  it(
    "decode's waiting timeout inside the window, nothing naming the watchdog: unverified, naming the candidate " +
      'and what would decide it',
    () => {
      const {verdicts, pins} = checkEvictions(timeline(UNEXPLAINED), {competing: [waiting(2.2)], batchPins: 1})
      expect(verdicts[0]).toMatchObject({
        verdict: 'unverified',
        summary: expect.stringMatching(
          /inside \[1\.995s, 2\.511s\], by a path nothing names: it could be decode's waiting timeout/,
        ),
      })
      const e = verdicts[0]!.evidence
      expect(e.releasePath).toEqual({
        path: 'unknown',
        candidates: [
          expect.stringMatching(
            /SGLANG_DISAGGREGATION_WAITING_TIMEOUT = 2\.2 s, read from the environment of pid 4242/,
          ),
        ],
      })
      expect(String(e.toVerify)).toMatch(
        /logs:.*watchdog\.logPattern.*sglang:num_watchdog_evicted_reqs_total.*raise SGLANG_DISAGGREGATION_WAITING_TIMEOUT above 2\.511s/,
      )
      expect(pins[0]!.verdict).toBe('unverified')
    },
  )

  it("the watchdog's words in the answer name it: a pass, the path named", () => {
    const v = checkEvictions(timeline(WATCHDOG), {competing: [waiting(2.2)], batchPins: 1}).verdicts[0]!
    expect(v).toMatchObject({
      verdict: 'pass',
      evidence: expect.objectContaining({releasePath: expect.objectContaining({path: 'named'})}),
    })
  })

  it('the watchdog counter moving by every pin of the batch names it; by fewer, it does not', () => {
    const named = checkEvictions(timeline(UNEXPLAINED, 2213, [5, 7]), {competing: [waiting(2.2)], batchPins: 2})
      .verdicts[0]!
    expect(named).toMatchObject({
      verdict: 'pass',
      evidence: expect.objectContaining({
        releasePath: {path: 'named', by: expect.stringMatching(/\+2 from before the first pin/)},
      }),
    })
    const short = checkEvictions(timeline(UNEXPLAINED, 2213, [5, 6]), {competing: [waiting(2.2)], batchPins: 2})
      .verdicts[0]!
    expect(short.verdict).toBe('unverified')
  })

  it(
    'every other path excluded by the settings read (each fires after the window, or is not in force): a pass, ' +
      'saying so',
    () => {
      const notInForce: CompetingTimeout = {
        cause: 'bootstrap-timeout',
        name: "prefill's bootstrap timeout",
        setting: 'SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT',
        seconds: null,
        source: "not in force: SGLang 0.5.15's NIXL sender has no bootstrap timeout",
        known: true,
      }
      const v = checkEvictions(timeline(UNEXPLAINED), {competing: [waiting(300), notInForce], batchPins: 1})
        .verdicts[0]!
      expect(v.verdict).toBe('pass')
      expect(v.evidence.releasePath).toEqual({
        path: 'excluded',
        excluded: [
          expect.stringMatching(/waiting timeout 300 s .* cannot have fired by 2\.511s/),
          expect.stringMatching(/not in force/),
        ],
      })
    },
  )

  it("a default whose reader's environment was not read excludes nothing; neither does a run that read nothing", () => {
    const unread = {...waiting(300), source: "SGLang's default (decode's environment not read)", known: false}
    expect(checkEvictions(timeline(UNEXPLAINED), {competing: [unread], batchPins: 1}).verdicts[0]!.verdict).toBe(
      'unverified',
    )
    expect(checkEvictions(timeline(UNEXPLAINED)).verdicts[0]!.verdict).toBe('unverified')
  })

  it(
    'run with --allow-competing-timeout: a pin released inside the window is unverified by construction, even ' +
      'with the counter',
    () => {
      const v = checkEvictions(timeline(UNEXPLAINED, 2213, [5, 6]), {
        competing: [waiting(2.2)],
        competingAllowed: true,
        batchPins: 1,
      }).verdicts[0]!
      expect(v).toMatchObject({verdict: 'unverified'})
      expect(String(v.evidence.why)).toMatch(/--allow-competing-timeout/)
    },
  )

  it(
    'an unexplained release before the window is a false timeout only when no timeout could have fired ' + 'by then',
    () => {
      expect(checkEvictions(timeline('', 1000), TIMEOUTS_READ).verdicts[0]!.summary).toMatch(/evicted early/)
      const v = checkEvictions(timeline('', 1000), {competing: [waiting(0.9)]}).verdicts[0]!
      expect(v).toMatchObject({
        verdict: 'unverified',
        summary: expect.stringMatching(/before \[1\.995s, 2\.511s\].*decode's waiting timeout/),
      })
    },
  )
})
