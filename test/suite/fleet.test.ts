import {describe, expect, it} from 'vitest'

import {type Deployment, DeploymentSchema} from '../../src/deployment/config.js'
import {PdError, unreachable} from '../../src/errors.js'
import {FLEET_EXIT_PRECEDENCE, fleetExitCode, memberOfRun} from '../../src/model/fleet.js'
import type {FleetEntry, FleetPlan} from '../../src/suite/fleet-file.js'
import {runFleet} from '../../src/suite/fleet.js'
import {defaultSuite} from '../../src/suite/suite-file.js'
import {syntheticRun} from '../report/synthetic-run.js'

/** The fleet's scheduling and its one exit code, with each deployment's run scripted in this process. */

const sleep = (ms: number) => new Promise(r => setTimeout(r, ms))

function deployment(name: string): Deployment {
  return DeploymentSchema.parse({
    name,
    host: {kind: 'local'},
    stateDir: `/tmp/x/${name}`,
    backend: 'nixl',
    watchdog: {scope: 'all', deadlineSeconds: 2, pollSeconds: 0.5},
    services: {
      prefill: {url: 'http://127.0.0.1:1', bootstrapPort: 8998},
      decode: {url: 'http://127.0.0.1:2'},
      router: {url: 'http://127.0.0.1:3'},
    },
  })
}

function plan(names: string[], maxParallel = 4): FleetPlan {
  const suite = defaultSuite()
  const entries: FleetEntry[] = names.map(name => ({
    name,
    deploymentFile: `/etc/pdchaos/${name}.yaml`,
    deployment: deployment(`pd-${name}`),
    suite,
  }))
  return {file: '/etc/pdchaos/fleet.yaml', name: 'nightly', maxParallel, entries}
}

