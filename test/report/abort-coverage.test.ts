import {describe, expect, it} from 'vitest'

import {checkAborts} from '../../src/checks/abort.js'
import {runPassed, type ScenarioRun, type SuiteRun} from '../../src/model/run.js'
import {renderHtml} from '../../src/report/html.js'
import {renderInject} from '../../src/report/inject-text.js'
import {injectFields, runJournal} from '../../src/report/journal-fields.js'
import {renderJUnit} from '../../src/report/junit.js'
import {runRegistry} from '../../src/report/push.js'
import {renderSuite} from '../../src/report/suite-text.js'
import {evaluateGate} from '../../src/suite/gate.js'
import {GateSchema} from '../../src/suite/suite-file.js'
import {TimelineBuilder} from '../checks/synthetic.js'

/**
 * abort-mid-transfer's trials and coverage in every output: the journal's per-trial records, the text reports, JUnit,
 * the Pushgateway and the gate. The scenario is judged by the real check from a synthetic timeline: six trials swept
 * across a held window, each released 12 ms after its abort, with the widening filter having matched `packets`.
 */
function abortScenario(packets: number): ScenarioRun {
  const b = new TimelineBuilder()
  const rids = Array.from({length: 6}, (_, i) => `pdchaos-abort:L1:${String(i).padStart(3, '0')}`)
  const offsets = rids.map((_, i) => 46 + 160 * i)
  b.transferWindow(
    0,
    rids.map((rid, i) => ({rid, offsetMs: offsets[i]!})),
    {startMs: 46, endMs: 846},
  )
  rids.forEach((rid, i) => {
    const sent = 10 + 100 * i
    const detail =
      `{"error":{"message":"Prefill transfer failed for request rank=0 req.rid='${rid}' with ` +
      `exception KVTransferError(bootstrap_room=1): Aborted by AbortReq."}}`
    b.pin(
      rid,
      sent,
      {ms: sent + offsets[i]! + 12, status: 500, detail},
      {queue: 'inflight', kvPoll: 'Transferring'},
    ).abort(rid, sent + offsets[i]!)
  })
  const timeline = b.filterMatched(3000, packets).end(4000).build()
  const judged = checkAborts(timeline)
  return {
    name: 'abort-mid-transfer',
    kind: 'inject',
    fault: 'abort-mid-transfer',
    params: {trials: 6},
    startedAt: b.t0,
    finishedAt: b.t0 + 4000,
    verdicts: judged.verdicts,
    pins: [],
    aborts: judged.trials,
    ...(judged.coverage ? {abortCoverage: judged.coverage} : {}),
    leases: [],
    timeline,
    contract: timeline.contract,
    mechanism: 'abort-requests',
    description: '6 trial(s), aborts on prefill and decode at 46..846 ms after each request is sent',
  }
}

const suite = (s: ScenarioRun): SuiteRun => ({
  name: 'nightly',
  runId: 'r-abort',
  startedAt: s.startedAt,
  finishedAt: s.finishedAt,
  deployment: 'independent',
  scenarios: [s],
})

