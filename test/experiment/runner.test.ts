import {existsSync, readdirSync, readFileSync} from 'node:fs'
import {join} from 'node:path'
import {describe, expect, it, type TestContext, vi} from 'vitest'

import {PdError} from '../../src/errors.js'
import {type BatchScenario, type BatchSettings, runBatch} from '../../src/experiment/batch.js'
import {type Entry, judgeBatch, viewFor} from '../../src/experiment/judge.js'
import {RunSession} from '../../src/experiment/session.js'
import {dropDestInfo as dropDestInfoFault} from '../../src/faults/drop-dest-info.js'
import {listLeases, revertLease} from '../../src/faults/lease/lease.js'
import {parseFaultParams} from '../../src/faults/params.js'
import type {LeaseRecord, ScenarioRun, SuiteRun} from '../../src/model/run.js'
import type {Observation, Timeline} from '../../src/model/timeline.js'
import type {Verdict} from '../../src/model/verdict.js'
import {sglangTimeoutsOf} from '../../src/engines/sglang/discovery/sglang-timeouts.js'
import {evaluateGate} from '../../src/suite/gate.js'
import {runSuite} from '../../src/suite/runner.js'
import {type SuiteFile, SuiteSchema} from '../../src/suite/suite-file.js'
import {
  fakeTarget,
  stateDirs,
  type FakePd,
  type FakeOptions,
  isInlineRevert,
  type ScriptedHost,
  SeededSession,
  seededDiscovery,
} from './fake-deployment.js'

/**
 * The one runner (runBatch, and runSuite around it) against a scripted PD deployment in this process and the real
 * LocalHost: real lease files and a real detached reverter under a temp state dir, and the lease's revert script
 * really runs `node -e` on this machine to reach the fake. Each test has its own deployment, host and state dir, so
 * the tests run side by side (their windows overlap: the file takes seconds, not the sum of them); each one checks
 * when it finishes that it left no lease armed and no reverter running.
 */

const DEADLINE_S = 0.6
// A wide poll: the fake's eviction timers share an event loop with the runner and with the other concurrent tests,
// so an on-time eviction (deadline + 30 ms) can reach the client hundreds of ms late on a busy machine.
const POLL_S = 1.0
const WATCHDOG = {deadlineSeconds: DEADLINE_S, pollSeconds: POLL_S}
/**
 * A correct watchdog evicts on its first poll past the deadline (the rest of the poll interval is slack for a loaded
 * machine).
 */
const ON_TIME_MS = DEADLINE_S * 1000 + 30
/**
 * A late one: past deadline + poll by a margin ε would need a 600 ms observation delay to cover, and well before the
 * window closes (deadline + poll + the runner's 2 s margin), so it is judged late, not lost.
 */
const LATE_MS = (DEADLINE_S + POLL_S) * 1000 + 1200

const nextStateDir = stateDirs('pdchaos-runner-')

interface Env {
  fake: FakePd
  host: ScriptedHost
  stateDir: string
  session: SeededSession
  lines: string[]
  settings(over?: Partial<BatchSettings>): BatchSettings
  /** Active lease ids as listLeases reports them; done records read from their files (see doneRecords). */
  leases(): Promise<{active: string[]; done: Array<Record<string, unknown>>}>
}

/** A fresh fake deployment, host and state dir for one test (fakeTarget checks what it leaves behind). */
async function env(ctx: TestContext, opts: FakeOptions, hostOpts?: {nodeInProcess: boolean}): Promise<Env> {
  const stateDir = nextStateDir()
  const {fake, host} = await fakeTarget(ctx, stateDir, opts, hostOpts)
  const lines: string[] = []
  return {
    fake,
    host,
    stateDir,
    lines,
    session: new SeededSession(fake.deployment(stateDir, WATCHDOG), host, fake.discovery()),
    settings: (over = {}) => ({
      mode: 'run',
      promptTokens: 16,
      loadIntervalMs: 0,
      canaries: 1,
      pinPacing: {burst: 1, gapMs: 10},
      paramsSource: 'flags',
      planErrors: 'throw',
      say: l => lines.push(l),
      ...over,
    }),
    leases: async () => ({
      active: (await listLeases(host, stateDir)).active.map(a => a.id),
      done: doneRecords(stateDir),
    }),
  }
}

/**
 * env() for runSuite, which makes its own RunSession: discovery is seeded on the class (SeededSession, used by the
 * other tests, overrides it), and the suite is parsed as a suite file is.
 */
async function suiteEnv(ctx: TestContext, suite: Record<string, unknown>): Promise<Env & {suite: SuiteFile}> {
  const e = await env(ctx, {evictAfterMs: ON_TIME_MS})
  const spy = vi.spyOn(RunSession.prototype, 'discovery').mockImplementation(async () => e.fake.discovery())
  ctx.onTestFinished(() => spy.mockRestore())
  return {...e, suite: SuiteSchema.parse({stop: {kernelXid: false}, ...suite})}
}

/** A run stopped before its first batch: every scenario "not run", nothing injected, no lease made. */
async function expectStoppedBeforeFirstBatch(run: SuiteRun, e: Env): Promise<void> {
  expect(run.stopped).toEqual({reason: 'interrupted (SIGINT)'})
  expect(run.scenarios.map(s => s.error)).toEqual(
    run.scenarios.map(() => expect.stringMatching(/^not run: the suite was stopped/)),
  )
  expect(e.fake.failpointPosts).toEqual([])
  expect(await e.leases()).toMatchObject({active: [], done: []})
}

/**
 * The done records, read from their files: listLeases garbles the last record it lists (its JSON ends up unreadable).
 */
function doneRecords(stateDir: string): Array<Record<string, unknown>> {
  const dir = join(stateDir, 'leases', 'done')
  if (!existsSync(dir)) return []
  return readdirSync(dir)
    .filter(f => f.endsWith('.json'))
    .sort()
    .map(f => JSON.parse(readFileSync(join(dir, f), 'utf8')) as Record<string, unknown>)
}

