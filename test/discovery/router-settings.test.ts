import {describe, expect, it} from 'vitest'

import {isRouterCommand, routerSettingsFromArgv} from '../../src/engines/sglang/discovery/router-settings.js'

describe("the gateway's retry and breaker settings", () => {
  it(
    'defaults: 5 attempts in all with a new room each, a breaker after 10 failures; says what that does under a ' +
      'fault',
    () => {
      const s = routerSettingsFromArgv(
        ['sgl-model-gateway', '--pd-disaggregation', '--prefill', 'http://p:30000', '8998'],
        'router command line',
      )
      expect(s.retries).toMatchObject({
        enabled: true,
        attempts: 5,
        backoff: {initialMs: 50, multiplier: 1.5, maxMs: 30_000, jitter: 0.2},
      })
      expect(s.circuitBreaker).toEqual({enabled: true, failureThreshold: 10, openSeconds: 60, successThreshold: 3})
      expect(s.underFaults.join('\n')).toMatch(
        /up to 5 times in all, each with a new bootstrap room, and each attempt waits for decode too/,
      )
      expect(s.underFaults.join('\n')).toMatch(/after 10 failures a worker's circuit breaker opens/)
      expect(s.source).toMatch(/gateway's defaults/)
    },
  )

  it('honours the launcher flags, in both spellings', () => {
    // A process title is one space-separated string.
    const s = routerSettingsFromArgv(
      ['smg --retry-max-retries=2 --cb-failure-threshold 50 --cb-timeout-duration-secs=10'],
      'router command line',
    )
    expect(s.retries.attempts).toBe(2)
    expect(s.circuitBreaker).toMatchObject({enabled: true, failureThreshold: 50, openSeconds: 10})
    expect(s.underFaults.join('\n')).toMatch(/after 50 failures a worker's circuit breaker opens \(about 10 s\)/)
    expect(s.source).toBe(
      "router command line: --retry-max-retries, --cb-failure-threshold, --cb-timeout-duration-secs; the gateway's " +
        'defaults for the rest',
    )
    const off = routerSettingsFromArgv(['smg', '--disable-retries', '--disable-circuit-breaker'], 'router command line')
    expect(off.retries).toMatchObject({enabled: false, attempts: 1})
    expect(off.circuitBreaker.enabled).toBe(false)
    expect(off.underFaults.join('\n')).toMatch(/no retries.*\n.*no circuit breaker/)
  })

  it('knows the gateway by its binary or its Python launcher', () => {
    expect(isRouterCommand(['/usr/local/bin/sgl-model-gateway', '--pd-disaggregation'])).toBe(true)
    expect(isRouterCommand(['python3', '-m', 'sglang_router.launch_router', '--pd-disaggregation'])).toBe(true)
    expect(isRouterCommand(['python3', '-m', 'sglang.launch_server'])).toBe(false)
  })
})
