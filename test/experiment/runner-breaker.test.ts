import {describe, expect, it, type TestContext} from 'vitest'

import {type BatchSettings, runBatch} from '../../src/experiment/batch.js'
import type {ScenarioRun} from '../../src/model/run.js'
import type {Observation} from '../../src/model/timeline.js'
import {fakeTarget, stateDirs, type FakePd, type FakeOptions, SeededSession} from './fake-deployment.js'

/**
 * The gateway's circuit breaker around the recovery, through the runner against a scripted deployment whose gateway
 * has one (FakeOptions.breaker). Its own file: these runs keep a steady load going, and in the same process as
 * runner.test.ts's timing checks they widened the observation delay there.
 */

const WATCHDOG = {deadlineSeconds: 0.6, pollSeconds: 1.0}
const ON_TIME_MS = 630
const nextStateDir = stateDirs('pdchaos-runner-breaker-')

async function run(
  ctx: TestContext,
  opts: FakeOptions,
  over: Partial<BatchSettings>,
): Promise<{s: ScenarioRun; fake: FakePd}> {
  const stateDir = nextStateDir()
  const {fake, host} = await fakeTarget(ctx, stateDir, opts)
  const session = new SeededSession(fake.deployment(stateDir, WATCHDOG), host, fake.discovery())
  const settings: BatchSettings = {
    mode: 'run',
    promptTokens: 16,
    loadIntervalMs: 0,
    canaries: 1,
    pinPacing: {burst: 1, gapMs: 10},
    paramsSource: 'flags',
    planErrors: 'throw',
    say: () => {},
    ...over,
  }
  const {
    scenarios: [s],
  } = await runBatch(
    session,
    [{name: 'dd', fault: 'drop-dest-info', params: {mechanism: 'twin-failpoint'}, pins: 1}],
    settings,
  )
  return {s: s!, fake}
}

const failed = (s: ScenarioRun): string[] =>
  s.verdicts.filter(v => v.verdict === 'fail').map(v => `${v.check} ${v.subject}: ${v.summary}`)
const recovery = (s: ScenarioRun, subject: string) =>
  s.verdicts.find(v => v.check === 'recovery' && v.subject === subject)

describe.concurrent('the gateway breaker around the recovery', {timeout: 30_000}, () => {
  it(
    'a breaker that opens only as the held requests end (after the revert): waited for before the canaries; the ' +
      "load it refuses is the fault's reach, not collateral (ci14)",
    async ctx => {
      // The cleanup aborts the load the fault still holds; the gateway counts those attempts only as they end, 300 ms
      // later. One read of the breaker right after the aborts saw it closed, and the load it then refused was judged
      // collateral on a correct deployment. The pin is evicted on time; the held load waits for the cleanup.
      const {s, fake} = await run(
        ctx,
        {evictAfterMs: (_, routed) => (routed ? null : ON_TIME_MS), breaker: {threshold: 2, lagMs: 300, openMs: 1500}},
        {loadIntervalMs: 100},
      )
      expect(s.error).toBeUndefined()
      expect(fake.breakerOpenings, 'the fake breaker never opened: the test proves nothing').toHaveLength(1)
      expect(failed(s)).toEqual([])
      expect(recovery(s, 'router circuit breaker')).toMatchObject({verdict: 'pass'})
      // The canaries went out after the breaker closed.
      const obs = s.timeline!.observations as Observation[]
      const canary = obs.find(o => o.kind === 'request-sent' && o.role === 'canary')!
      const closedAt = obs.find(o => o.kind === 'marker' && o.name === 'router-breaker-closed')!
      expect(canary.t).toBeGreaterThanOrEqual(closedAt.t)
    },
  )

  it(
    'a breaker that opens as the canaries arrive (traffic pdchaos does not see): the refused canaries are sent ' +
      'again once it closed, and judged on that round',
    async ctx => {
      const {s, fake} = await run(
        ctx,
        {evictAfterMs: ON_TIME_MS, breaker: {threshold: 1000, lagMs: 0, openMs: 1200, opensAtRid: /^pdchaos-canary-/}},
        {canaries: 2},
      )
      expect(s.error).toBeUndefined()
      expect(fake.breakerOpenings).toHaveLength(1)
      expect(failed(s)).toEqual([])
      const requests = recovery(s, 'requests')!
      expect(requests).toMatchObject({
        verdict: 'pass',
        summary: expect.stringMatching(
          /2 of 2 requests after the revert succeeded, sent again once the circuit breaker/,
        ),
      })
      expect((requests.evidence as {refusedByOpenBreaker: unknown[]}).refusedByOpenBreaker).toHaveLength(2)
      expect(s.timeline!.observations.filter(o => o.kind === 'request-sent' && o.role === 'canary')).toHaveLength(4)
    },
  )
})
