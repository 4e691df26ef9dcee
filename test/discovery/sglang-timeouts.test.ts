import {describe, expect, it} from 'vitest'

import {launchVarsOf, sglangTimeoutsOf, versionAtMost} from '../../src/engines/sglang/discovery/sglang-timeouts.js'
import {competingRefusal, competingTimeoutsFor, firingInWindow} from '../../src/experiment/competing.js'
import {nixlHasBootstrapTimeout} from '../../src/sim/server/prefill-rank.js'

const decodeEnv = (env: Record<string, string>) => ({env: {pid: 42, what: 'decode scheduler TP0', env}})
const prefillEnv = (env: Record<string, string>) => ({env: {pid: 41, what: 'prefill scheduler TP0', env}})

describe("SGLang's own timeouts, each from the process that reads it, with where it was read", () => {
  it(
    "reads the environment of the reader first, then NAME=value on its launch command, else SGLang's default for " +
      'the version',
    () => {
      const t = sglangTimeoutsOf({
        prefill: prefillEnv({SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT: '120'}),
        decode: {launch: {pid: 40, vars: {SGLANG_DISAGGREGATION_WAITING_TIMEOUT: '3.2'}}},
        version: '0.5.17',
        backend: 'mooncake',
      })
      expect(t.bootstrap).toMatchObject({
        seconds: 120,
        from: 'env',
        source: 'the environment of pid 41, prefill scheduler TP0',
        pid: 41,
      })
      expect(t.waiting).toMatchObject({seconds: 3.2, from: 'launch-command', source: 'the launch command of pid 40'})
      // Not read at all: SGLang's defaults (environ.py: 5.0 s × 2), saying the environment was not read.
      expect(t.heartbeat).toMatchObject({
        seconds: 10,
        intervalSeconds: 5,
        maxFailure: 2,
        from: 'default',
        envRead: false,
      })
      expect(t.heartbeat.source).toMatch(
        /SGLang's default for version 0\.5\.17 \(environ\.py; decode's environment not read\)/,
      )
    },
  )

  it(
    "the bootstrap default is 300 s (environ.py), not 3600; unset in a read environment is SGLang's " + 'default, read',
    () => {
      const t = sglangTimeoutsOf({prefill: prefillEnv({}), decode: decodeEnv({}), version: '0.5.17', backend: 'nixl'})
      expect(t.bootstrap).toMatchObject({seconds: 300, from: 'default', envRead: true})
      expect(t.bootstrap.source).toMatch(/unset in the environment of pid 41/)
      expect(t.waiting).toMatchObject({seconds: 300, from: 'default', envRead: true})
    },
  )

  it(
    "NIXL's sender has no bootstrap timeout up to 0.5.15 (PR #34692 came after); later or unknown versions are " +
      'taken to have it',
    () => {
      const at = (version: string | undefined) =>
        sglangTimeoutsOf({
          prefill: prefillEnv({SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT: '2'}),
          backend: 'nixl',
          ...(version ? {version} : {}),
        }).bootstrap
      expect(at('0.5.15')).toMatchObject({
        seconds: null,
        from: 'not-in-force',
        source: expect.stringMatching(
          /NIXL sender has no bootstrap timeout .*PR #34692.*2 s set in the environment of pid 41/,
        ),
      })
      expect(at('0.5.6').seconds).toBeNull()
      expect(at('0.5.16rc1').seconds).toBe(2)
      expect(at(undefined)).toMatchObject({
        seconds: 2,
        source: expect.stringMatching(/version is unknown, so the NIXL sender is taken to have it/),
      })
      // Mooncake always had it.
      expect(sglangTimeoutsOf({prefill: prefillEnv({}), backend: 'mooncake', version: '0.5.6'}).bootstrap.seconds).toBe(
        300,
      )
      expect(versionAtMost('0.5.15.post1', '0.5.15')).toBe(true)
      expect(versionAtMost('main', '0.5.15')).toBeUndefined()
    },
  )

  it('clamps the heartbeat as SGLang does (interval at least 2 s, at least 1 miss)', () => {
    const t = sglangTimeoutsOf({
      decode: decodeEnv({
        SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL: '0.5',
        SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE: '0',
      }),
    })
    expect(t.heartbeat).toMatchObject({seconds: 2, intervalSeconds: 2, maxFailure: 1, from: 'env'})
  })

  it('finds NAME=value words of the PD variables on a command line', () => {
    expect(
      launchVarsOf(
        "env SGLANG_DISAGGREGATION_WAITING_TIMEOUT=3.2 'SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT=9' python -m " +
          'sglang.launch_server --port 30000 FOO=1',
      ),
    ).toEqual({SGLANG_DISAGGREGATION_WAITING_TIMEOUT: '3.2', SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT: '9'})
  })

  it("the twin's NIXL sender follows the same version rule", () => {
    expect(nixlHasBootstrapTimeout('0.5.15')).toBe(false)
    expect(nixlHasBootstrapTimeout('0.5.16')).toBe(true)
    expect(nixlHasBootstrapTimeout('0.6.0')).toBe(true)
  })
})

