import {describe, expect, it} from 'vitest'

import {httpRequest} from '../../src/deployment/http.js'
import {PdError, oneLine} from '../../src/errors.js'
import {redactDeep, redactText} from '../../src/util/redact.js'

const SECRET = 'S3cretToken'

describe('credentials in URLs are redacted (issue 12, S4)', () => {
  it.each([
    ['http://admin:S3cretToken@10.0.0.1:30000/health', 'http://***@10.0.0.1:30000/health'],
    ['prefill at https://u:S3cretToken@h:1 refused', 'prefill at https://***@h:1 refused'],
    ['"http://admin:S3cretToken@x"', '"http://***@x"'],
    ['http://a:p@ss:S3cretToken@host/x', 'http://***@host/x'],
    ['http://token@host', 'http://***@host'],
  ])('%s', (text, want) => {
    expect(redactText(text)).toBe(want)
  })

  it.each([['http://host:80/a@b'], ['ssh root@10.0.0.1:22'], ['mail a@b.c'], ['http://h/?u=a@b']])(
    'leaves %s alone',
    text => {
      expect(redactText(text)).toBe(text)
    },
  )

  it('PdError messages and suggestions, and oneLine of any error, carry no password', () => {
    const e = new PdError(`router at http://admin:${SECRET}@h:1 refused`, {
      exit: 5,
      suggestion: `curl http://admin:${SECRET}@h:1/health`,
    })
    expect(e.message).not.toContain(SECRET)
    expect(e.suggestion).not.toContain(SECRET)
    expect(oneLine(new Error(`x http://admin:${SECRET}@h`))).toBe('x http://***@h')
  })

  it('redactDeep copies a JSON value with every string redacted', () => {
    const v = {
      services: {router: {url: `http://admin:${SECRET}@h:1`, ok: true, n: 3}},
      list: [`https://u:${SECRET}@x`, null],
    }
    const r = redactDeep(v)
    expect(JSON.stringify(r)).not.toContain(SECRET)
    expect(r.services.router).toEqual({url: 'http://***@h:1', ok: true, n: 3})
    expect(v.services.router.url).toContain(SECRET)
  })

  it('an HTTP failure names the service and the URL without its password', async () => {
    // Port 1 on loopback: refused at once.
    const err = await httpRequest({
      service: 'router',
      url: `http://admin:${SECRET}@127.0.0.1:1/health`,
      timeoutMs: 2000,
    }).catch((e: unknown) => e)
    expect(err).toBeInstanceOf(PdError)
    expect((err as PdError).message).toContain('router at http://***@127.0.0.1:1/health')
    expect(JSON.stringify({m: (err as PdError).message, s: (err as PdError).suggestion})).not.toContain(SECRET)
  })
})
