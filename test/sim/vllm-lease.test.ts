import {afterEach, describe, expect, it, vi} from 'vitest'

import {SimError} from '../../src/sim/lifecycle/sim-error.js'
import {
  buildVllmConfig,
  dataPorts,
  kvTransferConfig,
  rankShare,
  serveArgv,
  serverEnv,
} from '../../src/sim/vllm/config.js'
import {LeaseTable, leaseParams, legacyAbortTimeoutDefaultS} from '../../src/sim/vllm/lease.js'
import {vlog} from '../../src/sim/vllm/common.js'

const S = 1000

describe('vLLM lease arithmetic', () => {
  it("derives the heartbeat interval and extension with Python's floor division", () => {
    expect(leaseParams(30)).toEqual({durationS: 30, intervalS: 5, extensionS: 20})
    expect(leaseParams(6)).toEqual({durationS: 6, intervalS: 1, extensionS: 4})
    expect(leaseParams(7)).toEqual({durationS: 7, intervalS: 1, extensionS: 4})
    // Below 6 s the interval is 0: D heartbeats on every scheduler step.
    expect(leaseParams(5)).toEqual({durationS: 5, intervalS: 0, extensionS: 3})
  })

  it('picks the legacy abort timeout by release date (PR #25897, 2025-09-29)', () => {
    expect(legacyAbortTimeoutDefaultS('2025-09-28')).toBe(120)
    expect(legacyAbortTimeoutDefaultS('2025-09-29')).toBe(480)
    expect(legacyAbortTimeoutDefaultS(undefined)).toBe(480)
  })

  it('a heartbeat extends to max(old, now + extension) and never shortens a lease', () => {
    const t = new LeaseTable()
    t.grant('a', 0, 30)
    // At t=5 s, now + 20 = 25 s is earlier than the grant's 30 s: the lease stays at 30.
    expect(t.heartbeat(['a'], 5 * S, 20)).toEqual([{id: 'a', fromMs: 30 * S, toMs: 30 * S}])
    // At t=15 s it moves to 35 s.
    expect(t.heartbeat(['a', 'unknown'], 15 * S, 20)).toEqual([{id: 'a', fromMs: 30 * S, toMs: 35 * S}])
    expect(t.expiryOf('a')).toBe(35 * S)
    expect(t.reap(34.999 * S)).toEqual([])
    expect(t.reap(35 * S)).toEqual([{id: 'a', expiryMs: 35 * S}])
    expect(t.size).toBe(0)
  })

  it('a read notification frees at once; a later heartbeat for it is ignored', () => {
    const t = new LeaseTable()
    t.grant('a', 0, 30)
    expect(t.release('a')).toBe(true)
    expect(t.release('a')).toBe(false)
    expect(t.heartbeat(['a'], 1 * S, 20)).toEqual([])
    expect(t.reap(100 * S)).toEqual([])
  })
})

describe('the reaper', () => {
  // A heartbeated head entry in front of an expired one: the situation of vLLM #58222.
  function headKeptAlive(): LeaseTable {
    const t = new LeaseTable()
    t.grant('head', 0, 30)
    t.grant('behind', 1 * S, 30)
    t.heartbeat(['head'], 25 * S, 20) // head now expires at 45 s
    return t
  }

  it('sweeps every entry: an expired lease behind a live one is freed', () => {
    const t = headKeptAlive()
    expect(t.reap(31 * S)).toEqual([{id: 'behind', expiryMs: 31 * S}])
    expect(t.ids()).toEqual(['head'])
  })

  it('with the head-block bug, stops at the first unexpired entry and strands the one behind', () => {
    const t = headKeptAlive()
    expect(t.reap(31 * S, {headBlock: true})).toEqual([])
    expect(t.reap(44 * S, {headBlock: true})).toEqual([])
    // Only once the head expires do both go, the stranded one 14 s late.
    expect(t.reap(45 * S, {headBlock: true})).toEqual([
      {id: 'head', expiryMs: 45 * S},
      {id: 'behind', expiryMs: 31 * S},
    ])
  })

  it('frees in grant order and only what expired', () => {
    const t = new LeaseTable()
    t.grant('a', 0, 10)
    t.grant('b', 0, 5)
    t.grant('c', 0, 20)
    expect(t.reap(10 * S).map(e => e.id)).toEqual(['a', 'b'])
    expect(t.ids()).toEqual(['c'])
  })

  it('lease-never-expires frees nothing', () => {
    const t = new LeaseTable()
    t.grant('a', 0, 1)
    expect(t.reap(1e9, {never: true})).toEqual([])
    expect(t.size).toBe(1)
  })
})