describe('competing timeouts at plan time', () => {
  const t = sglangTimeoutsOf({
    prefill: prefillEnv({SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT: '3.2'}),
    decode: decodeEnv({SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL: '2'}),
    backend: 'mooncake',
    version: '0.5.17',
  })
  const contract = {deadlineSeconds: 3, pollSeconds: 0.5}

  it(
    "a Bootstrapping pin competes with prefill's bootstrap timeout and decode's waiting timeout; an inflight one " +
      'with the waiting timeout only',
    () => {
      expect(
        competingTimeoutsFor({queue: 'bootstrap', kvPoll: 'Bootstrapping'}, 'packet-filter', t).map(c => c.cause),
      ).toEqual(['bootstrap-timeout', 'waiting-timeout'])
      expect(
        competingTimeoutsFor({queue: 'inflight', kvPoll: 'Transferring'}, 'packet-filter', t).map(c => c.cause),
      ).toEqual(['waiting-timeout'])
      // The heartbeat only where the fault can cut decode off from prefill's bootstrap server.
      expect(
        competingTimeoutsFor({queue: 'inflight', kvPoll: 'Transferring'}, 'link-down', t).map(c => c.cause),
      ).toEqual(['waiting-timeout', 'heartbeat'])
      expect(competingTimeoutsFor('trials', 'packet-filter', t)).toEqual([])
    },
  )

  it('refuses (exit 2) naming the setting, its value and where it was read, and how to run anyway', () => {
    const firing = firingInWindow(
      competingTimeoutsFor({queue: 'bootstrap', kvPoll: 'Bootstrapping'}, 'packet-filter', t),
      contract,
    )
    expect(firing.map(c => c.cause)).toEqual(['bootstrap-timeout'])
    const e = competingRefusal('drop-dest-info', firing, contract)
    expect(e.exitCode).toBe(2)
    expect(e.message).toBe(
      "drop-dest-info cannot exercise the watchdog: prefill's bootstrap timeout " +
        'SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT = 3.2 s (read from the environment of pid 41, prefill scheduler ' +
        'TP0) fires inside the watchdog window (deadline 3 s + poll 0.5 s), so SGLang would release the pins first',
    )
    expect(e.suggestion).toMatch(
      /raise SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT above 4\.5 s in the environment of the prefill server, or pass --allow-competing-timeout/,
    )
    // The heartbeat (2 s × 2 = 4 s) fires inside the window too, but only a link down competes with it.
    expect(
      firingInWindow(competingTimeoutsFor({queue: 'inflight', kvPoll: 'Transferring'}, 'link-down', t), contract).map(
        c => c.cause,
      ),
    ).toEqual(['heartbeat'])
  })
})
