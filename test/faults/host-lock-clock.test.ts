import {chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {afterAll, describe, expect, it} from 'vitest'

import type {PdError} from '../../src/errors.js'
import {acquireHostLock, heldUntil} from '../../src/faults/lease/host-lock.js'
import type {Host, RunOptions} from '../../src/hosts/host.js'
import {LocalHost} from '../../src/hosts/local-host.js'

/**
 * Issue 12, S5: the run lock lives on the host's clock. A host whose clock runs an hour ahead of this machine: a
 * lock written with the local clock would look expired to the next run at once; written with the host's, it holds.
 */

const root = mkdtempSync(join(tmpdir(), 'pdchaos-lock-clock-'))
afterAll(() => rmSync(root, {recursive: true, force: true}))
const AHEAD_MS = 3_600_000

/** This machine, except that `date` answers an hour ahead (a fake date first on PATH). */
function hostAhead(): Host {
  const bin = join(root, 'bin')
  mkdirSync(bin, {recursive: true})
  writeFileSync(
    join(bin, 'date'),
    `#!/bin/sh\nn=$(/bin/date +%s%3N)\ncase "$1" in +%s) echo $(( (n + ${AHEAD_MS}) / 1000 ));; *) echo $(( n ` +
      `+ ${AHEAD_MS} ));; esac\n`,
  )
  chmodSync(join(bin, 'date'), 0o755)
  const local = new LocalHost('never')
  return {
    run: (argv: string[], opts: RunOptions) =>
      local.run(argv, {...opts, env: {...opts.env, PATH: `${bin}:${process.env.PATH ?? '/usr/bin:/bin'}`}}),
    upload: (...a) => local.upload(...a),
    startDetached: (...a) => local.startDetached(...a),
    describe: () => 'local (an hour ahead)',
    close: async () => undefined,
  }
}

describe('the run lock on the host clock (issue 12, S5)', () => {
  it('writes acquiredAt and expiresAt with the host clock, so the next run sees it held', async () => {
    const host = hostAhead()
    const dir = join(root, 'a')
    const before = Date.now()
    const lock = await acquireHostLock(host, dir, {command: 'first', ttlMs: 60_000})
    expect(lock.body.acquiredAt).toBeGreaterThanOrEqual(before + AHEAD_MS)
    expect(lock.body.expiresAt - lock.body.acquiredAt).toBe(60_000)
    const onDisk = JSON.parse(readFileSync(join(dir, 'lock.json'), 'utf8')) as {expiresAt: number}
    expect(onDisk.expiresAt).toBe(lock.body.expiresAt)
    const second = await acquireHostLock(host, dir, {command: 'second', ttlMs: 60_000}).catch((e: unknown) => e)
    expect((second as PdError).code).toBe('E_LOCKED')
    expect((second as PdError).message).toContain('(host clock)')
    await lock.release()
  })

  it('a --hold lock lasts as long as the armed lease it left, even past its own TTL', async () => {
    const host = hostAhead()
    const dir = join(root, 'b')
    const lock = await acquireHostLock(host, dir, {command: 'inject --hold', ttlMs: 1, untilExpiry: true})
    // The lease began later (after calibration) and outlives the lock's own TTL.
    writeFileSync(
      join(dir, 'leases', 'drop-dest-info-x.json'),
      JSON.stringify({
        id: 'drop-dest-info-x',
        params: {note: '"expiresAt":1'},
        expiresAt: lock.body.acquiredAt + 60_000,
      }),
      {mode: 0o600},
    )
    await new Promise(r => setTimeout(r, 20))
    const held = await acquireHostLock(host, dir, {command: 'next', ttlMs: 60_000}).catch((e: unknown) => e)
    expect((held as PdError).code).toBe('E_LOCKED')
    expect((held as PdError).message).toContain(new Date(lock.body.acquiredAt + 60_000).toISOString())
    // Once the lease is gone, the expired hold lock is taken over.
    rmSync(join(dir, 'leases', 'drop-dest-info-x.json'))
    const next = await acquireHostLock(host, dir, {command: 'next', ttlMs: 60_000})
    expect(next.body.command).toBe('next')
    await next.release()
  })

  it('heldUntil: the later of the lock and its leases only for a hold lock', () => {
    expect(heldUntil({expiresAt: 10, untilExpiry: true}, 50)).toBe(50)
    expect(heldUntil({expiresAt: 10}, 50)).toBe(10)
    expect(heldUntil({expiresAt: 90, untilExpiry: true}, 50)).toBe(90)
    expect(heldUntil({}, 50)).toBeUndefined()
  })
})
