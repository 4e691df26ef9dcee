import {describe, expect, it, type TestContext} from 'vitest'

import {type BatchSettings, runBatch} from '../../src/experiment/batch.js'
import type {FaultDiscovery} from '../../src/faults/fault.js'
import type {ScenarioRun, SuiteRun} from '../../src/model/run.js'
import type {Observation} from '../../src/model/timeline.js'
import {renderInject} from '../../src/report/inject-text.js'
import {injectFields, runJournal} from '../../src/report/journal-fields.js'
import {fakeTarget, stateDirs, type FakePd, type FakeOptions, SeededSession} from './fake-deployment.js'

/**
 * abort-mid-transfer through the one runner against the scripted deployment (fake-deployment.ts): the window the
 * trials aim at is recorded on the timeline, each trial is judged with its landing, and the journal carries every
 * trial and the coverage. A TCP data path makes the plan hold the window open with the twin's stall-kv failure point
 * (the unit tests' host has no packet filter), which holds every request the fake receives until an abort or its
 * scripted watchdog lets it go.
 */

// A deadline long enough that an honoured abort (at most 1 s into the window) is answered long before any eviction,
// even on a machine loaded by other test runs.
const WATCHDOG = {deadlineSeconds: 3, pollSeconds: 1.0}
const EVICT_MS = 3030
const nextStateDir = stateDirs('pdchaos-runner-aborts-')

/** A TCP data path (NIXL over UCX_TLS=tcp), so the plan widens the window; otherwise the fake's own (not TCP). */
const tcp = (d: FaultDiscovery): FaultDiscovery => ({
  ...d,
  transport: {backend: 'nixl', env: {UCX_TLS: 'tcp,self'}, source: 'fake deployment (test)'},
})

async function run(ctx: TestContext, opts: FakeOptions, widen: boolean): Promise<{s: ScenarioRun; fake: FakePd}> {
  const stateDir = nextStateDir()
  const {fake, host} = await fakeTarget(ctx, stateDir, opts)
  const discovery = widen ? tcp(fake.discovery()) : fake.discovery()
  const session = new SeededSession(fake.deployment(stateDir, WATCHDOG), host, discovery)
  const settings: BatchSettings = {
    mode: 'run',
    promptTokens: 16,
    loadIntervalMs: 0,
    canaries: 1,
    pinPacing: {burst: 1, gapMs: 10},
    paramsSource: 'flags',
    planErrors: 'throw',
    say: () => {},
  }
  const {
    scenarios: [s],
  } = await runBatch(session, [{name: 'abort', fault: 'abort-mid-transfer', params: {trials: 4}, pins: 4}], settings)
  return {s: s!, fake}
}

const suiteOf = (s: ScenarioRun): SuiteRun => ({
  name: 'inject',
  startedAt: s.startedAt,
  finishedAt: s.finishedAt,
  deployment: 'fake-pd',
  scenarios: [s],
})
const abortVerdicts = (s: ScenarioRun) =>
  s.verdicts.filter(v => v.check === 'abort').map(v => `${v.verdict}: ${v.summary}`)