describe('runFleet: every deployment on its own, at most maxParallel at once', () => {
  it(
    "never runs more than the bound at once, keeps the lanes full, and reports in the fleet file's " + 'order',
    async () => {
      let now = 0
      let peak = 0
      const started: string[] = []
      const events: string[] = []
      const names = ['a', 'b', 'c', 'd', 'e', 'f', 'g']
      // Uneven lengths: a lane that frees up takes the next deployment at once, without waiting for the slow one.
      const ms: Record<string, number> = {a: 150, b: 30, c: 30, d: 30, e: 40, f: 10, g: 10}
      const fleet = await runFleet(plan(names, 4), {
        maxParallel: 3,
        runMember: async e => {
          now++
          peak = Math.max(peak, now)
          started.push(e.name)
          events.push(`start ${e.name}`)
          await sleep(ms[e.name]!)
          events.push(`end ${e.name}`)
          now--
          return memberOfRun(e.name, syntheticRun({failing: false}))
        },
      })
      expect(peak).toBe(3)
      expect(fleet.maxParallel).toBe(3)
      expect(started).toEqual(names)
      expect(fleet.members.map(m => m.name)).toEqual(names)
      expect(fleet.members.every(m => m.status === 'pass')).toBe(true)
      expect(fleet.exitCode).toBe(0)
      // The two other lanes ran d, e and f while a still ran.
      expect(events.indexOf('start f')).toBeLessThan(events.indexOf('end a'))
    },
  )

  it("uses the fleet file's maxParallel without the flag, and never more lanes than deployments", async () => {
    let now = 0
    let peak = 0
    const run = async () => {
      peak = Math.max(peak, ++now)
      await sleep(20)
      now--
      return memberOfRun('x', syntheticRun({failing: false}))
    }
    expect((await runFleet(plan(['a', 'b', 'c', 'd', 'e'], 2), {runMember: run})).maxParallel).toBe(2)
    expect(peak).toBe(2)
    expect((await runFleet(plan(['a', 'b'], 8), {runMember: run})).maxParallel).toBe(2)
  })

  it(
    'an unreachable deployment is reported as such, with its reason, while the others are judged; the exit code ' +
      'follows',
    async () => {
      const fleet = await runFleet(plan(['eu1', 'us2', 'ap3']), {
        runMember: async e => {
          if (e.name === 'us2')
            throw unreachable(
              'prefill at http://10.0.3.7:30000 refused the connection (ECONNREFUSED)',
              'is it up? `pdchaos status` shows every service',
            )
          await sleep(20)
          return memberOfRun(e.name, syntheticRun({failing: e.name === 'ap3'}))
        },
      })
      expect(fleet.members.map(m => [m.name, m.status, m.exitCode])).toEqual([
        ['eu1', 'pass', 0],
        ['us2', 'unreachable', 5],
        ['ap3', 'fail', 1],
      ])
      const us2 = fleet.members[1]!
      expect(us2).toMatchObject({
        reason: 'prefill at http://10.0.3.7:30000 refused the connection (ECONNREFUSED)',
        suggestion: 'is it up? `pdchaos status` shows every service',
        deployment: 'pd-us2',
        config: '/etc/pdchaos/us2.yaml',
        suite: 'default',
      })
      expect(us2.run).toBeUndefined()
      // A failed check outranks another deployment's infrastructure trouble.
      expect(fleet.exitCode).toBe(1)
      const onlyUnreachable = await runFleet(plan(['eu1', 'us2']), {
        runMember: async e => {
          if (e.name === 'us2') throw new Error('ssh: handshake failed')
          return memberOfRun(e.name, syntheticRun({failing: false}))
        },
      })
      // An error that is not pdchaos's own is an error of the run, still infrastructure (exit 5).
      expect(onlyUnreachable.members[1]).toMatchObject({status: 'error', exitCode: 5, reason: 'ssh: handshake failed'})
      expect(onlyUnreachable.exitCode).toBe(5)
    },
  )

  it('a stop starts no further deployment: those are reported not run, and the fleet exits 3', async () => {
    const stop = new AbortController()
    const fleet = await runFleet(plan(['a', 'b', 'c', 'd']), {
      maxParallel: 2,
      signal: stop.signal,
      runMember: async (e, ctx) => {
        // Both lanes are busy when the signal comes.
        if (e.name === 'a') setTimeout(() => stop.abort('interrupted (SIGINT)'), 5)
        await sleep(20)
        // A member told to stop comes back stopped (its run reverted and wrote a stopped journal).
        return ctx.signal.aborted
          ? memberOfRun(e.name, {...syntheticRun({failing: false}), stopped: {reason: 'interrupted (SIGINT)'}})
          : memberOfRun(e.name, syntheticRun({failing: false}))
      },
    })
    expect(fleet.members.map(m => [m.name, m.status, m.exitCode])).toEqual([
      ['a', 'stopped', 3],
      ['b', 'stopped', 3],
      ['c', 'not-run', 3],
      ['d', 'not-run', 3],
    ])
    expect(fleet.members[2]!.reason).toBe('not run: the fleet was stopped before its turn')
    expect(fleet.exitCode).toBe(3)
  })

  it('a run that throws any error still becomes a member: a refusal keeps its exit code', async () => {
    const fleet = await runFleet(plan(['a']), {
      runMember: async () => {
        throw new PdError('another chaos run holds the lock on local: root@ci pid 7 (suite nightly)', {
          exit: 2,
          code: 'E_LOCKED',
        })
      },
    })
    expect(fleet.members[0]).toMatchObject({
      status: 'error',
      exitCode: 2,
      reason: expect.stringMatching(/holds the lock/),
    })
    expect(fleet.exitCode).toBe(2)
  })
})

describe("the fleet's exit code when deployments differ", () => {
  it('follows 4 > 3 > 1 > 5 > 2 > 0', () => {
    expect(FLEET_EXIT_PRECEDENCE).toEqual([4, 3, 1, 5, 2, 0])
    const table: Array<[number[], number]> = [
      [[0, 0, 0], 0],
      [[0, 5], 5],
      [[5, 1, 0], 1],
      [[2, 5], 5],
      [[1, 3], 3],
      [[3, 4, 1, 5], 4],
      [[0, 2], 2],
      // A child killed by a signal has no README code: infrastructure.
      [[0, 137], 5],
    ]
    for (const [codes, expected] of table) expect(fleetExitCode(codes), `codes ${codes.join(',')}`).toBe(expected)
  })
})
