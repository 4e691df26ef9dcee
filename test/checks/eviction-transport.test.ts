import {describe, expect, it} from 'vitest'

import {checkEvictions} from '../../src/checks/eviction.js'
import type {StallExpectation} from '../../src/checks/expectation.js'
import {checkRecovery} from '../../src/checks/recovery.js'
import {releaseCauseOf} from '../../src/checks/release-cause.js'
import {TimelineBuilder, TIMEOUTS_READ} from './synthetic.js'

/** The answer's detail as the recorder keeps it: the JSON body, cut at 200 characters. */
const body = (message: string) => JSON.stringify({error: {message, code: 500}}).slice(0, 200)

/** SGLang's handle_inflight_transfer_failure text (prefill.py), with the backend's reason. */
const sglang = (reason: string, rank = 0) =>
  `Prefill transfer failed for request rank=${rank} req.rid='p1' req.bootstrap_room=77 with exception ` +
  `KVTransferError(bootstrap_room=77): ${reason}`
/** The twin's: the same sentence, its rail NIC's UCX error as the reason. */
const twinTransport =
  "Prefill transfer failed for request rank=2 req.rid='p1' req.bootstrap_room=77 with exception NIXL transfer " +
  'encountered ERR room=77: transport error (UCX Endpoint timeout: Transport retry count exceeded on rail2:1/RoCE)'
const twinWatchdog =
  'Request p1 evicted by the disaggregation watchdog after 2.104s in the inflight queue (Transferring)'

const inflight = {queue: 'inflight' as const, kvPoll: 'Transferring' as const}
const EXPECTED: StallExpectation = {
  kind: 'stall',
  outcome: 'transport-error',
  afterSeconds: 8.59,
  afterSecondsRange: [7.516, 8.59],
  deadlineSeconds: 60,
  limits:
    'rc_mlx5: timeout 1.0s (UCX default) -> QP ACK timeout 1.07 s, retry count 7 (UCX default), read from prefill TP1',
  raise: ['UCX_RC_MLX5_TIMEOUT', 'UCX_RC_TIMEOUT', 'UCX_RC_MLX5_RETRY_COUNT', 'UCX_RC_RETRY_COUNT'],
  why: 'test',
}

// Deadline 2 s, poll 0.5 s: the window is [1.995 s, 2.511 s] after send (scope all, bootstrap entry = send).
const run = (detail: string, atMs: number, opts: {expected?: StallExpectation} = {}) =>
  checkEvictions(new TimelineBuilder().fault(0, 4000).pin('p1', 0, {ms: atMs, status: 500, detail}, inflight).build(), {
    ...TIMEOUTS_READ,
    ...opts,
  })