describe('abort trials in the run model and the journal', () => {
  it(
    'the journal names each trial: rid, times, the state aimed at, the bounds, landing, verdict and evidence, and ' +
      'the coverage',
    () => {
      const run = suite(abortScenario(312))
      const j = JSON.parse(JSON.stringify(runJournal(run, 'inject', injectFields(run)))) as Record<string, any>
      expect(j.aborts).toHaveLength(6)
      const t0 = new TimelineBuilder().t0
      expect(j.aborts[1]).toMatchObject({
        rid: 'pdchaos-abort:L1:001',
        sentAt: t0 + 110,
        abortedAt: t0 + 316,
        offsetMs: 206,
        plannedOffsetMs: 206,
        releasedAt: t0 + 328,
        releaseStatus: 500,
        targeted: {queue: 'inflight', kvPoll: 'Transferring'},
        releasedFrom: 'inflight',
        inWindow: true,
        verdict: 'pass',
        outcome: 'honoured',
        bounds: {honourBySeconds: expect.any(Number), watchdog: [expect.any(Number), expect.any(Number)]},
        evidence: {summary: expect.stringMatching(/^abort honoured/), clock: "the request's own answer"},
      })
      expect(j.abortCoverage).toMatchObject({
        trials: 6,
        inWindow: 6,
        required: 3,
        verified: true,
        filterMatchedPackets: 312,
        window: {startMs: 46, endMs: 846, widening: 'packet-filter'},
        offsets: {plannedMs: [46, 206, 366, 526, 686, 846], firedMs: [46, 206, 366, 526, 686, 846]},
      })
      // The suite's shape carries the same records on the scenario.
      expect(j.scenarios[0].aborts).toEqual(j.aborts)
      expect(j.summary).toEqual({passed: 6, failed: 0})
    },
  )

  it('the text reports show the coverage next to the trials', () => {
    const s = abortScenario(312)
    const text = renderInject(s)
    expect(text).toMatch(
      /abort trials \(aimed at inflight\/Transferring; offsets after send\):\n {2}PASS pdchaos-abort:L1:000 {2}abort on prefill at 46\.0 ms \(planned 46\.0\) {2}released 0\.012s after it \(500, from inflight\) {2}honour by 0\.511s {2}in window {2}released by: prefill.s own abort/,
    )
    expect(text).toMatch(
      /^PASS aborts in window: 6\/6, filter matched 312 packets; aborts fired 46\.\.846 ms after send \(window 46\.\.846 ms, held open by the widening\)$/m,
    )
    expect(renderSuite(suite(s), {wallMs: 5000})).toMatch(
      /PASS {2}abort-mid-transfer: 6\/6 checks passed, aborts in window: 6\/6, filter matched 312 packets\n/,
    )
  })

  it(
    'six fast releases while the filter matched 0 packets: every output says unverified, with why and how to ' +
      'verify',
    () => {
      const run = suite(abortScenario(0))
      const s = run.scenarios[0]!
      const inject = renderInject(s)
      expect(inject).toMatch(/^UNVR aborts in window: 0\/6, filter matched 0 packets/m)
      expect(inject).toMatch(/ {5}unverified: the widening filter matched 0 packets while in place/)
      expect(inject).toMatch(/ {5}to verify: make the widening hold the KV data path/)
      expect(inject).toMatch(/0 passed, 0 failed, 6 unverified$/)
      const text = renderSuite(run, {wallMs: 5000})
      expect(text).toMatch(
        /UNVR {2}abort-mid-transfer: 0\/6 checks passed, 6 unverified, aborts in window: 0\/6, filter matched 0 packets \(at least 3 needed: aborts unverified\)/,
      )
      expect(text).toMatch(
        /unverified checks[\s\S]*abort \[abort-mid-transfer\] pdchaos-abort:L1:000: abort honoured.*not counted: the widening filter matched 0 packets.*; to verify: make the widening hold/,
      )
      expect(renderJUnit(run).match(/<skipped message="unverified: abort honoured/g)).toHaveLength(6)
      expect(renderHtml(run)).toContain('aborts in window: 0/6, filter matched 0 packets')

      const metrics = runRegistry(run).registry.getMetricsAsJSON()
      const value = (name: string) => metrics.then(all => all.find(m => m.name === name)?.values.map(v => v.value))
      return Promise.all([
        value('pdchaos_abort_trials_in_window'),
        value('pdchaos_abort_filter_matched_packets'),
        value('pdchaos_check_passed'),
      ]).then(([inWindow, packets, passed]) => {
        expect(inWindow).toEqual([0])
        expect(packets).toEqual([0])
        expect(passed).toEqual(Array(6).fill(0))
      })
    },
  )

  it('an unverified abort does not fail a run by default; a gate that names the abort check blocks it', () => {
    const run = suite(abortScenario(0))
    expect(runPassed(run)).toBe(true)
    const gate = evaluateGate(run, GateSchema.parse({unverifiedBlocks: ['eviction', 'abort']}))
    expect(gate.passed).toBe(false)
    expect(gate.reasons.join('\n')).toMatch(/UNVERIFIED abort .*filter matched 0 packets/)
  })
})
