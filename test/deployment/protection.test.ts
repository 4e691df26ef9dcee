import {describe, expect, it} from 'vitest'

import type {Deployment} from '../../src/deployment/config.js'
import {assertMayDisturb, isProduction, normalizeLabel} from '../../src/deployment/protection.js'
import {PdError} from '../../src/errors.js'

const deployment = (labels: Record<string, string>): Deployment => ({name: 'd', labels}) as unknown as Deployment

describe('the production guard (issue 12, S3)', () => {
  it.each([
    [{environment: 'production'}],
    [{Environment: 'production'}],
    [{ENVIRONMENT: 'PRODUCTION'}],
    [{environment: ' production'}],
    [{' environment ': 'Production\t'}],
    [{team: 'x', Environment: '  production  '}],
    // Issue 28: what a reader takes for "production" is production (NFKC, invisible characters removed).
    [{environment: 'production\u200b'}],
    [{environment: '\u200bproduction\ufeff'}],
    [{environment: 'pro\u00adduct\u2060ion'}],
    [{environment: '\uff50\uff52\uff4f\uff44\uff55\uff43\uff54\uff49\uff4f\uff4e'}],
    [{environment: '\uff30\uff32\uff2f\uff24\uff35\uff23\uff34\uff29\uff2f\uff2e'}],
    [{'environment\u200d': 'production'}],
    [{'\uff45nvironment': '\u202aproduction\u202c'}],
  ])('refuses %j without --allow-production (exit 2, E_PRODUCTION)', labels => {
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

  it.each([
    [{}],
    [{environment: 'staging'}],
    [{environment: 'production-like'}],
    [{env: 'production'}],
    [{environment: 'pre production'}],
  ])('lets %j through', labels => {
    expect(isProduction(labels)).toBe(false)
    expect(() => assertMayDisturb(deployment(labels), false, 'restart')).not.toThrow()
  })
})

describe('normalizeLabel (issue 28)', () => {
  it('keeps what differs to a reader apart', () => {
    expect(normalizeLabel('staging')).toBe('staging')
    expect(normalizeLabel('prod uction')).toBe('prod uction')
    expect(isProduction({environment: 'productions'})).toBe(false)
    expect(isProduction({environment: 'pre-production'})).toBe(false)
  })
})
