import {execFileSync, spawnSync} from 'node:child_process'
import {chmodSync, mkdirSync, mkdtempSync, rmSync, symlinkSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {afterAll, describe, expect, it} from 'vitest'

import {findUnsafe, SAFE_SH, UNSAFE_EXIT} from '../../src/faults/lease/host-safety.js'

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
})
