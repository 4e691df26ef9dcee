import {existsSync, mkdtempSync, rmSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {afterAll, describe, expect, it} from 'vitest'

import {errorDocument} from '../../src/cli/error-output.js'
import {checkOutputFile, checkPushUrl, makeParents} from '../../src/cli/outputs.js'
import {checkRunTtl, minRunTtlSeconds} from '../../src/cli/ttl.js'
import {MAX_DEADLINE_SECONDS, MAX_POLL_SECONDS} from '../../src/deployment/config.js'
import {parseDeployment} from '../../src/deployment/load.js'
import {PdError, badInput} from '../../src/errors.js'
import {DRAIN_WAIT_MS} from '../../src/experiment/batch.js'
import {LEASE_TTL_MAX_MS, leaseTtlMs} from '../../src/faults/lease/lease.js'

const dir = mkdtempSync(join(tmpdir(), 'pdchaos-bounds-'))
afterAll(() => rmSync(dir, {recursive: true, force: true}))

describe('the lease cap covers the largest watchdog the deployment file accepts', () => {
  it(
    "a batch's default lease for the longest deadline and poll stays under the cap (it would be cut short " +
      'otherwise)',
    () => {
      // As runBatch computes it (experiment/batch.ts): the window, its margin, the drain and 30 s more, over the
      // window.
      const windowMs = (MAX_DEADLINE_SECONDS + MAX_POLL_SECONDS) * 1000
      const marginMs = Math.max(2000, windowMs * 0.2)
      const raw =
        (MAX_DEADLINE_SECONDS + MAX_POLL_SECONDS) * 1000 + windowMs + marginMs + DRAIN_WAIT_MS + 30_000 + 30_000
      expect(raw).toBeLessThan(LEASE_TTL_MAX_MS)
      expect(
        leaseTtlMs({
          deadlineSeconds: MAX_DEADLINE_SECONDS,
          pollSeconds: MAX_POLL_SECONDS,
          holdMs: windowMs + marginMs + DRAIN_WAIT_MS + 30_000,
        }),
      ).toBe(raw)
    },
  )

  it('--ttl must cover deadline + poll + margin, and the shortest such TTL is under the cap', () => {
    expect(minRunTtlSeconds({deadlineSeconds: 2, pollSeconds: 0.5})).toBe(8)
    expect(
      minRunTtlSeconds({deadlineSeconds: MAX_DEADLINE_SECONDS, pollSeconds: MAX_POLL_SECONDS}) * 1000,
    ).toBeLessThan(LEASE_TTL_MAX_MS)
    expect(() => checkRunTtl(1, {deadlineSeconds: 2, pollSeconds: 0.5}, 'run')).toThrow(
      /--ttl 1 is shorter than the run needs: 8 s/,
    )
    expect(() => checkRunTtl(20, {deadlineSeconds: 2, pollSeconds: 0.5}, 'run')).not.toThrow()
    // A held fault is not judged: any TTL holds it that long.
    expect(() => checkRunTtl(1, {deadlineSeconds: 2, pollSeconds: 0.5}, 'hold')).not.toThrow()
  })
})

describe('output paths and URLs, before a run', () => {
  it('refuses a path under a regular file, a directory, and a path under /proc, without hanging', () => {
    writeFileSync(join(dir, 'file'), 'x')
    expect(() => checkOutputFile('--junit', join(dir, 'file', 'junit.xml'))).toThrow(/a part of its path is a file/)
    expect(() => checkOutputFile('--html', dir)).toThrow(/is a directory/)
    expect(() => checkOutputFile('--junit', '/proc/nope/x')).toThrow(/--junit \/proc\/nope\/x cannot be written/)
  })

  it('accepts a new file in new directories, leaving neither the file nor the directories behind (issue 28)', () => {
    const out = join(dir, 'a', 'b', 'run.json')
    checkOutputFile('--journal', out)
    expect(existsSync(join(dir, 'a')), 'a run that then writes nothing leaves no directory').toBe(false)
    expect(makeParents(join(dir, 'c', 'd', 'x'))).toEqual([join(dir, 'c'), join(dir, 'c', 'd')])
    expect(() => writeFileSync(join(dir, 'c', 'd', 'x'), '{}')).not.toThrow()
  })

  it('checks --push as an http(s) URL, never echoing a password', () => {
    expect(() => checkPushUrl('--push', 'not a url')).toThrow(/is not a URL/)
    expect(() => checkPushUrl('--push', 'ftp://h:9091')).toThrow(/http/)
    expect(() => checkPushUrl('--push', 'ftp://admin:S3cret@h:9091')).toThrow(/^(?!.*S3cret)/)
    expect(() => checkPushUrl('--push', 'http://127.0.0.1:9091')).not.toThrow()
  })
})

describe('error documents', () => {
  it('a PdError, an oclif parse error and an unexpected error share one shape, each with a code', () => {
    expect(errorDocument(badInput('bad', 'fix it')).error).toEqual({
      code: 'E_INPUT',
      exitCode: 2,
      message: 'bad',
      name: 'PdError',
      suggestions: ['fix it'],
    })
    const parse = Object.assign(new Error('Nonexistent flag: --x\nSee more help with --help'), {oclif: {exit: 2}})
    expect(errorDocument(parse, 'status').error).toEqual({
      code: 'E_INPUT',
      exitCode: 2,
      message: 'Nonexistent flag: --x',
      name: 'Error',
      suggestions: ['`pdchaos status --help` lists what it takes'],
    })
    const odd = errorDocument(new TypeError('x is not a function'))
    expect(odd.error).toMatchObject({code: 'E_INTERNAL', exitCode: 5, message: 'x is not a function'})
    expect(errorDocument(new PdError('gone', {exit: 5})).error.code).toBe('E_UNREACHABLE')
  })
})

describe('the deployment file: service URLs and the watchdog contract (exit 2 naming the path)', () => {
  const file = (url: string, watchdog = '{deadlineSeconds: 2, pollSeconds: 0.5}'): string =>
    `host: {kind: local}\nservices:\n  prefill: {url: "${url}"}\n  decode: {url: "http://127.0.0.1:2"}\n  router: ` +
    `{url: "http://127.0.0.1:3"}\nwatchdog: ${watchdog}\n`
  const refusal = (text: string): string => {
    try {
      parseDeployment(text, 'd.yaml')
    } catch (error) {
      expect(error).toBeInstanceOf(PdError)
      expect((error as PdError).exitCode).toBe(2)
      return (error as PdError).message
    }
    throw new Error('accepted')
  }

  it.each([
    'ftp://127.0.0.1:21',
    'file:///etc/passwd',
    'javascript:alert(1)',
    'http://127.0.0.1:0',
    'http://127.0.0.1:70000',
    'not a url',
  ])('refuses %s', url => {
    expect(refusal(file(url))).toMatch(
      /^d\.yaml: services\.prefill\.url: url must (be an http:\/\/ or https:\/\/ URL|have a port from 1 to 65535)/,
    )
  })

  it('accepts http and https URLs, and refuses a poll longer than the deadline', () => {
    expect(parseDeployment(file('https://10.0.0.5:30000'), 'd.yaml').services.prefill.url).toBe(
      'https://10.0.0.5:30000',
    )
    expect(refusal(file('http://127.0.0.1:1', '{deadlineSeconds: 2, pollSeconds: 5}'))).toMatch(
      /watchdog\.pollSeconds \(5\) is longer than watchdog\.deadlineSeconds \(2\)/,
    )
    expect(
      refusal(file('http://127.0.0.1:1', `{deadlineSeconds: ${MAX_DEADLINE_SECONDS + 1}, pollSeconds: 1}`)),
    ).toMatch(/watchdog\.deadlineSeconds/)
  })
})
