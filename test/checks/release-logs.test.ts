import {describe, expect, it} from 'vitest'

import {checkEvictions} from '../../src/checks/eviction.js'
import {attributeRelease, releaseCauseOf} from '../../src/checks/release-cause.js'
import {DeploymentSchema, watchdogPatternError} from '../../src/deployment/config.js'
import type {Observation} from '../../src/model/timeline.js'
import {parseLogLines} from '../../src/workload/service-log.js'
import {TimelineBuilder} from './synthetic.js'

/** The pattern `sim up` writes for the twin's watchdog line (docs/twin.md, "Release causes"). */
const PATTERN = String.raw`watchdog evicted request rid='(?<rid>[^']+)'.* held=(?<held>[0-9.]+)s`
const ROOM = '4611686018427387913'
const body = (message: string) => JSON.stringify({error: {message, code: 500}})
/**
 * What SGLang's prefill says when decode's ABORT failed the room (nixl/conn.py, #30352), as its 500 and its log line.
 */
const prefillAbortedByDecode = (rid: string) =>
  `Prefill transfer failed for request rank=0 req.rid='${rid}' req.bootstrap_room=${ROOM} with exception ` +
  `KVTransferError(bootstrap_room=${ROOM}): Request ${ROOM} was aborted by decode.`
/** decode.py pop_transferred after _check_waiting_timeout (common/conn.py). */
const decodeTimedOut = (rid: string, s = '2.0') =>
  `[2026-12-01 18:00:03 TP0] Decode transfer failed for request rank=0 decode_req.req.rid='${rid}' ` +
  `decode_req.req.bootstrap_room=${ROOM} with exception KVTransferError(bootstrap_room=${ROOM}): Request ${ROOM} ` +
  `timed out after ${s}s in KVPoll.WaitingForInput`
const watchdogLine = (rid: string, held: string) =>
  `[2026-12-01 18:00:02] Disaggregation watchdog evicted request rid='${rid}' bootstrap_room=${ROOM} ` +
  `queue=inflight state=Transferring held=${held}s (deadline 2s, scope all)`

const inflight = {queue: 'inflight' as const, kvPoll: 'Transferring' as const}

function logs(
  b: TimelineBuilder,
  atMs: number,
  lines: Array<{service: 'prefill' | 'decode'; line: string}>,
  unread: Array<'prefill' | 'decode'> = [],
): TimelineBuilder {
  const rids = ['p1', 'p2']
  for (const service of ['prefill', 'decode'] as const) {
    const source = `file:/var/log/${service}.log`
    const mine = lines.filter(l => l.service === service)
    const parsed = parseLogLines(mine.map(l => `${l.line}\n`).join(''), rids, PATTERN)
    for (const p of parsed) b.observations.push({kind: 'log-line', t: b.at(atMs), service, source, ...p})
    const read: Observation = unread.includes(service)
      ? {
          kind: 'log-read',
          t: b.at(atMs),
          service,
          source,
          ok: false,
          lines: 0,
          truncated: false,
          detail: `cannot read /var/log/${service}.log on local: Permission denied`,
        }
      : {
          kind: 'log-read',
          t: b.at(atMs),
          service,
          source,
          ok: true,
          lines: parsed.length,
          truncated: false,
          detail: 'read',
        }
    b.observations.push(read)
  }
  return b
}