const dropDestInfo = (name: string, params: Record<string, unknown> = {}, pins = 2): BatchScenario => ({
  name,
  fault: 'drop-dest-info',
  params: {mechanism: 'twin-failpoint', ...params},
  pins,
})

const checks = (s: ScenarioRun, check: Verdict['check']): Verdict[] => s.verdicts.filter(v => v.check === check)
const failed = (s: ScenarioRun): string[] =>
  s.verdicts.filter(v => v.verdict === 'fail').map(v => `${v.check} ${v.subject}: ${v.summary}`)
const sentAs = (s: ScenarioRun, role: string) =>
  s.timeline!.observations.filter(
    (o): o is Extract<Observation, {kind: 'request-sent'}> => o.kind === 'request-sent' && o.role === role,
  )

async function rejection(p: Promise<unknown>): Promise<PdError> {
  try {
    await p
  } catch (error) {
    if (error instanceof PdError) return error
    throw error
  }
  throw new Error('expected a rejection')
}

// Each test takes 1-3 s alone; the deadline leaves room for a machine loaded by other test runs.
describe.concurrent('the runner (runBatch, runSuite) against a scripted deployment', {timeout: 30_000}, () => {
  // Alone (sequential in this concurrent suite): it asserts that a correct watchdog passes, which needs the observation
  // delay well under the poll; the other tests' fakes share this event loop and pushed it to 500-750 ms under load.
  it.sequential(
    'drop-dest-info (twin failure point), correct watchdog: pins evicted inside their bounds, lease ' +
      'reverted clean, every check passes',
    async ctx => {
      const {fake, session, settings, leases} = await env(ctx, {evictAfterMs: ON_TIME_MS})
      // With a steady load: the runner lets it show the deployment healthy (and takes a metrics sample) before the
      // fault.
      const out = await runBatch(session, [dropDestInfo('dd', {}, 3)], settings({loadIntervalMs: 150}))
      expect(out.floorMs).toBe((DEADLINE_S + POLL_S) * 1000)
      expect(out.scenarios).toHaveLength(1)
      const s = out.scenarios[0]!
      expect(s.error).toBeUndefined()
      expect(s.mechanism).toBe('twin-failpoint')
      expect(failed(s)).toEqual([])

      expect(checks(s, 'fault-effect')).toMatchObject([
        {
          verdict: 'pass',
          summary: expect.stringMatching(/drop-dest-info took effect: twin failpoint drop-dest-info: on for TP0,1/),
        },
      ])
      const evictions = checks(s, 'eviction')
      expect(evictions).toHaveLength(3)
      expect(s.pins).toHaveLength(3)
      for (const p of s.pins) {
        expect(p, JSON.stringify({pin: p, eviction: evictions.find(v => v.subject === p.rid)})).toMatchObject({
          fault: 'drop-dest-info',
          verdict: 'pass',
        })
        // The bounds are the runner's own: [deadline - ε, deadline + poll + ε], ε measured on loopback (5 ms floor).
        expect(p.bounds[0]).toBeCloseTo(DEADLINE_S - 0.005, 3)
        expect(p.bounds[1]).toBeGreaterThanOrEqual(DEADLINE_S + POLL_S + 0.005)
        expect(p.evictionSeconds).not.toBeNull()
        expect(p.evictionSeconds!).toBeGreaterThanOrEqual(p.bounds[0])
        expect(p.evictionSeconds!).toBeLessThanOrEqual(p.bounds[1])
        expect(p.evictedAt! - p.sentAt).toBeCloseTo(p.evictionSeconds! * 1000, -1)
        expect(fake.evicted).toContain(p.rid)
      }
      expect(evictions.map(v => v.subject).sort()).toEqual(s.pins.map(p => p.rid).sort())

      // The lease, as the journal shows it, and as the host shows it.
      expect(s.leases).toHaveLength(1)
      const lease = s.leases[0]!
      expect(lease).toMatchObject({
        fault: 'drop-dest-info',
        mechanism: 'twin-failpoint',
        verifiedInjected: true,
        verifiedClean: true,
      })
      expect(lease.injectedAt).not.toBeNull()
      expect(lease.revertedAt).not.toBeNull()
      expect(lease.injectedAt!).toBeLessThan(lease.revertedAt!)
      expect(lease.revertedAt!).toBeGreaterThanOrEqual(Math.max(...s.pins.map(p => p.evictedAt!)))
      expect(lease.evidence.clean.join('; ')).toMatch(
        /revert reverted by pdchaos \(exit 0\); twin failpoint drop-dest-info: on for TP none/,
      )
      expect(checks(s, 'cleanup')).toMatchObject([{verdict: 'pass', subject: lease.id}])
      expect(await leases()).toMatchObject({active: [], done: [{id: lease.id, revertedBy: 'pdchaos', exitStatus: 0}]})

      // Batch-wide checks: recovery (requests, queues, KV tokens, the watchdog counter) and the steady load.
      expect(
        checks(s, 'recovery')
          .map(v => v.subject)
          .sort(),
      ).toEqual(['counters', 'decode KV tokens', 'prefill KV tokens', 'queues', 'requests'])
      expect(checks(s, 'collateral')).toMatchObject([{verdict: 'pass'}])

      // Switched on and off on the fake, for both prefill ranks, once each.
      expect(fake.failpointPosts).toEqual([
        {name: 'drop-dest-info', enabled: true, tpRanks: [0, 1]},
        {name: 'drop-dest-info', enabled: false, tpRanks: [0, 1]},
      ])
      expect(fake.faulted).toBe(false)
      expect(fake.held.size).toBe(0)
    },
  )

  it(
    'a late watchdog, and one that never evicts: eviction fails naming late, and never evicted in the bootstrap ' +
      'queue',
    async ctx => {
      // The first pin the router holds is evicted late, the second never. (On a loaded machine ε, measured, can
      // reach the late pin: still a fail, marked at the edge.)
      const {fake, session, settings} = await env(ctx, {evictAfterMs: i => (i === 0 ? LATE_MS : null)})
      const {
        scenarios: [s],
      } = await runBatch(session, [dropDestInfo('dd late', {}, 2)], settings())
      expect(s!.error).toBeUndefined()
      expect(fake.heldRids).toHaveLength(2)
      const [lateRid, lostRid] = fake.heldRids as [string, string]
      const verdict = (rid: string) => checks(s!, 'eviction').find(v => v.subject === rid)
      const pin = (rid: string) => s!.pins.find(p => p.rid === rid)!
      expect(checks(s!, 'eviction')).toHaveLength(2)

      // ε is measured: on a machine loaded enough that it swallows the 1.2 s of lateness (load 7-11 did), the pin sits
      // inside its widened window, within ε of the bound, and the honest verdict is unverified. Never a pass.
      const late = pin(lateRid)
      if (late.evictionSeconds! > late.bounds[1]) {
        expect(verdict(lateRid)).toMatchObject({
          verdict: 'fail',
          summary: expect.stringMatching(
            /^evicted late: after \d+\.\d{3}s, past deadline \+ poll \+ ε \(\d+\.\d{3}s\)( \(at the edge\))?$/,
          ),
        })
        expect(late.verdict).toBe('fail')
      } else {
        expect(
          late.bounds[1] - (DEADLINE_S + POLL_S),
          'only an ε of more than the lateness can hide it',
        ).toBeGreaterThan(1.2)
        expect(verdict(lateRid)).toMatchObject({verdict: 'unverified'})
        expect(late.verdict).not.toBe('pass')
      }
      expect(fake.evicted).toEqual([lateRid])

      expect(verdict(lostRid)).toMatchObject({
        verdict: 'fail',
        summary: expect.stringMatching(
          /^never evicted: still held after \d+\.\d{3}s \(window ended at \d+\.\d{3}s\), in the bootstrap queue \(Bootstrapping\)$/,
        ),
      })
      expect(pin(lostRid)).toMatchObject({verdict: 'fail', evictedAt: null, evictionSeconds: null})

      // The fault itself was proven in place and taken out: the failure is the watchdog's alone.
      expect(checks(s!, 'fault-effect')).toMatchObject([{verdict: 'pass'}])
      expect(checks(s!, 'cleanup')).toMatchObject([{verdict: 'pass'}])
      expect(s!.leases[0]).toMatchObject({verifiedInjected: true, verifiedClean: true})
      expect(fake.faulted).toBe(false)
    },
  )

  it(
    'a fault that does not take effect: fault-effect fails, no pin is sent and no eviction judged, the lease is ' +
      'still reverted clean',
    async ctx => {
      const {fake, session, settings, leases} = await env(ctx, {evictAfterMs: ON_TIME_MS, failpointIgnoresPosts: true})
      const {
        scenarios: [s],
      } = await runBatch(session, [dropDestInfo('dd no effect')], settings())
      expect(s!.error).toBeUndefined()
      expect(s!.verdicts.map(v => `${v.check} ${v.verdict}`)).toEqual(['fault-effect fail', 'cleanup pass'])
      expect(checks(s!, 'fault-effect')[0]!.summary).toMatch(
        /^the fault did not take effect: twin failpoint drop-dest-info: on for TP none/,
      )
      expect(s!.pins).toEqual([])
      expect(sentAs(s!, 'pin')).toEqual([])
      expect(fake.heldRids).toEqual([])
      const lease = s!.leases[0]!
      expect(lease).toMatchObject({verifiedInjected: false, verifiedClean: true})
      expect(lease.revertedAt!).toBeGreaterThanOrEqual(lease.injectedAt!)
      expect(fake.failpointPosts.map(p => p.enabled)).toEqual([true, false])
      expect(await leases()).toMatchObject({active: [], done: [{id: lease.id, revertedBy: 'pdchaos', exitStatus: 0}]})
    },
  )

  it(
    'scenarios that cannot be planned, recorded: each carries "could not plan: ..." and nothing is ' + 'leased',
    async ctx => {
      const {fake, session, settings, leases} = await env(ctx, {evictAfterMs: ON_TIME_MS})
      const out = await runBatch(
        session,
        [
          {name: 'stall gpu9', fault: 'stall-kv', params: {gpu: 9, mechanism: 'twin-failpoint'}, pins: 1},
          dropDestInfo('dd rank7', {rank: 7}),
          {name: 'dd gpu', fault: 'drop-dest-info', params: {gpu: 1}, pins: 1},
        ],
        settings({planErrors: 'record', paramsSource: 'file'}),
      )
      expect(out.scenarios.map(s => s.name)).toEqual(['stall gpu9', 'dd rank7', 'dd gpu'])
      const [stall, rank7, gpu] = out.scenarios
      expect(stall!.error).toBe(
        'could not plan: no rank holds GPU 9 (ranks seen: GPU 0: prefill TP0, GPU 1: prefill TP1, GPU 2: decode TP0, ' +
          'GPU 3: decode TP1)',
      )
      expect(rank7!.error).toBe('could not plan: no prefill rank TP7 (prefill ranks: TP0, TP1)')
      // A param that does not apply to the fault, named as the suite file's key.
      expect(gpu!.error).toBe('could not plan: drop-dest-info takes no params.gpu')
      for (const s of out.scenarios) {
        expect(s.leases).toEqual([])
        expect(s.verdicts).toEqual([])
        expect(s.pins).toEqual([])
        expect(s.plan).toBeUndefined()
      }
      expect(fake.failpointPosts).toEqual([])
      expect(fake.heldRids).toEqual([])
      expect(await leases()).toEqual({active: [], done: []})
    },
  )

  it('a scenario that cannot be planned, thrown: runBatch rejects with exit 2 and nothing is leased', async ctx => {
    const {fake, session, settings, leases} = await env(ctx, {evictAfterMs: ON_TIME_MS})
    const e = await rejection(runBatch(session, [dropDestInfo('dd', {rank: 7})], settings({planErrors: 'throw'})))
    expect(e.exitCode).toBe(2)
    expect(e.message).toBe('no prefill rank TP7 (prefill ranks: TP0, TP1)')
    // The twin's stall-kv failure point holds a prefill rank: GPU 2 is decode's.
    const stall = await rejection(
      runBatch(
        session,
        [{name: 'stall', fault: 'stall-kv', params: {gpu: 2, mechanism: 'twin-failpoint'}, pins: 1}],
        settings(),
      ),
    )
    expect(stall.exitCode).toBe(2)
    expect(stall.message).toMatch(/GPU 2 is decode TP0/)
    expect(stall.suggestion).toMatch(/pick --gpu of a prefill rank/)
    expect(fake.failpointPosts).toEqual([])
    expect(await leases()).toEqual({active: [], done: []})
  })

  it('calibration fails (prefill answers 503): runBatch rejects with exit 5 before any lease', async ctx => {
    const {fake, host, session, settings, leases} = await env(ctx, {
      evictAfterMs: ON_TIME_MS,
      prefillGenerateStatus: 503,
    })
    const e = await rejection(runBatch(session, [dropDestInfo('dd')], settings()))
    expect(e.exitCode).toBe(5)
    // The warm-up is tried a few times (a cold start can outlast a short deadline), then the deployment is unhealthy,
    // with prefill's own answer.
    expect(e.message).toMatch(
      /^no unfaulted request succeeded in 8 tries before any fault \(last pdchaos-cal-\S+: prefill 503 .*Service Unavailable \(scripted\).*, decode 200\): the deployment is not healthy$/,
    )
    expect(fake.failpointPosts).toEqual([])
    expect(fake.router.received.filter(r => r.url === '/generate')).toEqual([])
    expect(host.ran.filter(a => a.some(x => x.includes('pdchaos-reverter')))).toEqual([])
    expect(await leases()).toEqual({active: [], done: []})
  })

  it(
    'a stop while the window is open: stopped before its window closed, no eviction verdict, the lease reverted ' +
      'clean',
    async ctx => {
      const {fake, session, settings, leases} = await env(ctx, {evictAfterMs: ON_TIME_MS})
      const stop = new AbortController()
      const {
        scenarios: [s],
      } = await runBatch(
        session,
        [dropDestInfo('dd stopped')],
        settings({
          signal: stop.signal,
          // Told once the pins are out and the window is open.
          onDeadline: () => stop.abort(new Error('stop condition fired (test)')),
        }),
      )
      expect(s!.error).toBe('stopped before its window closed: no eviction verdict')
      expect(s!.verdicts.map(v => `${v.check} ${v.verdict}`)).toEqual(['fault-effect pass', 'cleanup pass'])
      expect(s!.pins).toEqual([])
      const lease = s!.leases[0]!
      expect(lease).toMatchObject({verifiedInjected: true, verifiedClean: true})
      expect(lease.injectedAt!).toBeLessThan(lease.revertedAt!)
      // The pins were sent (the window was open), and nothing after the stop: no canary.
      expect(sentAs(s!, 'pin')).toHaveLength(2)
      expect(sentAs(s!, 'canary')).toEqual([])
      expect(fake.faulted).toBe(false)
      expect(await leases()).toMatchObject({active: [], done: [{id: lease.id, revertedBy: 'pdchaos', exitStatus: 0}]})
    },
  )

  it('dry-run: the plan and its read-only probes, no lease, nothing switched on the deployment', async ctx => {
    // The probe runs as a real `node -e` on the host.
    const {fake, session, settings, leases} = await env(ctx, {evictAfterMs: ON_TIME_MS}, {nodeInProcess: false})
    const out = await runBatch(session, [dropDestInfo('dd dry', {rank: 1})], settings({mode: 'dry-run'}))
    expect(out.floorMs).toBe(0)
    const s = out.scenarios[0]!
    expect(s.error).toBeUndefined()
    expect(s.leases).toEqual([])
    expect(s.verdicts).toEqual([])
    expect(s.mechanism).toBe('twin-failpoint')
    expect(s.plan!.inject).toHaveLength(1)
    expect(s.plan!.inject[0]).toContain(fake.failpointUrl)
    expect(s.plan!.inject[0]).toContain('"tpRanks":[1]')
    expect(s.dryRun!.probes).toHaveLength(1)
    const probe = s.dryRun!.probes[0]!
    expect(probe.code).toBe(0)
    expect(probe.argv).toContain(fake.failpointUrl)
    expect(JSON.parse(probe.stdout)).toEqual({failpoints: {'drop-dest-info': [], 'stall-kv': []}})
    // No calibration, no switch: only the warm-up request went through the router.
    expect(fake.failpointPosts).toEqual([])
    expect(fake.prefill.received.filter(r => r.url === '/generate')).toEqual([])
    expect(fake.routed).toEqual([expect.stringMatching(/^pdchaos-warmup-/)])
    expect(await leases()).toEqual({active: [], done: []})
  })

  it('hold: the fault is left in place under an armed lease, which recover takes out', async ctx => {
    const {fake, host, stateDir, session, settings, leases} = await env(ctx, {evictAfterMs: ON_TIME_MS})
    const {
      scenarios: [s],
      floorMs,
    } = await runBatch(session, [dropDestInfo('dd hold')], settings({mode: 'hold', ttlMs: 30_000}))
    expect(floorMs).toBe(0)
    expect(s!.held?.leaseId).toBe(s!.leases[0]!.id)
    expect(Date.parse(s!.held!.expiresAt) - Date.now()).toBeGreaterThan(20_000)
    expect(s!.leases[0]).toMatchObject({verifiedInjected: true, verifiedClean: false, revertedAt: null})
    expect(s!.verdicts).toEqual([])
    expect(fake.faulted).toBe(true)
    expect((await leases()).active).toEqual([s!.held!.leaseId])
    // What `pdchaos recover` does.
    expect(await revertLease(host, stateDir, s!.held!.leaseId, 'recover')).toMatchObject({
      status: 'reverted',
      exitCode: 0,
    })
    expect(fake.faulted).toBe(false)
  })

  it(
    'a revert that cannot run: runBatch rejects with exit 4 naming the lease, which stays armed on ' + 'the host',
    async ctx => {
      const {fake, host, stateDir, session, settings, leases} = await env(ctx, {evictAfterMs: ON_TIME_MS})
      host.script = argv =>
        isInlineRevert(argv)
          ? {code: 255, stdout: '', stderr: 'ssh: connection to the host lost (scripted)\n', durationMs: 0}
          : undefined
      const e = await rejection(runBatch(session, [dropDestInfo('dd', {}, 1)], settings()))
      expect(e.exitCode).toBe(4)
      const armed = (await leases()).active
      expect(armed).toHaveLength(1)
      const id = armed[0]!
      expect(
        e.message.startsWith(
          `cleanup unverified, the host may still be faulted: lease ${id} (reverting lease ${id} on local (scripted) ` +
            `gave no result: ssh: connection to the host lost (scripted); the host reverts it by itself at `,
        ),
      ).toBe(true)
      expect(e.suggestion).toMatch(/pdchaos recover/)
      expect(fake.faulted).toBe(true)
      host.script = undefined
      expect(await revertLease(host, stateDir, id, 'recover')).toMatchObject({status: 'reverted', exitCode: 0})
      expect(fake.faulted).toBe(false)
    },
  )

  // Alone too: each scenario's evictions must pass (see the first test).
  it.sequential(
    'runSuite, two drop-dest-info scenarios on ranks 0 and 1: one batch; each judged on its own pins, ' +
      'batch-wide verdicts once',
    async ctx => {
      const {fake, host, stateDir, leases, suite} = await suiteEnv(ctx, {
        name: 'two ranks',
        scenarios: [
          {name: 'dd rank0', fault: 'drop-dest-info', params: {rank: 0, mechanism: 'twin-failpoint'}, pins: 2},
          {name: 'dd rank1', fault: 'drop-dest-info', params: {rank: 1, mechanism: 'twin-failpoint'}, pins: 2},
        ],
        // A steady load: the runner then waits for it (and a first metrics sample) before injecting.
        load: {intervalMs: 200, promptTokens: 16, canaries: 1},
      })
      const run = await runSuite(fake.deployment(stateDir, WATCHDOG), host, suite, {say: () => {}})
      expect(run.stopped).toBeUndefined()
      expect(run.plan).toEqual([
        'batch 1: dd rank0 (drop-dest-info [zmq:0] pins in bootstrap) | dd rank1 (drop-dest-info [zmq:1] pins in ' +
          'bootstrap)',
      ])
      expect(run.batches).toHaveLength(1)
      expect(run.batches![0]).toMatchObject({
        index: 1,
        scenarios: ['dd rank0', 'dd rank1'],
        floorMs: (DEADLINE_S + POLL_S) * 1000,
      })
      expect(run.scenarios.map(s => s.name)).toEqual(['dd rank0', 'dd rank1'])

      const allPins = new Set<string>()
      for (const s of run.scenarios) {
        expect(s.error).toBeUndefined()
        expect(failed(s)).toEqual([])
        // Its own pins only: those sent under its name, judged on its own view of the timeline.
        const own = sentAs(s, 'pin')
        expect(own).toHaveLength(2)
        expect(own.map(o => o.scenario)).toEqual([s.name, s.name])
        expect(s.pins.map(p => p.rid).sort()).toEqual(own.map(o => o.rid).sort())
        expect(checks(s, 'eviction').map(v => v.verdict)).toEqual(['pass', 'pass'])
        for (const p of s.pins) allPins.add(p.rid)
        expect(s.leases).toHaveLength(1)
        expect(s.leases[0]).toMatchObject({verifiedInjected: true, verifiedClean: true})
        expect(s.leases[0]!.injectedAt!).toBeLessThan(s.leases[0]!.revertedAt!)
      }
      expect(allPins.size).toBe(4)
      // Recovery and collateral are judged once for the batch, on its first scenario, and say so.
      const [first, second] = run.scenarios
      expect(
        checks(first!, 'recovery')
          .map(v => v.subject)
          .sort(),
      ).toEqual(
        ['counters', 'decode KV tokens', 'prefill KV tokens', 'queues', 'requests'].map(
          x => `${x} (batch: dd rank0, dd rank1)`,
        ),
      )
      expect(checks(first!, 'collateral')).toMatchObject([
        {verdict: 'pass', subject: 'steady load (batch: dd rank0, dd rank1)'},
      ])
      expect(checks(second!, 'recovery')).toEqual([])
      expect(checks(second!, 'collateral')).toEqual([])

      // Each scenario switched its own rank on, then off (a batch injects its faults at once: in either order).
      expect(
        fake.failpointPosts
          .filter(p => p.enabled)
          .map(p => p.tpRanks)
          .sort(),
      ).toEqual([[0], [1]])
      expect(
        fake.failpointPosts
          .filter(p => !p.enabled)
          .map(p => p.tpRanks)
          .sort(),
      ).toEqual([[0], [1]])
      expect(fake.faulted).toBe(false)
      const onHost = await leases()
      expect(onHost.active).toEqual([])
      expect(onHost.done.map(d => d.id).sort()).toEqual(run.scenarios.map(s => s.leases[0]!.id).sort())
    },
  )

  // A Ctrl-C while the run calibrates or discovers comes before runSuite listens for it: it must still stop the run.
  it.sequential(
    'runSuite, a stop that came before its first batch: nothing injected, every scenario "not run", ' +
      'the run stopped',
    async ctx => {
      const e = await suiteEnv(ctx, {
        name: 'stopped early',
        scenarios: [
          {name: 'dd rank0', fault: 'drop-dest-info', params: {rank: 0, mechanism: 'twin-failpoint'}, pins: 1},
        ],
      })
      const stop = new AbortController()
      stop.abort('interrupted (SIGINT)')
      const run = await runSuite(e.fake.deployment(e.stateDir, WATCHDOG), e.host, e.suite, {
        say: () => {},
        signal: stop.signal,
      })
      expect(run.scenarios).toHaveLength(1)
      await expectStoppedBeforeFirstBatch(run, e)
    },
  )

  // The planner calibrates when a stall-kv must pick its mechanism: a Ctrl-C then stops between two requests, not after
  // all of them (a slow deployment's warm-up alone may take a minute).
  it.sequential(
    'runSuite, a stop while the planner calibrates: calibration ends at the next request, the run ' +
      'stops before its first batch',
    async ctx => {
      const e = await suiteEnv(ctx, {
        name: 'stopped calibrating',
        scenarios: [
          {name: 'dd rank0', fault: 'drop-dest-info', params: {rank: 0, mechanism: 'twin-failpoint'}, pins: 1},
          {name: 'stall', fault: 'stall-kv', params: {gpu: 1}, pins: 1},
        ],
      })
      const {fake} = e
      const stop = new AbortController()
      fake.onPrefillGenerate = rid => {
        if (rid.startsWith('pdchaos-cal') && fake.prefillGenerates.length === 3) stop.abort('interrupted (SIGINT)')
      }
      const run = await runSuite(fake.deployment(e.stateDir, WATCHDOG), e.host, e.suite, {
        say: () => {},
        signal: stop.signal,
      })
      // Warm-up and 8 pairs would be 9 requests to prefill: it stopped after the one in flight.
      expect(fake.prefillGenerates).toHaveLength(3)
      expect(run.scenarios).toHaveLength(2)
      await expectStoppedBeforeFirstBatch(run, e)
    },
  )
})