describe('a pin released by a transport error: inconclusive, not a watchdog verdict', () => {
  it("SGLang's text (NIXL ERR) before the window: unverified, saying why and which settings to raise", () => {
    const {verdicts, pins} = run(body(sglang('NIXL transfer encountered ERR room=77')), 1000)
    expect(verdicts).toHaveLength(1)
    expect(verdicts[0]).toMatchObject({
      check: 'eviction',
      verdict: 'unverified',
      summary: 'released by a transport error after 1.000s; the watchdog was not exercised',
    })
    expect(String(verdicts[0]!.evidence.why)).toMatch(
      /the pin's answer says the transfer failed \(.*NIXL transfer encountered ERR.*\), not that the watchdog evicted it: it left before the deadline window/,
    )
    expect(String(verdicts[0]!.evidence.toVerify)).toMatch(
      /UCX_RC_MLX5_TIMEOUT \/ UCX_RC_TIMEOUT and UCX_RC_RETRY_COUNT/,
    )
    expect(verdicts[0]!.evidence).toMatchObject({releasedBy: 'transport-error', status: 500})
    expect(pins[0]).toMatchObject({rid: 'p1', verdict: 'unverified', evictionSeconds: 1})
  })

  it("with the plan's expectation the toVerify names the rank's limits and the settings to raise", () => {
    const {verdicts} = run(body(twinTransport), 1200, {expected: EXPECTED})
    expect(verdicts[0]!.verdict).toBe('unverified')
    expect(String(verdicts[0]!.evidence.toVerify)).toMatch(
      /^raise UCX_RC_MLX5_TIMEOUT \/ UCX_RC_TIMEOUT \/ UCX_RC_MLX5_RETRY_COUNT \/ UCX_RC_RETRY_COUNT so that a stall outlasts the watchdog deadline \(60 s\) \(now rc_mlx5: .*the transport gives up after about 8\.59 s\)/,
    )
    expect(verdicts[0]!.evidence).toMatchObject({
      expectedOutcome: 'transport-error',
      transportGivesUpAfterSeconds: 8.59,
    })
  })

  it(
    "the twin's full text with a real rid and room, cut at 200 characters as the recorder keeps it, still names " +
      'the transport',
    () => {
      const real =
        `Prefill transfer failed for request rank=1 req.rid='pdchaos-pin-m3x1q2ab-0123456789ab' ` +
        `req.bootstrap_room=9187201950435737471 with exception NIXL transfer encountered ERR ` +
        `room=9187201950435737471: transport error (UCX Endpoint timeout: Transport retry count exceeded on ` +
        `rail1:1/RoCE (synd 0x15 vend 0x81 hw_synd 0/0): RC QP 0x1a2b3c to 198.18.5.1:4791, psn 12 unacknowledged ` +
        `after 8 transmissions)`
      expect(body(real)).toHaveLength(200)
      expect(releaseCauseOf(body(real)).cause).toBe('transport-error')
      expect(run(body(real), 2300).verdicts[0]!.verdict).toBe('unverified')
    },
  )

  it(
    "the twin's transport text and Mooncake's are transport errors too; inside the window it is still not an " +
      'eviction',
    () => {
      expect(run(body(twinTransport), 900).verdicts[0]!.verdict).toBe('unverified')
      expect(run(body(sglang('Failed to send kv chunk of 77 to 10.0.0.2:17000')), 900).verdicts[0]!.verdict).toBe(
        'unverified',
      )
      const inside = run(body(twinTransport), 2300)
      expect(inside.verdicts[0]).toMatchObject({
        verdict: 'unverified',
        summary: expect.stringContaining('inside the deadline window; the watchdog was not exercised'),
      })
    },
  )

  it(
    'a transfer failure whose reason came from another rank ("KV transfer failed"): unverified before the window; ' +
      'inside it a pass only with every other path excluded',
    () => {
      const propagated = body(sglang('KV transfer failed'))
      expect(run(propagated, 800).verdicts[0]).toMatchObject({
        verdict: 'unverified',
        summary: expect.stringContaining('released by a KV transfer failure (its reason not stated'),
      })
      // Decode's waiting timeout read at 300 s: it cannot have fired by 2.3 s, so the release is the watchdog's, by
      // exclusion.
      expect(run(propagated, 2300).verdicts[0]).toMatchObject({
        verdict: 'pass',
        evidence: expect.objectContaining({releasePath: expect.objectContaining({path: 'excluded'})}),
      })
    },
  )

  it(
    "keeps every other behaviour: the watchdog's own text passes in the window, a late transport error fails, an " +
      'early abort fails',
    () => {
      expect(run(body(twinWatchdog), 2300).verdicts[0]).toMatchObject({
        verdict: 'pass',
        evidence: expect.objectContaining({releasedBy: 'watchdog'}),
      })
      expect(run(body(twinWatchdog), 1000).verdicts[0]).toMatchObject({
        verdict: 'fail',
        summary: expect.stringMatching(/evicted early/),
      })
      expect(run(body(twinTransport), 3500).verdicts[0]).toMatchObject({
        verdict: 'fail',
        summary: expect.stringMatching(/evicted late/),
        evidence: expect.objectContaining({releasedBy: 'transport-error'}),
      })
      expect(run(body(sglang('Aborted by AbortReq.')), 500).verdicts[0]).toMatchObject({
        verdict: 'fail',
        summary: expect.stringMatching(/evicted early/),
      })
      // No text at all: as before where SGLang's own timeouts were read (none could have fired by then)...
      expect(
        checkEvictions(
          new TimelineBuilder().fault(0, 3000).pin('p1', 0, {ms: 1000, status: 500}).build(),
          TIMEOUTS_READ,
        ).verdicts[0]!.verdict,
      ).toBe('fail')
      // ...and unverified where nothing was read: a timeout that early cannot be excluded.
      expect(
        checkEvictions(new TimelineBuilder().fault(0, 3000).pin('p1', 0, {ms: 1000, status: 500}).build()).verdicts[0]!
          .verdict,
      ).toBe('unverified')
    },
  )
})

