import {execFileSync, spawnSync} from 'node:child_process'
import {chmodSync, mkdirSync, mkdtempSync, rmSync, statSync, symlinkSync, truncateSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {afterAll, describe, expect, it} from 'vitest'

import {findUnsafe, MAX_LEASE_FILE_BYTES, SAFE_SH, UNSAFE_EXIT} from '../../src/faults/lease/host-safety.js'

/** The host-side checks (issue 12, S1) run by a real sh, as this user: what others could write is refused. */

const root = mkdtempSync(join(tmpdir(), 'pdchaos-host-safety-'))
afterAll(() => rmSync(root, {recursive: true, force: true}))

const run = (script: string, ...args: string[]) => {
  const r = spawnSync('sh', ['-c', SAFE_SH + script, 'sh', ...args], {encoding: 'utf8', timeout: 10_000})
  return {code: r.status, stderr: r.stderr, finding: findUnsafe(r.stderr)}
}

describe('host-side safety checks', () => {
  it('pd_make creates a private tree under a sticky /tmp, and accepts it again', () => {
    const dir = join(root, 'made', 'state')
    expect(run('pd_make "$1"', dir).code).toBe(0)
    expect(
      execFileSync('stat', ['-c', '%a', dir, join(dir, 'leases'), join(dir, 'leases', 'done')], {encoding: 'utf8'})
        .split('\n')
        .filter(Boolean),
    ).toEqual(['700', '700', '700'])
    expect(run('pd_make "$1"', dir).code).toBe(0)
  })

  it('refuses a group-writable state dir, naming it, its owner and its mode', () => {
    const dir = join(root, 'group')
    mkdirSync(dir)
    chmodSync(dir, 0o770)
    const r = run('pd_safe_tree "$1"', dir)
    expect(r.code).toBe(UNSAFE_EXIT)
    expect(r.finding).toMatchObject({path: dir, why: 'can be written by group or others (mode drwxrwx---)'})
    expect(r.finding?.uid).toBe(String(process.getuid?.()))
  })

  it('refuses a dir above the state dir that others can write (not sticky), and a state dir that is a symlink', () => {
    const open = join(root, 'open')
    mkdirSync(join(open, 'state'), {recursive: true})
    chmodSync(open, 0o777)
    expect(run('pd_safe_tree "$1"', join(open, 'state')).finding).toMatchObject({
      path: open,
      why: 'can be written by group or others (mode drwxrwxrwx)',
    })
    const real = join(root, 'real')
    mkdirSync(real, {mode: 0o700})
    symlinkSync(real, join(root, 'link'))
    expect(run('pd_safe_tree "$1"', join(root, 'link')).finding).toMatchObject({
      path: join(root, 'link'),
      why: 'is a symbolic link',
    })
    expect(run('pd_safe_tree "$1"', '/').finding?.why).toBe('is the root directory')
  })

  it('refuses a lease file others can write, or a symlink in its place; passes a private one', () => {
    const dir = join(root, 'leasefiles')
    expect(run('pd_make "$1"', dir).code).toBe(0)
    writeFileSync(join(dir, 'leases', 'a.revert.sh'), 'true\n', {mode: 0o600})
    expect(run('pd_safe_lease "$1/leases" a', dir).code).toBe(0)
    chmodSync(join(dir, 'leases', 'a.revert.sh'), 0o666)
    expect(run('pd_safe_lease "$1/leases" a', dir).finding).toMatchObject({
      path: join(dir, 'leases', 'a.revert.sh'),
      why: 'can be written by group or others (mode -rw-rw-rw-)',
    })
    symlinkSync('/etc/hostname', join(dir, 'leases', 'b.json'))
    expect(run('pd_safe_lease "$1/leases" b', dir).finding).toMatchObject({
      path: join(dir, 'leases', 'b.json'),
      why: 'is a symbolic link',
    })
  })

  it('pd_scan all reports every refused file, on stderr, and keeps going', () => {
    const dir = join(root, 'scan')
    mkdirSync(dir, {mode: 0o700})
    for (const n of ['x', 'y', 'z']) {
      writeFileSync(join(dir, n), '')
      chmodSync(join(dir, n), n === 'y' ? 0o600 : 0o622)
    }
    const r = run('pd_scan all f "$@"', join(dir, 'x'), join(dir, 'y'), join(dir, 'z'))
    expect(r.code).toBe(UNSAFE_EXIT)
    expect(
      r.stderr
        .trim()
        .split('\n')
        .map(l => findUnsafe(l)?.path),
    ).toEqual([join(dir, 'x'), join(dir, 'z')])
  })

  it(
    'refuses a lease file that is a FIFO (at once: never opened), a private device node or over 1 MiB; a large ' +
      'log is fine',
    () => {
      const dir = join(root, 'nodes')
      expect(run('pd_make "$1"', dir).code).toBe(0)
      const leases = join(dir, 'leases')
      execFileSync('mkfifo', ['-m', '600', join(leases, 'fifo.json')])
      const t0 = performance.now()
      const fifo = run('pd_safe_lease "$1/leases" fifo && cat "$1/leases/fifo.json"', dir)
      expect(fifo.code).toBe(UNSAFE_EXIT)
      expect(fifo.finding).toMatchObject({
        path: join(leases, 'fifo.json'),
        why: 'is a FIFO (named pipe), not a regular file',
      })
      expect(performance.now() - t0, 'refused by its listing, never opened (a cat would block)').toBeLessThan(5000)
      // An oversize claim: one byte over the cap is refused, naming its size; at the cap it passes.
      writeFileSync(join(leases, 'big.claim'), '', {mode: 0o600})
      truncateSync(join(leases, 'big.claim'), MAX_LEASE_FILE_BYTES + 1)
      expect(run('pd_safe_lease "$1/leases" big', dir).finding).toMatchObject({
        path: join(leases, 'big.claim'),
        why: `is larger than 1 MiB (${MAX_LEASE_FILE_BYTES + 1} bytes), more than a lease or lock file ever holds`,
      })
      truncateSync(join(leases, 'big.claim'), MAX_LEASE_FILE_BYTES)
      expect(run('pd_safe_lease "$1/leases" big', dir).code).toBe(0)
      // A lease's log is appended, never read: its size is not held against it.
      writeFileSync(join(leases, 'log.log'), '', {mode: 0o600})
      truncateSync(join(leases, 'log.log'), 2 * MAX_LEASE_FILE_BYTES)
      expect(run('pd_safe_lease "$1/leases" log', dir).code).toBe(0)
    },
  )

  it.skipIf(process.getuid?.() !== 0)(
    'refuses a lease file that is a character device (a private node made with mknod in a temp dir), by its name',
    () => {
      const dir = join(root, 'device')
      expect(run('pd_make "$1"', dir).code).toBe(0)
      const node = join(dir, 'leases', 'dev.revert.sh')
      // A private copy of /dev/full's numbers: the system's own node is never touched.
      execFileSync('mknod', ['-m', '600', node, 'c', '1', '7'])
      expect(statSync(node).isCharacterDevice()).toBe(true)
      expect(run('pd_safe_lease "$1/leases" dev', dir).finding).toMatchObject({
        path: node,
        why: 'is a character device, not a regular file',
      })
    },
  )
})
