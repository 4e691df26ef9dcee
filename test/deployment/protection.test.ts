import {describe, expect, it} from 'vitest'

import type {Deployment} from '../../src/deployment/config.js'
import {assertMayDisturb, isProduction} from '../../src/deployment/protection.js'
import {PdError} from '../../src/errors.js'

const deployment = (labels: Record<string, string>): Deployment => ({name: 'd', labels} as unknown as Deployment)

describe('the production guard (issue 12, S3)', () => {
  it.each([
    [{environment: 'production'}],
    [{Environment: 'production'}],
    [{ENVIRONMENT: 'PRODUCTION'}],
    [{environment: ' production'}],
    [{' environment ': 'Production\t'}],
    [{team: 'x', Environment: '  production  '}],
  ])('refuses %j without --allow-production (exit 2, E_PRODUCTION)', (labels) => {
    expect(isProduction(labels)).toBe(true)
    let caught: unknown
    try {
      assertMayDisturb(deployment(labels), false, 'inject a fault into')
    } catch (error) {
      caught = error
    }
    expect(caught).toBeInstanceOf(PdError)
    expect((caught as PdError).exitCode).toBe(2)
    expect((caught as PdError).code).toBe('E_PRODUCTION')
    expect(() => assertMayDisturb(deployment(labels), true, 'inject a fault into')).not.toThrow()
  })

  it.each([[{}], [{environment: 'staging'}], [{environment: 'production-like'}], [{env: 'production'}], [{environment: 'pre production'}]])('lets %j through', (labels) => {
    expect(isProduction(labels)).toBe(false)
    expect(() => assertMayDisturb(deployment(labels), false, 'restart')).not.toThrow()
  })
})
