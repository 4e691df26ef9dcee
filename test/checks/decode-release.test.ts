import {describe, expect, it} from 'vitest'

import {checkDecodeRelease, type DecodeReleaseExpectation, releasePath} from '../../src/checks/decode-release.js'
import {LOADS_DECODE_TRANSFER_QUEUE} from '../../src/engines/sglang/sglang-metrics.js'
import {TimelineBuilder} from './synthetic.js'

/** Decode's half of a pin, judged against decode's heartbeat bound (2 s × 2 here) from the kill. */

const X: DecodeReleaseExpectation = {
  kind: 'decode-release',
  cause: 'prefill killed (SIGKILL)',
  heartbeat: {intervalSeconds: 2, maxFailure: 2, boundSeconds: 4, source: "decode's environment"},
  waiting: {seconds: 300, source: "SGLang's default"},
  epsilonSeconds: 1,
  epsilonWhy: 'test',
  pins: 1,
  waitSeconds: 7,
  why: 'test',
}

const LOST =
  "Decode transfer failed for request rank=0 decode_req.req.rid='h1' decode_req.req.bootstrap_room=7 with " +
  'exception KVTransferError(bootstrap_room=7): Lost connection with prefill instance (bootstrap_addr: 10.0.0.1:8998)'
const TIMED_OUT =
  "Decode transfer failed for request rank=0 rid='h1' with exception KVTransferError(bootstrap_room=7): " +
  'Request 7 timed out after 300.0s in KVPoll.WaitingForInput'

/** A decode half sent at 0, held (decode's loads read 1 at 400 ms), prefill killed at 500 ms. */
function timeline(answer?: {ms: number; status: number; detail?: string}, cleanupMs?: number) {
  const b = new TimelineBuilder()
  b.observations.push({
    kind: 'request-sent',
    t: b.at(0),
    rid: 'h1',
    role: 'pin',
    fault: 'kill-prefill',
    path: 'decode-half',
  })
  b.metric('decode', LOADS_DECODE_TRANSFER_QUEUE, 400, 1)
  b.observations.push({
    kind: 'fault-injected',
    t: b.at(500),
    fault: 'kill-prefill',
    leaseId: 'L',
    verified: true,
    evidence: '',
  })
  if (cleanupMs !== undefined)
    b.observations.push({kind: 'marker', t: b.at(cleanupMs), name: 'cleanup-abort', detail: 'h1'})
  if (answer) b.observations.push({kind: 'request-answered', t: b.at(answer.ms), rid: 'h1', ...answer})
  return b.build()
}

describe('checkDecodeRelease', () => {
  it("passes a half decode's heartbeat released within interval × max failures + ε of the kill", () => {
    const [v] = checkDecodeRelease(timeline({ms: 500 + 4300, status: 500, detail: LOST}), X)
    expect(v?.verdict).toBe('pass')
    expect(v?.summary).toMatch(
      /released 4\.30 s after the kill \(500, heartbeat\): within decode's heartbeat bound 2 s × 2 = 4 s/,
    )
    expect(v?.evidence.path).toBe('heartbeat')
    expect(String(v?.evidence.heldBeforeKill)).toMatch(/read 1 at 0\.10 s before the kill/)
  })

  it('fails a half released past the bound, naming the path that released it (the waiting timeout)', () => {
    const [v] = checkDecodeRelease(timeline({ms: 500 + 6000, status: 500, detail: TIMED_OUT}), X)
    expect(v?.verdict).toBe('fail')
    expect(v?.summary).toMatch(/released 6\.00 s after the kill \(500, waiting timeout\): past .* \+ ε 1 s/)
  })

  it('fails a half still held when the window closed (pdchaos aborted it afterwards: not a release)', () => {
    const [v] = checkDecodeRelease(timeline({ms: 7600, status: 500, detail: 'Aborted by AbortReq.'}, 7510), X)
    expect(v?.verdict).toBe('fail')
    expect(v?.summary).toMatch(
      /decode still held its half 7\.01 s after the kill, past .*the waiting timeout would, after 300 s/,
    )
    expect(v?.evidence.state).toMatch(/WaitingForInput/)
  })

  it('is unverified, not failed, when pdchaos stopped watching before the bound + ε (its client gave up first)', () => {
    // The client abandoned the half 4 s after the kill (bound 4 s + ε 1 s): a release at 4.5 s would be unseen.
    const tl = timeline(undefined, 4800)
    tl.observations.push({kind: 'request-abandoned', t: tl.observations[0]!.t + 4500, rid: 'h1', detail: 'timeout'})
    tl.observations.sort((a, b) => a.t - b.t)
    const [v] = checkDecodeRelease(tl, X)
    expect(v?.verdict).toBe('unverified')
    expect(v?.summary).toMatch(/still held 4\.00 s after the kill, when pdchaos stopped watching/)
    expect(String(v?.evidence.toVerify)).toMatch(/watched .* until the bound \+ ε/)
  })

  it('is unverified when the answer names no path, or the bound is unknown, or decode answered before the kill', () => {
    const noPath = checkDecodeRelease(timeline({ms: 2000, status: 500, detail: 'Internal error'}), X)[0]
    expect(noPath?.verdict).toBe('unverified')
    expect(noPath?.summary).toMatch(/names no release path/)
    const {heartbeat: _, ...noBound} = X
    const unknown = checkDecodeRelease(timeline({ms: 4000, status: 500, detail: LOST}), noBound)[0]
    expect(unknown?.verdict).toBe('unverified')
    expect(unknown?.evidence.why).toMatch(/heartbeat settings were not read/)
    const early = checkDecodeRelease(timeline({ms: 300, status: 500, detail: LOST}), X)[0]
    expect(early?.verdict).toBe('unverified')
    expect(early?.summary).toMatch(/before the kill/)
    const never = checkDecodeRelease(timeline(), noBound)[0]
    expect(never?.verdict).toBe('unverified')
  })

  it('without a bound, a waiting-timeout release within the timeout of its send passes', () => {
    const {heartbeat: _, ...noBound} = X
    const x = {...noBound, waiting: {seconds: 5, source: 'env'}}
    const [v] = checkDecodeRelease(timeline({ms: 5400, status: 500, detail: TIMED_OUT}), x)
    expect(v?.verdict).toBe('pass')
    expect(v?.summary).toMatch(/within the waiting timeout 5 s/)
  })

  it("reads SGLang's words for each path", () => {
    expect(releasePath(LOST).path).toBe('heartbeat')
    expect(releasePath('Let room 7 be failed due to prefill down').path).toBe('heartbeat')
    expect(releasePath(TIMED_OUT).path).toBe('waiting-timeout')
    expect(releasePath('KVTransferError: Failed to get kvcache from prefill instance, it might be dead').path).toBe(
      'prefill-reported',
    )
    expect(releasePath('Aborted by AbortReq.').path).toBe('abort')
    expect(releasePath('something else').path).toBe('unknown')
  })
})
