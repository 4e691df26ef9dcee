import {describe, expect, it} from 'vitest'

import {routerUpOptions} from '../../src/cli/sim-flags.js'
import {PdError} from '../../src/errors.js'
import {buildSimConfig} from '../../src/sim/lifecycle/options.js'
import {serviceArgv} from '../../src/sim/lifecycle/services.js'
import {SimError} from '../../src/sim/lifecycle/sim-error.js'
import {gatewayArgsFor, gatewayArgv, parseGatewayArgv} from '../../src/sim/router/gateway-args.js'

/**
 * The router's launch flags: sgl-model-gateway's names on the command line, upstream's defaults, read back by the
 * router.
 */

const cliDefaults = {
  'retry-max-retries': 5,
  'retry-initial-backoff-ms': 50,
  'retry-max-backoff-ms': 30_000,
  'retry-backoff-multiplier': '1.5',
  'retry-jitter-factor': '0.2',
  'disable-retries': false,
  'cb-failure-threshold': 10,
  'cb-success-threshold': 3,
  'cb-timeout-duration-secs': 60,
  'cb-window-duration-secs': 120,
  'disable-circuit-breaker': false,
}

const pairs = (argv: string[], flag: string): string | undefined => argv[argv.indexOf(flag) + 1]

describe('router launch flags', () => {
  it("puts upstream's defaults on the router's command line, in the gateway's names", () => {
    const config = buildSimConfig({stateDir: '/tmp/pdc-args', basePort: 50_000})
    const {args} = serviceArgv(config, 'router')
    const at = args.indexOf('--pd-disaggregation')
    expect(at).toBeGreaterThan(0)
    const flags = args.slice(at)
    expect(flags.slice(0, 6)).toEqual([
      '--pd-disaggregation',
      '--prefill',
      'http://127.0.0.1:50100',
      '50500',
      '--decode',
      'http://127.0.0.1:50200',
    ])
    expect(
      Object.fromEntries(
        [
          '--retry-max-retries',
          '--retry-initial-backoff-ms',
          '--retry-max-backoff-ms',
          '--retry-backoff-multiplier',
          '--retry-jitter-factor',
          '--cb-failure-threshold',
          '--cb-success-threshold',
          '--cb-timeout-duration-secs',
          '--cb-window-duration-secs',
          '--port',
          '--prometheus-port',
          '--health-check-interval-secs',
        ].map(f => [f, pairs(flags, f)]),
      ),
    ).toEqual({
      '--retry-max-retries': '5',
      '--retry-initial-backoff-ms': '50',
      '--retry-max-backoff-ms': '30000',
      '--retry-backoff-multiplier': '1.5',
      '--retry-jitter-factor': '0.2',
      '--cb-failure-threshold': '10',
      '--cb-success-threshold': '3',
      '--cb-timeout-duration-secs': '60',
      '--cb-window-duration-secs': '120',
      '--port': '50000',
      '--prometheus-port': '50900',
      '--health-check-interval-secs': '60',
    })
    expect(flags).not.toContain('--disable-retries')
    expect(flags).not.toContain('--disable-circuit-breaker')
  })

  it('shows the switches only when on, and the router reads back what it was given', () => {
    const config = buildSimConfig({
      stateDir: '/tmp/pdc-args',
      router: {
        disableRetries: true,
        disableCircuitBreaker: true,
        retryMaxRetries: 3,
        cbFailureThreshold: 4,
        cbTimeoutDurationS: 7,
      },
    })
    const flags = gatewayArgv(gatewayArgsFor(config))
    expect(flags).toContain('--disable-retries')
    expect(flags).toContain('--disable-circuit-breaker')
    const parsed = parseGatewayArgv(flags, gatewayArgsFor(buildSimConfig({stateDir: '/tmp/other'})))
    expect(parsed).toEqual(gatewayArgsFor(config))
    expect(parsed.retry).toMatchObject({maxRetries: 3, disabled: true})
    expect(parsed.circuitBreaker).toMatchObject({failureThreshold: 4, timeoutDurationS: 7, disabled: true})
  })

  it('reads the optional bootstrap port after --prefill and refuses an unknown flag or a bad number', () => {
    const base = gatewayArgsFor(buildSimConfig({stateDir: '/tmp/pdc-args'}))
    const port = base.prefill[0]!.bootstrapPort
    expect(parseGatewayArgv(['--prefill', 'http://p:1', 'none', '--decode', 'http://d:2'], base)).toMatchObject({
      prefill: [{url: 'http://p:1', bootstrapPort: port}],
      decode: ['http://d:2'],
    })
    expect(parseGatewayArgv(['--prefill', 'http://p:1', '--decode', 'http://d:2'], base).prefill).toEqual([
      {url: 'http://p:1', bootstrapPort: port},
    ])
    expect(parseGatewayArgv(['--prefill', 'http://p:1', '9001'], base).prefill).toEqual([
      {url: 'http://p:1', bootstrapPort: 9001},
    ])
    // Repeated: one instance each, in order; the base's list is replaced, not added to.
    const two = parseGatewayArgv(
      [
        '--prefill',
        'http://p:1',
        '9001',
        '--prefill',
        'http://q:1',
        '9002',
        '--decode',
        'http://d:2',
        '--decode',
        'http://e:2',
        '--policy',
        'round_robin',
      ],
      base,
    )
    expect(two).toMatchObject({
      prefill: [
        {url: 'http://p:1', bootstrapPort: 9001},
        {url: 'http://q:1', bootstrapPort: 9002},
      ],
      decode: ['http://d:2', 'http://e:2'],
      policy: 'round_robin',
    })
    expect(() => parseGatewayArgv(['--policy', 'fastest'], base)).toThrow(
      /--policy must be one of cache_aware, round_robin, random/,
    )
    expect(() => parseGatewayArgv(['--retry-max-retries', 'many'], base)).toThrow(/--retry-max-retries needs a number/)
    expect(() => parseGatewayArgv(['--no-such-flag'], base)).toThrow(/unknown flag --no-such-flag/)
  })

  it('validates sim up values, naming the flag (bad input)', () => {
    const bad: Array<[Record<string, unknown>, RegExp]> = [
      [{retryMaxRetries: -1}, /--retry-max-retries must be an integer from 0/],
      [{retryJitterFactor: 1.5}, /--retry-jitter-factor must be a number from 0 to 1/],
      [{cbFailureThreshold: 0}, /--cb-failure-threshold must be an integer from 1/],
      [{cbTimeoutDurationS: 0.5}, /--cb-timeout-duration-secs must be an integer/],
    ]
    for (const [router, message] of bad) {
      let caught: unknown
      try {
        buildSimConfig({stateDir: '/tmp/pdc-args', router})
      } catch (error) {
        caught = error
      }
      expect(caught).toBeInstanceOf(SimError)
      expect((caught as SimError).kind).toBe('bad-input')
      expect((caught as SimError).message).toMatch(message)
    }
  })

  it('maps the sim up flags to the options (defaults = upstream defaults), and refuses a non-number', () => {
    expect(buildSimConfig({stateDir: '/tmp/a', router: routerUpOptions(cliDefaults)}).router).toEqual(
      buildSimConfig({stateDir: '/tmp/a'}).router,
    )
    expect(routerUpOptions({...cliDefaults, 'disable-retries': true, 'retry-backoff-multiplier': '2'})).toMatchObject({
      disableRetries: true,
      retryBackoffMultiplier: 2,
    })
    expect(() => routerUpOptions({...cliDefaults, 'retry-jitter-factor': 'lots'})).toThrow(PdError)
  })
})