describe('service log lines', () => {
  it("keeps only the lines naming a pin, with the rid, and reads the watchdog line's rid and held seconds", () => {
    const text = [
      '[2026-12-01 18:00:00 TP0] Prefill batch. #new-seq: 1, #new-token: 128',
      `[2026-12-01 18:00:02 TP0] ${prefillAbortedByDecode('pdchaos-pin-a1')}`,
      watchdogLine('pdchaos-pin-b22', '2.104'),
      '',
    ].join('\n')
    const lines = parseLogLines(text, ['pdchaos-pin-a1', 'pdchaos-pin-b22'], PATTERN)
    expect(lines).toHaveLength(2)
    expect(lines[0]).toMatchObject({rid: 'pdchaos-pin-a1'})
    expect(lines[0]!.watchdog).toBeUndefined()
    expect(lines[1]).toMatchObject({rid: 'pdchaos-pin-b22', watchdog: {rid: 'pdchaos-pin-b22', heldSeconds: 2.104}})
  })

  it('names the longest rid when one rid is the prefix of another, and drops a last line the byte bound cut', () => {
    const lines = parseLogLines(`x req.rid='pin-10' y\nreq.rid='pin-1' cut he`, ['pin-1', 'pin-10'], undefined, true)
    expect(lines).toEqual([{line: "x req.rid='pin-10' y", rid: 'pin-10'}])
  })

  it('the deployment file refuses a watchdog pattern that does not compile or lacks its named groups', () => {
    expect(watchdogPatternError(PATTERN)).toBeUndefined()
    expect(watchdogPatternError('rid=(?<rid>\\S+)')).toMatch(/named group \(\?<held>…\)/)
    expect(watchdogPatternError('(?<rid>[')).toMatch(/not a valid regular expression/)
    const file = (logPattern: string) =>
      DeploymentSchema.safeParse({
        host: {kind: 'local'},
        services: {prefill: {url: 'http://h:1'}, decode: {url: 'http://h:2'}, router: {url: 'http://h:3'}},
        watchdog: {deadlineSeconds: 2, pollSeconds: 0.5, logPattern},
      })
    expect(file(PATTERN).success).toBe(true)
    expect(file('held=(?<held>\\d+)').error?.issues[0]?.message).toMatch(/\(\?<rid>…\)/)
  })
})

describe('what released a pin', () => {
  it(
    "prefill's words for decode's ABORT are decode letting go; decode's own line says it was its waiting " + 'timeout',
    () => {
      expect(releaseCauseOf(body(prefillAbortedByDecode('p1'))).cause).toBe('decode-abort')
      expect(releaseCauseOf('Aborted by decode-side abort notification.').cause).toBe('decode-abort')
      expect(releaseCauseOf(decodeTimedOut('p1')).cause).toBe('waiting-timeout')
      expect(
        releaseCauseOf('Lost connection with prefill instance (bootstrap_addr: 10.0.0.1:8998), 3 requests affected')
          .cause,
      ).toBe('heartbeat')
      const b = logs(
        new TimelineBuilder()
          .fault(0, 4000)
          .pin('p1', 0, {ms: 2100, status: 500, detail: body(prefillAbortedByDecode('p1'))}, inflight),
        4100,
        [
          {service: 'prefill', line: `[2026-12-01 18:00:03 TP0] ${prefillAbortedByDecode('p1')}`},
          {service: 'decode', line: decodeTimedOut('p1')},
        ],
      )
      b.metric('decode', 'sglang:num_transfer_failed_reqs_total', 1500, 0).metric(
        'decode',
        'sglang:num_transfer_failed_reqs_total',
        2500,
        1,
      )
      const a = attributeRelease(b.build(), 'p1', {t: b.at(2100), detail: body(prefillAbortedByDecode('p1'))})
      expect(a.cause).toBe('waiting-timeout')
      expect(a.logsUnread).toEqual([])
      expect(a.evidence.join('\n')).toMatch(
        /decode log \(file:\/var\/log\/decode.log\): ".*timed out after 2.0s in KVPoll.WaitingForInput"/,
      )
      expect(a.evidence.join('\n')).toMatch(/decode sglang:num_transfer_failed_reqs_total \+1 between/)
    },
  )

  it("a release by decode's waiting timeout inside the window is reported as such, never a watchdog pass", () => {
    const b = logs(
      new TimelineBuilder()
        .fault(0, 4000)
        .pin('p1', 0, {ms: 2300, status: 500, detail: body(prefillAbortedByDecode('p1'))}, inflight),
      4100,
      [{service: 'decode', line: decodeTimedOut('p1', '2.3')}],
    )
    const {verdicts, pins} = checkEvictions(b.build())
    expect(verdicts[0]).toMatchObject({
      verdict: 'unverified',
      summary: expect.stringMatching(
        /^released by decode's waiting timeout .* after 2\.300s, inside the deadline window: not a watchdog eviction/,
      ),
    })
    expect(verdicts[0]!.evidence).toMatchObject({releasedBy: 'waiting-timeout'})
    expect(String(verdicts[0]!.evidence.toVerify)).toMatch(
      /raise SGLANG_DISAGGREGATION_WAITING_TIMEOUT in decode's environment above .* \(2\.5 s\)/,
    )
    expect(pins[0]!.verdict).toBe('unverified')
  })

  it(
    "without decode's log it is still decode letting go, not the watchdog, and the evidence says the log could " +
      'not be read',
    () => {
      const b = logs(
        new TimelineBuilder()
          .fault(0, 4000)
          .pin('p1', 0, {ms: 2300, status: 500, detail: body(prefillAbortedByDecode('p1'))}, inflight),
        4100,
        [],
        ['decode'],
      )
      const v = checkEvictions(b.build()).verdicts[0]!
      expect(v).toMatchObject({verdict: 'unverified', evidence: expect.objectContaining({releasedBy: 'decode-abort'})})
      expect(v.evidence.logsUnread).toEqual([
        "decode's log could not be read: cannot read /var/log/decode.log on local: Permission denied",
      ])
      expect(String(v.evidence.releaseEvidence)).toMatch(/decode's reason unknown: decode's log could not be read/)
    },
  )

  it('the answer alone, with no log read at all, says which logs were not read', () => {
    const a = attributeRelease(new TimelineBuilder().pin('p1', 0, {ms: 2300, status: 500}).build(), 'p1', {t: 0})
    expect(a).toMatchObject({cause: 'unknown', logsUnread: ["prefill's log was not read", "decode's log was not read"]})
  })

  it('an unexplained transfer failure whose prefill line names the reason takes that reason', () => {
    const detail = body(
      "Prefill transfer failed for request rank=0 req.rid='p1' req.bootstrap_room=7 with exception KV transfer failed",
    )
    const b = logs(new TimelineBuilder().fault(0, 4000).pin('p1', 0, {ms: 1000, status: 500, detail}, inflight), 4100, [
      {
        service: 'prefill',
        line:
          "[TP2] Prefill transfer failed for request rank=2 req.rid='p1' req.bootstrap_room=7 with exception " +
          'KVTransferError(bootstrap_room=7): Request 7 timed out after 1.0s in KVPoll.Bootstrapping',
      },
    ])
    expect(attributeRelease(b.build(), 'p1', {t: b.at(1000), detail}).cause).toBe('bootstrap-timeout')
  })
})