describe('vLLM twin config', () => {
  it('launches with the NixlConnector kv_both config carrying the lease', () => {
    const c = buildVllmConfig({stateDir: '/tmp/x', leaseDurationS: 12})
    expect(JSON.parse(kvTransferConfig(c))).toEqual({
      kv_connector: 'NixlConnector',
      kv_role: 'kv_both',
      kv_connector_extra_config: {kv_lease_duration: 12},
    })
    expect(serveArgv(c, 'prefill').slice(0, 2)).toEqual(['vllm', 'serve'])
    expect(c.lease).toMatchObject({mode: 'lease', intervalS: 2, extensionS: 8})
    expect(c.sideChannel).toEqual({prefill: 5600, decode: 5601})
  })

  it('no-lease is the legacy timeout, 120 s before Sep 2025', () => {
    const c = buildVllmConfig({stateDir: '/tmp/x', bugs: ['no-lease'], releaseDate: '2025-06-01'})
    expect(c.lease).toMatchObject({mode: 'legacy', abortTimeoutS: 120})
    // A build before the lease is launched without the key (discovery then cannot claim lease mode).
    expect(JSON.parse(kvTransferConfig(c)).kv_connector_extra_config).toEqual({})
  })

  it('refuses an unknown bug as bad input', () => {
    expect(() => buildVllmConfig({stateDir: '/tmp/x', bugs: ['nope']})).toThrow(SimError)
    expect(() => buildVllmConfig({stateDir: '/tmp/x', bugs: ['nope']})).toThrow(/unknown --vllm-bug nope/)
  })

  it("P's data listener per TP rank at base + 300 + k, D's ephemeral; each rank's share of the bytes adds up", () => {
    const c = buildVllmConfig({stateDir: '/tmp/x', basePort: 9000, tp: 4})
    expect(dataPorts(c, 'prefill')).toEqual([9300, 9301, 9302, 9303])
    expect(dataPorts(c, 'decode')).toEqual([0, 0, 0, 0])
    expect([0, 1, 2, 3].map(k => rankShare(10, 4, k))).toEqual([3, 3, 2, 2])
    expect(rankShare(4096, 1, 0)).toBe(4096)
  })

  it('notifications on the side channel by default; --vllm-notif-path data, and nothing else, is taken', () => {
    expect(buildVllmConfig({stateDir: '/tmp/x'}).notifPath).toBe('side')
    expect(buildVllmConfig({stateDir: '/tmp/x', notifPath: 'data'}).notifPath).toBe('data')
    expect(() => buildVllmConfig({stateDir: '/tmp/x', notifPath: 'ucx'})).toThrow(/unknown --vllm-notif-path ucx/)
    expect(() => buildVllmConfig({stateDir: '/tmp/x', tp: 0})).toThrow(/--vllm-tp must be a whole number/)
  })

  it('P and D run at VLLM_LOGGING_LEVEL=DEBUG by default (P logs its renewals); --vllm-log-level INFO is taken', () => {
    const c = buildVllmConfig({stateDir: '/tmp/x'})
    expect([serverEnv(c, 'prefill').VLLM_LOGGING_LEVEL, serverEnv(c, 'decode').VLLM_LOGGING_LEVEL]).toEqual([
      'DEBUG',
      'DEBUG',
    ])
    expect(serverEnv(buildVllmConfig({stateDir: '/tmp/x', logLevel: 'info'}), 'prefill').VLLM_LOGGING_LEVEL).toBe(
      'INFO',
    )
    expect(() => buildVllmConfig({stateDir: '/tmp/x', logLevel: 'TRACE'})).toThrow(/unknown --vllm-log-level TRACE/)
  })
})

describe("the vLLM twin's log level (vllm/envs.py VLLM_LOGGING_LEVEL, default INFO)", () => {
  const saved = process.env.VLLM_LOGGING_LEVEL
  afterEach(() => {
    if (saved === undefined) delete process.env.VLLM_LOGGING_LEVEL
    else process.env.VLLM_LOGGING_LEVEL = saved
    vi.restoreAllMocks()
  })
  const written = (): string[] => {
    const out: string[] = []
    vi.spyOn(process.stdout, 'write').mockImplementation(c => {
      out.push(String(c))
      return true
    })
    vlog('EngineCore_DP0', 'DEBUG', 'base_worker.py:_handle_heartbeat', 'Heartbeat extended lease for request r by 2s')
    vlog('EngineCore_DP0', 'INFO', 'api_server.py', 'started')
    return out
  }

  it('writes DEBUG lines only when the process runs at VLLM_LOGGING_LEVEL=DEBUG', () => {
    process.env.VLLM_LOGGING_LEVEL = 'debug'
    expect(written().map(l => l.split(' ')[2])).toEqual(['DEBUG', 'INFO'])
    delete process.env.VLLM_LOGGING_LEVEL
    vi.restoreAllMocks()
    expect(written().map(l => l.split(' ')[2])).toEqual(['INFO'])
  })
})