describe('release cause from the error text', () => {
  it("names the watchdog, an abort, SGLang's timeouts, transport errors and unexplained transfer failures", () => {
    expect(releaseCauseOf(twinWatchdog).cause).toBe('watchdog')
    expect(releaseCauseOf(sglang('Request 77 evicted by the watchdog after 60.1s')).cause).toBe('watchdog')
    expect(releaseCauseOf(sglang('Aborted by AbortReq.')).cause).toBe('abort')
    expect(releaseCauseOf(sglang('Request 77 timed out after 300.0s in KVPoll.Bootstrapping')).cause).toBe(
      'bootstrap-timeout',
    )
    for (const reason of [
      'NIXL transfer encountered ERR room=77',
      'Failed to send kv chunk of 77 to 10.0.0.2:17000',
      'KVSender failed to post transfer',
      'UCX ERROR Transport retry count exceeded on mlx5_3:1/RoCE',
      'UCS_ERR_ENDPOINT_TIMEOUT',
    ]) {
      expect(releaseCauseOf(sglang(reason)).cause).toBe('transport-error')
    }
    expect(releaseCauseOf(twinTransport)).toMatchObject({
      cause: 'transport-error',
      evidence: expect.stringContaining('NIXL transfer encountered ERR'),
    })
    expect(releaseCauseOf(sglang('KV transfer failed')).cause).toBe('transfer-failed')
    // Cut at 200 characters before the reason: still a transfer failure, never a watchdog verdict.
    expect(releaseCauseOf(body(sglang('NIXL transfer encountered ERR room=77'))).cause).toMatch(
      /transport-error|transfer-failed/,
    )
    expect(releaseCauseOf(undefined)).toEqual({cause: 'unknown', evidence: 'the answer carried no error text'})
    expect(releaseCauseOf('{"error":"boom"}').cause).toBe('unknown')
  })
})

describe('recovery counters after transport errors', () => {
  it(
    "the watchdog's counter is not expected to move for pins a transport error released (their own " + 'counter did)',
    () => {
      const w = 'sglang:num_watchdog_evicted_reqs_total'
      const b = new TimelineBuilder()
        .fault(0, 4000)
        .pin('p1', 0, {ms: 900, status: 500, detail: body(twinTransport)}, inflight)
        .pin('p2', 10, {ms: 2300, status: 500, detail: body(twinWatchdog)}, inflight)
        .metric('prefill', w, -10, 4)
        .metric('prefill', w, 5000, 5)
      const counters = checkRecovery(b.build()).find(v => v.subject === 'counters')!
      expect(counters).toMatchObject({
        verdict: 'pass',
        evidence: expect.objectContaining({failedRequests: 1, releasedByOtherCauses: 1}),
      })
      // With every failure counter in the list, each failed request counts again.
      const all = checkRecovery(b.build(), {failureCounters: [w, 'sglang:num_transfer_failed_reqs_total']}).find(
        v => v.subject === 'counters',
      )
      // The transfer counter was not sampled: the balance is unverified, naming it (never silently skipped).
      expect(all).toMatchObject({
        verdict: 'unverified',
        summary: expect.stringMatching(/does not export sglang:num_transfer_failed_reqs_total$/),
      })
    },
  )
})