describe("the watchdog's own clock", () => {
  const wd = (held: string, answerMs: number) =>
    logs(
      new TimelineBuilder()
        .fault(0, 4000)
        .pin(
          'p1',
          0,
          {ms: answerMs, status: 500, detail: body('Request p1 evicted by the disaggregation watchdog after 2.1s')},
          inflight,
        ),
      4100,
      [{service: 'prefill', line: watchdogLine('p1', held)}],
    ).build()

  it('judges the held time the watchdog logged, and says that clock was used', () => {
    const v = checkEvictions(wd('2.104', 2150)).verdicts[0]!
    expect(v).toMatchObject({
      verdict: 'pass',
      summary: expect.stringMatching(/^evicted after 2\.104s by the watchdog's own clock/),
    })
    expect(v.evidence).toMatchObject({
      clock: "the watchdog's own log line (held time, the server's clock)",
      watchdogHeldSeconds: 2.104,
      releasedBy: 'watchdog',
    })
  })

  it(
    "a held time under the deadline is a false timeout, one past deadline + poll is late, whatever the answer's " +
      'delay',
    () => {
      expect(checkEvictions(wd('1.000', 2100)).verdicts[0]).toMatchObject({
        verdict: 'fail',
        summary: expect.stringMatching(/^evicted early: the watchdog held it 1\.000s by its own clock/),
      })
      expect(checkEvictions(wd('3.500', 3510)).verdicts[0]).toMatchObject({
        verdict: 'fail',
        summary: expect.stringMatching(/^evicted late: the watchdog held it 3\.500s/),
      })
    },
  )

  it('a held time longer than the request existed is not believed: the answer is the clock then', () => {
    const v = checkEvictions(wd('9.000', 2100)).verdicts[0]!
    expect(v.evidence.clock).toBe("the request's own answer")
    expect(v.verdict).toBe('pass')
  })
})
