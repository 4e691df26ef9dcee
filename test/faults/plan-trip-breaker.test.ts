import {describe, expect, it} from 'vitest'

import {routerSettingsFromArgv} from '../../src/engines/sglang/discovery/router-settings.js'
import {PdError} from '../../src/errors.js'
import type {FaultDiscovery} from '../../src/faults/fault.js'
import {judgeIptablesInjected} from '../../src/faults/mechanisms/packet-filter.js'
import {parseFaultParams} from '../../src/faults/params.js'
import {tripBreaker} from '../../src/faults/trip-breaker.js'

/** trip-breaker's plan: the exact refusal it installs, the bounds it derives from the gateway's settings, refusals. */

const gateway = (o: Partial<NonNullable<FaultDiscovery['gateway']>> = {}, argv: string[] = []): FaultDiscovery => ({
  ranks: [],
  transport: {backend: 'nixl', source: 'test'},
  servicePorts: [8000, 30_000, 30_001, 8998],
  gateway: {
    routerUrl: 'http://127.0.0.1:8000',
    prefillUrl: 'http://127.0.0.1:30000',
    decodeUrl: 'http://127.0.0.1:30001',
    settings: routerSettingsFromArgv(['sgl-model-gateway', '--pd-disaggregation', ...argv], 'test'),
    ...o,
  },
})
const params = (raw: Record<string, unknown> = {}) => parseFaultParams(tripBreaker, raw, 'flags')
const plan = (discovery: FaultDiscovery, tool: 'nft' | 'iptables' | 'none' = 'nft') =>
  tripBreaker.plan({
    discovery,
    params: params(),
    leaseId: 'tb1',
    facts: tool === 'none' ? {filterEvidence: 'none here'} : {filterTool: tool, filterEvidence: 'test'},
  })

function badInput(fn: () => unknown): PdError {
  try {
    fn()
  } catch (error) {
    expect(error).toBeInstanceOf(PdError)
    expect((error as PdError).exitCode).toBe(2)
    return error as PdError
  }
  throw new Error('expected a bad-input error')
}

describe('trip-breaker plan', () => {
  it(
    "refuses with a TCP reset the gateway's connections to prefill's HTTP port, from the gateway's " + 'address only',
    () => {
      const p = plan(gateway())
      expect(p.mechanism).toBe('packet-filter')
      expect(p.inject).toHaveLength(1)
      expect(p.inject[0]![1]).toContain(
        'add rule inet pdchaos_tb1 input ip saddr 127.0.0.1 tcp dport 30000 counter reject with tcp reset comment ' +
          '"from-127.0.0.1-to-30000"',
      )
      expect(p.inject[0]![1]).toContain(
        'add rule inet pdchaos_tb1 output ip saddr 127.0.0.1 tcp dport 30000 counter reject with tcp reset',
      )
      expect(p.revert).toEqual([
        ['nft', 'add', 'table', 'inet', 'pdchaos_tb1', ';', 'delete', 'table', 'inet', 'pdchaos_tb1'],
      ])
      expect(tripBreaker.footprint(params(), {}).exclusive).toMatch(/every request through the gateway is refused/)
    },
  )

  it('iptables: REJECT --reject-with tcp-reset, and the judge wants that target', () => {
    const p = plan(gateway({prefillUrl: 'http://10.0.0.5:30000', routerUrl: 'http://10.0.0.6:8000'}), 'iptables')
    expect(p.inject[1]).toEqual([
      'iptables',
      '-w',
      '5',
      '-A',
      'PDCHAOS-tb1',
      '-p',
      'tcp',
      '-s',
      '10.0.0.6',
      '--dport',
      '30000',
      '-m',
      'comment',
      '--comment',
      'from-10.0.0.6-to-30000',
      '-j',
      'REJECT',
      '--reject-with',
      'tcp-reset',
    ])
    const save = [
      ':PDCHAOS-tb1 - [0:0]',
      '[3:180] -A PDCHAOS-tb1 -s 10.0.0.6/32 -p tcp -m tcp --dport 30000 -m comment --comment ' +
        'from-10.0.0.6-to-30000 -j REJECT --reject-with tcp-reset',
      '-A INPUT -j PDCHAOS-tb1',
      '-A OUTPUT -j PDCHAOS-tb1',
    ].join('\n')
    expect(judgeIptablesInjected('PDCHAOS-tb1', ['from-10.0.0.6-to-30000'], save, 0, 'REJECT').ok).toBe(true)
    expect(
      judgeIptablesInjected(
        'PDCHAOS-tb1',
        ['from-10.0.0.6-to-30000'],
        save.replace('REJECT --reject-with tcp-reset', 'DROP'),
        0,
        'REJECT',
      ).ok,
    ).toBe(false)
  })

  it("derives its bounds from the gateway's settings: trip requests, the 503 bound, the close bound", () => {
    const p = plan(
      gateway({}, [
        '--cb-failure-threshold',
        '6',
        '--retry-max-retries',
        '3',
        '--cb-timeout-duration-secs',
        '10',
        '--cb-success-threshold',
        '2',
      ]),
    )
    expect(p.expected).toMatchObject({
      kind: 'breaker',
      failureThreshold: 6,
      attempts: 3,
      tripRequests: 4,
      openSeconds: 10,
      successThreshold: 2,
      closeWithinSeconds: 20,
    })
    // Two backoffs at full jitter: 50 × 1.2 + 75 × 1.2 = 150 ms, + 1 s.
    expect(p.expected).toMatchObject({refuseWithinMs: 1150})
    expect(plan(gateway()).expected).toMatchObject({
      failureThreshold: 10,
      attempts: 5,
      tripRequests: 4,
      openSeconds: 60,
      refuseWithinMs: 1488,
    })
  })

  it('refuses what it cannot do safely: no breaker, no filter off the twin, an address it cannot tell', () => {
    expect(badInput(() => plan(gateway({}, ['--disable-circuit-breaker']))).message).toMatch(
      /--disable-circuit-breaker/,
    )
    expect(badInput(() => plan(gateway(), 'none')).message).toMatch(/no usable packet filter/)
    const e = badInput(() =>
      plan(gateway({prefillUrl: 'http://prefill.svc:30000', routerUrl: 'http://router.svc:8000'})),
    )
    expect(e.message).toMatch(/cannot tell which address the gateway connects to prefill from/)
  })

  it("uses the twin's failure point where no packet filter is usable, and says so", () => {
    const d = {...gateway(), twinFailpointUrl: 'http://127.0.0.1:30000/_pdchaos/twin/failpoint'}
    const p = plan(d, 'none')
    expect(p.mechanism).toBe('twin-failpoint')
    expect(p.sudo).toBe(false)
    expect(p.refusals?.[0]).toMatch(/packet filter not usable here/)
    expect(p.inject[0]!.at(-1)).toBe(JSON.stringify({name: 'refuse-generate', enabled: true, tpRanks: [0]}))
  })
})