describe('a competing SGLang timeout (issue 27): refused before anything is injected', () => {
  // Decode's waiting timeout read from decode's environment, firing before the fake's watchdog window closes.
  const shortWaiting = sglangTimeoutsOf({
    decode: {
      env: {
        pid: 4_000_100,
        what: 'decode scheduler TP0',
        env: {SGLANG_DISAGGREGATION_WAITING_TIMEOUT: String(DEADLINE_S)},
      },
    },
    backend: 'nixl',
    version: '0.5.15',
  })

  it.sequential(
    'runBatch with planErrors throw (inject): exit 2 naming the setting and where it was read; nothing ' + 'injected',
    async ctx => {
      const e = await env(ctx, {evictAfterMs: ON_TIME_MS})
      const session = new SeededSession(e.fake.deployment(e.stateDir, WATCHDOG), e.host, {
        ...e.fake.discovery(),
        sglangTimeouts: shortWaiting,
      })
      const err = await rejection(runBatch(session, [dropDestInfo('dd')], e.settings()))
      expect(err.exitCode).toBe(2)
      expect(err.message).toMatch(
        /decode's waiting timeout SGLANG_DISAGGREGATION_WAITING_TIMEOUT = .* \(read from the environment of pid 4000100, decode scheduler TP0\)/,
      )
      expect(e.fake.failpointPosts).toEqual([])
      expect(await e.leases()).toMatchObject({active: [], done: []})
    },
  )

  it.sequential(
    'runSuite: the scenario is not run, with the reason, and the gate names it; allowCompetingTimeout ' +
      "runs it (a pin passes only where the watchdog's own words name it)",
    async ctx => {
      const e = await suiteEnv(ctx, {
        name: 'competing',
        scenarios: [
          {name: 'dd rank0', fault: 'drop-dest-info', params: {rank: 0, mechanism: 'twin-failpoint'}, pins: 1},
        ],
      })
      vi.spyOn(RunSession.prototype, 'discovery').mockImplementation(async () => ({
        ...e.fake.discovery(),
        sglangTimeouts: shortWaiting,
      }))
      const run = await runSuite(e.fake.deployment(e.stateDir, WATCHDOG), e.host, e.suite, {say: () => {}})
      expect(run.scenarios[0]!.error).toMatch(
        /^not run: drop-dest-info cannot exercise the watchdog: decode's waiting timeout SGLANG_DISAGGREGATION_WAITING_TIMEOUT/,
      )
      expect(
        evaluateGate(
          run,
          SuiteSchema.parse({scenarios: [{name: 'x', fault: 'drop-dest-info'}], gate: {}}).gate!,
        ).reasons.join('\n'),
      ).toMatch(/scenario dd rank0 did not reach a verdict: not run: drop-dest-info cannot exercise the watchdog/)
      expect(e.fake.failpointPosts).toEqual([])
      const allowed = await runSuite(
        e.fake.deployment(e.stateDir, WATCHDOG),
        e.host,
        {...e.suite, allowCompetingTimeout: true},
        {say: () => {}},
      )
      const s = allowed.scenarios[0]!
      expect(s.error).toBeUndefined()
      expect(s.notes?.join(' ')).toMatch(/allowed to run although decode's waiting timeout/)
      // The fake's watchdog says it evicted the pin: its own words name it, the one evidence a competing timeout leaves
      // standing.
      expect(s.pins.map(p => [p.verdict, (p.evidence.releasePath as {path: string}).path])).toEqual([['pass', 'named']])
    },
  )
})

describe('judgeBatch and viewFor (pure)', () => {
  const contract = {scope: 'all' as const, deadlineSeconds: 10, pollSeconds: 2}
  const calibration = {prefillMs: 40, prefillSpreadMs: 8, observeMs: 5, samples: 8, routerMs: 50}
  const t0 = 1_800_000_000_000
  const discovery = seededDiscovery('http://127.0.0.1:1/_pdchaos/twin/failpoint', [1, 2, 3, 8998])
  const plan = (leaseId: string, rank: number) =>
    dropDestInfoFault.plan({
      discovery,
      params: parseFaultParams(dropDestInfoFault, {rank, mechanism: 'twin-failpoint'}),
      leaseId,
      facts: {},
    })
  const lease = (id: string, over: Partial<LeaseRecord> = {}): LeaseRecord => ({
    id,
    fault: 'drop-dest-info',
    mechanism: 'twin-failpoint',
    injectedAt: t0,
    revertedAt: t0 + 14_000,
    verifiedInjected: true,
    verifiedClean: true,
    expiresAt: t0 + 60_000,
    evidence: {injected: ['twin failpoint drop-dest-info: on for TP0'], clean: ['revert reverted by pdchaos (exit 0)']},
    ...over,
  })
  const scenario = (name: string): BatchScenario => ({name, fault: 'drop-dest-info', params: {}, pins: 1})
  const bootstrap = {queue: 'bootstrap' as const, kvPoll: 'Bootstrapping' as const}
  const metric = (t: number, service: 'prefill' | 'decode', name: string, value: number): Observation => ({
    kind: 'metric',
    t,
    service,
    name,
    value,
  })
  const queuesAt = (t: number): Observation[] => [
    metric(t, 'prefill', 'sglang_disagg_prefill_bootstrap_queue_reqs', 0),
    metric(t, 'prefill', 'sglang_disagg_prefill_inflight_queue_reqs', 0),
    metric(t, 'decode', 'sglang_disagg_decode_prealloc_queue_reqs', 0),
    metric(t, 'decode', 'sglang_disagg_decode_transfer_queue_reqs', 0),
  ]
  const pinSent = (rid: string, scenario: string | undefined, t: number): Observation => ({
    kind: 'request-sent',
    t,
    rid,
    role: 'pin',
    fault: 'drop-dest-info',
    ...(scenario ? {scenario} : {}),
    expectedState: bootstrap,
  })
  const answered = (rid: string, t: number, status = 500): Observation => ({kind: 'request-answered', t, rid, status})

  // E never took effect; A and B did (a2 is late); C could not be planned; D was planned but never leased.
  const entries = (): Entry[] => [
    {
      s: scenario('E'),
      plan: plan('dd-e', 0),
      lease: lease('dd-e', {
        verifiedInjected: false,
        evidence: {injected: ['twin failpoint drop-dest-info: on for TP none'], clean: []},
      }),
      startedAt: t0 - 10,
    },
    {s: scenario('A'), plan: plan('dd-a', 0), lease: lease('dd-a'), startedAt: t0 - 5},
    {s: scenario('B'), plan: plan('dd-b', 1), lease: lease('dd-b'), startedAt: t0 - 4},
    {s: scenario('C'), error: 'could not plan: no prefill rank TP7 (prefill ranks: TP0, TP1)', startedAt: t0 - 3},
    {s: scenario('D'), plan: plan('dd-d', 1), startedAt: t0 - 2},
  ]
  const observations: Observation[] = [
    metric(t0 - 100, 'prefill', 'sglang:num_watchdog_evicted_reqs_total', 7),
    ...queuesAt(t0 - 100),
    {kind: 'fault-injected', t: t0, fault: 'drop-dest-info', leaseId: 'dd-a', verified: true, evidence: ''},
    {kind: 'fault-injected', t: t0 + 1, fault: 'drop-dest-info', leaseId: 'dd-b', verified: true, evidence: ''},
    pinSent('a1', 'A', t0 + 10),
    pinSent('a2', 'A', t0 + 20),
    pinSent('b1', 'B', t0 + 30),
    {kind: 'abort-sent', t: t0 + 40, rid: 'b1', target: 'prefill', status: 200},
    {kind: 'log', t: t0 + 50, service: 'prefill', line: 'rid b1 in bootstrap queue', rid: 'b1'},
    answered('b1', t0 + 30 + 10_500),
    answered('a1', t0 + 10 + 11_000),
    answered('a2', t0 + 20 + 13_000),
    {
      kind: 'fault-reverted',
      t: t0 + 14_000,
      fault: 'drop-dest-info',
      leaseId: 'dd-a',
      verifiedClean: true,
      evidence: '',
    },
    {
      kind: 'fault-reverted',
      t: t0 + 14_001,
      fault: 'drop-dest-info',
      leaseId: 'dd-b',
      verifiedClean: true,
      evidence: '',
    },
    {kind: 'request-sent', t: t0 + 14_100, rid: 'c1', role: 'canary'},
    answered('c1', t0 + 14_110, 200),
    metric(t0 + 14_200, 'prefill', 'sglang:num_watchdog_evicted_reqs_total', 10),
    ...queuesAt(t0 + 14_200),
  ]
  const judge = (over: {stoppedEarly?: boolean; loadedObserveMs?: number} = {}) =>
    judgeBatch({
      entries: entries(),
      observations,
      contract,
      calibration,
      stoppedEarly: over.stoppedEarly ?? false,
      loadIntervalMs: 0,
      finishedAt: t0 + 15_000,
      ...(over.loadedObserveMs === undefined ? {} : {loadedObserveMs: over.loadedObserveMs}),
    })
  const byName = (runs: ScenarioRun[]) => Object.fromEntries(runs.map(r => [r.name, r]))
  const rids = (tl: Timeline) =>
    new Set(
      tl.observations
        .filter(o => o.kind !== 'log')
        .map(o => (o as {rid?: string}).rid)
        .filter(Boolean),
    )

  it(
    'each scenario is judged on its own pins; batch-wide verdicts land once, on the first scenario that took ' +
      'effect',
    () => {
      const runs = judge()
      expect(runs.map(r => r.name)).toEqual(['E', 'A', 'B', 'C', 'D'])
      const {E, A, B, C, D} = byName(runs)

      expect(E!.verdicts.map(v => `${v.check} ${v.verdict}`)).toEqual(['fault-effect fail', 'cleanup pass'])
      expect(E!.pins).toEqual([])

      expect(A!.pins.map(p => [p.rid, p.verdict])).toEqual([
        ['a1', 'pass'],
        ['a2', 'fail'],
      ])
      expect(A!.pins[0]).toMatchObject({evictionSeconds: 11, bounds: [9.995, 12.015]})
      expect(checks(A!, 'eviction').find(v => v.subject === 'a2')!.summary).toMatch(/^evicted late: after 13\.000s/)
      const label = ' (batch: E, A, B, C, D)'
      expect(checks(A!, 'recovery').map(v => `${v.subject} ${v.verdict}`)).toEqual([
        `requests${label} pass`,
        `queues${label} pass`,
        `counters${label} pass`,
      ])
      expect(checks(A!, 'recovery').find(v => v.subject.startsWith('counters'))!.summary).toBe(
        'failure counters moved by 3, as expected (3)',
      )
      expect(A!.leases.map(l => l.id)).toEqual(['dd-a'])
      expect(A!.plan!.inject[0]).toContain('"tpRanks":[0]')

      expect(B!.pins.map(p => [p.rid, p.verdict])).toEqual([['b1', 'pass']])
      expect(checks(B!, 'recovery')).toEqual([])
      expect(B!.verdicts.map(v => v.check)).toEqual(['fault-effect', 'eviction', 'cleanup'])

      // Views: A never sees B's pin (its send, abort and answer), B never sees A's; a log line naming a rid stays.
      expect(rids(A!.timeline!)).toEqual(new Set(['a1', 'a2', 'c1']))
      expect(rids(B!.timeline!)).toEqual(new Set(['b1', 'c1']))
      expect(A!.timeline!.observations.some(o => o.kind === 'log' && o.rid === 'b1')).toBe(true)

      expect(C).toMatchObject({
        error: 'could not plan: no prefill rank TP7 (prefill ranks: TP0, TP1)',
        verdicts: [],
        pins: [],
        leases: [],
      })
      expect(C!.plan).toBeUndefined()
      expect(D).toMatchObject({error: 'not injected: the run stopped first', verdicts: [], leases: []})
    },
  )

  it(
    "a fault on every node of a multi-node instance: each node's lease judged; pins judged only when every node's " +
      'part took effect',
    () => {
      const withPart = (partLease: LeaseRecord): Entry[] => [
        {
          s: scenario('A'),
          plan: plan('dd-a', 0),
          lease: lease('dd-a', {host: 'node-0'}),
          startedAt: t0 - 5,
          parts: [{host: 'node-1', plan: plan('dd-b', 1), lease: partLease}],
        },
      ]
      const run = (partLease: LeaseRecord) =>
        judgeBatch({
          entries: withPart(partLease),
          observations,
          contract,
          calibration,
          stoppedEarly: false,
          loadIntervalMs: 0,
          finishedAt: t0 + 15_000,
        })[0]!
      const both = run(lease('dd-b', {host: 'node-1'}))
      expect(both.leases.map(l => [l.id, l.host])).toEqual([
        ['dd-a', 'node-0'],
        ['dd-b', 'node-1'],
      ])
      expect(
        both.verdicts
          .filter(v => v.check === 'fault-effect' || v.check === 'cleanup')
          .map(v => `${v.check} ${v.subject} ${v.verdict}`),
      ).toEqual(['fault-effect dd-a pass', 'fault-effect dd-b pass', 'cleanup dd-a pass', 'cleanup dd-b pass'])
      expect(both.pins.map(p => p.rid)).toEqual(['a1', 'a2'])
      expect(both.notes!.some(n => n.startsWith('also on node-1: '))).toBe(true)
      // One node's part did not take effect: the fault was not in place everywhere it acts, so no pin is judged by it.
      const half = run(
        lease('dd-b', {
          host: 'node-1',
          verifiedInjected: false,
          evidence: {injected: ['nft: permission denied'], clean: []},
        }),
      )
      expect(half.verdicts.map(v => `${v.check} ${v.subject} ${v.verdict}`)).toEqual([
        'fault-effect dd-a pass',
        'fault-effect dd-b fail',
        'cleanup dd-a pass',
        'cleanup dd-b pass',
      ])
      expect(half.pins).toEqual([])
    },
  )

  it("the observation delay measured under the pins' load widens ε when it is the larger", () => {
    const {A} = byName(judge({loadedObserveMs: 700}))
    // ε high = 5 ms + 2 × 700 ms: the 13 s eviction is now inside deadline + poll + ε.
    expect(A!.pins.map(p => [p.rid, p.verdict])).toEqual([
      ['a1', 'pass'],
      ['a2', 'pass'],
    ])
    expect(A!.pins[1]!.bounds).toEqual([9.995, 13.405])
    expect(A!.pins[1]!.evidence).toMatchObject({epsilonMs: {low: 5, high: 1405}})
    // The scenario records both: the idle calibration and the delay under load.
    expect(A!.calibration).toEqual({...calibration, loadedObserveMs: 700})
  })

  it('a batch stopped early: no eviction or batch-wide verdict, every scenario says why', () => {
    const {A, B} = byName(judge({stoppedEarly: true}))
    for (const s of [A!, B!]) {
      expect(s.error).toBe('stopped before its window closed: no eviction verdict')
      expect(s.verdicts.map(v => `${v.check} ${v.verdict}`)).toEqual(['fault-effect pass', 'cleanup pass'])
      expect(s.pins).toEqual([])
    }
  })

  it('viewFor keeps pins without a scenario tag in every view', () => {
    const tl: Timeline = {
      contract,
      calibration,
      observations: [
        pinSent('x', undefined, t0),
        pinSent('a', 'A', t0 + 1),
        pinSent('b', 'B', t0 + 2),
        answered('b', t0 + 3),
      ],
    }
    expect(viewFor(tl, 'A').observations.map(o => (o as {rid: string}).rid)).toEqual(['x', 'a'])
    expect(viewFor(tl, 'B').observations.map(o => (o as {rid: string}).rid)).toEqual(['x', 'b', 'b'])
    expect(viewFor(tl, 'other').observations.map(o => (o as {rid: string}).rid)).toEqual(['x'])
  })
})