describe.concurrent('abort-mid-transfer through the runner', {timeout: 30_000}, () => {
  it(
    'a held window, aborts honoured: every trial lands and passes, and the journal holds each trial and the ' +
      'coverage',
    async ctx => {
      const {s, fake} = await run(ctx, {evictAfterMs: EVICT_MS}, true)
      expect(s.error).toBeUndefined()
      expect(s.description).toMatch(/window held open by the twin's own failure point stall-kv on prefill TP0/)
      const window = s.timeline!.observations.find(
        (o): o is Extract<Observation, {kind: 'transfer-window'}> => o.kind === 'transfer-window',
      )
      expect(window).toMatchObject({scenario: 'abort', widening: 'twin-failpoint', trials: expect.any(Array)})
      expect(window!.trials).toHaveLength(4)
      expect(
        abortVerdicts(s).every(v => v.startsWith('pass: abort honoured')),
        abortVerdicts(s).join('\n'),
      ).toBe(true)
      expect(fake.aborted.sort()).toEqual(window!.trials.map(t => t.rid).sort())

      const j = JSON.parse(JSON.stringify(runJournal(suiteOf(s), 'inject', injectFields(suiteOf(s))))) as Record<
        string,
        any
      >
      expect(j.aborts).toHaveLength(4)
      for (const [i, t] of (j.aborts as Array<Record<string, any>>).entries()) {
        expect(t).toMatchObject({
          rid: window!.trials[i]!.rid,
          fault: 'abort-mid-transfer',
          targeted: {queue: 'inflight', kvPoll: 'Transferring'},
          inWindow: true,
          verdict: 'pass',
          outcome: 'honoured',
        })
        expect(t.abortedAt).toBeGreaterThan(t.sentAt)
        expect(t.releasedAt).toBeGreaterThanOrEqual(t.abortedAt)
        expect(t.plannedOffsetMs).toBe(window!.trials[i]!.offsetMs)
        // A busy machine fires timers late, never early.
        expect(t.offsetMs).toBeGreaterThanOrEqual(t.plannedOffsetMs - 1)
        expect(t.bounds.honourBySeconds).toBeGreaterThanOrEqual(WATCHDOG.pollSeconds)
      }
      expect(j.abortCoverage).toMatchObject({
        trials: 4,
        inWindow: 4,
        required: 2,
        verified: true,
        filterMatchedPackets: null,
        window: {widening: 'twin-failpoint'},
      })
      expect(renderInject(s)).toMatch(/^PASS aborts in window: 4\/4, window held by the twin's failure point/m)
    },
  )

  it(
    'a held window and a target that ignores the abort: each trial fails as a lost abort, and the watchdog gets ' +
      'its own pass',
    async ctx => {
      const {s} = await run(ctx, {evictAfterMs: EVICT_MS, prefillIgnoresAborts: true}, true)
      expect(abortVerdicts(s)).toHaveLength(4)
      // Lost (or, where a loaded host's ε swallows the seconds between abort and eviction, not shown either way): never
      // honoured. The fake's watchdog counts from its receipt of the request, and its answer shares this process's
      // event loop: on a loaded machine the answer can come late enough that entry before the abort is not shown.
      expect(
        abortVerdicts(s).every(v =>
          /^(fail: abort lost; released by the watchdog|unverified: (abort not shown lost; )?released by the watchdog)/.test(
            v,
          ),
        ),
        abortVerdicts(s).join('\n'),
      ).toBe(true)
      expect(s.verdicts.filter(v => v.check === 'eviction' && v.verdict === 'pass')).toHaveLength(4)
      expect(
        s.aborts!.every(t => ['lost-then-evicted', 'raced', 'not-landed', 'entry-unknown'].includes(t.outcome)),
      ).toBe(true)
      // A lost trial counts once its entry before the abort is shown: the watchdog's own count says so (or cannot).
      const lost = s.aborts!.filter(t => t.outcome === 'lost-then-evicted')
      expect(
        lost.every(
          t => t.entry?.shown === 'before' && t.entry.source === 'watchdog' && t.releasedBy?.path === 'watchdog',
        ),
      ).toBe(true)
      expect(
        s.abortCoverage!.inWindow +
          s.aborts!.filter(t => t.outcome === 'not-landed' || t.outcome === 'entry-unknown').length,
      ).toBe(4)
    },
  )

  it(
    'a window nothing holds open: every request completes (200), so no abort passes (unverified, ' + 'with why)',
    async ctx => {
      const {s} = await run(ctx, {evictAfterMs: EVICT_MS}, false)
      expect(s.error).toBeUndefined()
      expect(abortVerdicts(s)).toHaveLength(4)
      // Before or after its abort (a loaded machine answers late), a completed request shows no abort meeting a
      // transfer.
      expect(
        abortVerdicts(s).every(v => /^unverified: completed (before|with 200)/.test(v)),
        abortVerdicts(s).join('\n'),
      ).toBe(true)
      expect(s.abortCoverage).toMatchObject({trials: 4, inWindow: 0, verified: false, window: {widening: 'none'}})
      expect(s.abortCoverage!.why).toMatch(/^only 0 of 4 aborts landed in the transfer window \(at least 2 needed\): /)
      expect(s.abortCoverage!.toVerify).toMatch(/widen the window/)
      expect(renderInject(s)).toMatch(/^UNVR aborts in window: 0\/4, window not widened/m)
    },
  )
})
