import {execFileSync} from 'node:child_process'
import {
  chmodSync,
  chownSync,
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readFileSync,
  rmSync,
  statSync,
  symlinkSync,
  truncateSync,
  writeFileSync,
} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {PdError} from '../../src/errors.js'
import {acquireHostLock} from '../../src/faults/lease/host-lock.js'
import {MAX_LEASE_FILE_BYTES} from '../../src/faults/lease/host-safety.js'
import {createLease, listLeases, revertLease} from '../../src/faults/lease/lease.js'
import {recoverAll} from '../../src/faults/lease/recover.js'
import {LocalHost} from '../../src/hosts/local-host.js'
import {SshHost, resolveSshEndpoint} from '../../src/hosts/ssh-host.js'
import {runCli} from '../e2e/cli.js'
import {missingRoot, missingTool, requireSystemLevel, skipWithout} from '../harness/level.js'
import {startSshd} from '../harness/sshd.js'
import {eventually} from '../hosts/proc.js'
import {reverters, revertersUnder} from './lease-helpers.js'

/**
 * Issue 12, S1: root never runs what another user planted in the state dir. As root, with `nobody` planting files
 * (setpriv), pdchaos must refuse the state dir or the lease, name the file and its owner in one line, exit 2, and
 * never run the planted script (it would write `id` into a "pwned" file).
 */

const skip = skipWithout('the planted-lease tests', missingRoot(), missingTool('/usr/bin/setpriv', 'util-linux'))
const NOBODY = 65_534

let root: string
const host = new LocalHost('never')

/** Run a shell command as nobody:nogroup with no supplementary groups. */
function asNobody(script: string, ...args: string[]): void {
  execFileSync('setpriv', ['--reuid=nobody', '--regid=nogroup', '--clear-groups', 'sh', '-c', script, 'sh', ...args], {
    stdio: 'pipe',
    timeout: 10_000,
  })
}

/** A lease as an attacker would plant it: its JSON and a revert script that records who ran it. */
const PLANT =
  `mkdir -p "$1/leases" && printf '%s' '{"id":"evil-1","fault":"drop-dest-info","expiresAt":1}' > ` +
  `"$1/leases/evil-1.json" &&
printf 'id -u > %s\\n' "$2" > "$1/leases/evil-1.revert.sh"`

/** A deployment file for the local host with this state dir (recover never probes the services). */
function deploymentFile(stateDir: string): string {
  const file = join(stateDir + '.yaml')
  writeFileSync(
    file,
    [
      'host: {kind: local}',
      `stateDir: ${stateDir}`,
      'services:',
      '  prefill: {url: "http://127.0.0.1:1"}',
      '  decode: {url: "http://127.0.0.1:1"}',
      '  router: {url: "http://127.0.0.1:1"}',
      'watchdog: {deadlineSeconds: 5, pollSeconds: 1}',
      '',
    ].join('\n'),
  )
  return file
}

/** A fresh case: its state dir path, and where the planted script would write if anyone ran it. */
function freshCase(name: string): {dir: string; pwned: string} {
  mkdirSync(join(root, 'pwned'), {recursive: true})
  return {dir: join(root, name), pwned: join(root, 'pwned', name)}
}

const expectOneLineRefusal = (text: string, ...parts: string[]): void => {
  const lines = text
    .trim()
    .split('\n')
    .filter(l => l.startsWith('Error: '))
  expect(lines, text).toHaveLength(1)
  for (const p of parts) expect(lines[0], text).toContain(p)
  expect(text).not.toMatch(/\n\s+at /)
}

describe.skipIf(skip)('planted leases and unsafe state dirs are refused (issue 12, S1)', () => {
  beforeAll(() => {
    requireSystemLevel('planting files as nobody')
    root = mkdtempSync(join(tmpdir(), 'pdchaos-unsafe-'))
    chmodSync(root, 0o755)
  })
  afterAll(async () => {
    for (const pid of revertersUnder(root)) {
      try {
        process.kill(pid, 'SIGKILL')
      } catch {
        /* gone */
      }
    }
    rmSync(root, {recursive: true, force: true})
  })

  it(
    'the repro: a state dir others can write, a lease planted by nobody; recover as root exits 2 naming the dir, ' +
      'runs nothing',
    async () => {
      const {dir, pwned} = freshCase('shared')
      mkdirSync(dir, {mode: 0o777})
      chmodSync(dir, 0o777)
      asNobody(PLANT, dir, pwned)
      expect(statSync(join(dir, 'leases', 'evil-1.revert.sh')).uid).toBe(NOBODY)

      const r = await runCli(['recover', '-c', deploymentFile(dir)], {timeoutMs: 60_000})
      expect(r.code, r.stderr).toBe(2)
      expectOneLineRefusal(r.stderr, dir, 'owner root', 'can be written by group or others', 'drwxrwxrwx')
      expect(existsSync(pwned), 'the planted script ran').toBe(false)

      const j = await runCli(['recover', '-c', deploymentFile(dir), '--json'], {timeoutMs: 60_000})
      expect(j.code).toBe(2)
      const doc = JSON.parse(j.stdout) as {error: {code: string; message: string}}
      expect(doc.error.code).toBe('E_UNSAFE_STATE_DIR')
      expect(existsSync(pwned)).toBe(false)
    },
  )

  it('a state dir owned by nobody: refused, naming nobody', async () => {
    const {dir, pwned} = freshCase('owned')
    mkdirSync(dir, {mode: 0o700})
    chownSync(dir, NOBODY, NOBODY)
    asNobody(PLANT, dir, pwned)
    const err = await recoverAll(host, dir).catch((e: unknown) => e)
    expect(err).toBeInstanceOf(PdError)
    expect((err as PdError).exitCode).toBe(2)
    expect((err as PdError).message).toContain(
      `${dir} (owner nobody, uid ${NOBODY}) is owned by another user, not by root`,
    )
    expect(existsSync(pwned)).toBe(false)
  })

  it(
    'a private state dir that still holds files nobody planted earlier: recover reverts ours, refuses theirs by ' +
      'name and owner',
    async () => {
      const {dir, pwned} = freshCase('planted')
      mkdirSync(dir, {mode: 0o777})
      chmodSync(dir, 0o777)
      asNobody(PLANT, dir, pwned)
      // The admin locks the dir down afterwards; what nobody planted is still there, still nobody's.
      chmodSync(dir, 0o700)
      chmodSync(join(dir, 'leases'), 0o700)
      chownSync(join(dir, 'leases'), 0, 0)
      const mark = join(root, 'planted.ours')
      const ours = await createLease(host, dir, {
        fault: 'drop-dest-info',
        ttlMs: 60_000,
        revert: [['touch', mark]],
        command: 'test',
      })

      const listing = await listLeases(host, dir)
      expect(listing.unsafe.map(u => u.path).sort()).toEqual([
        join(dir, 'leases', 'evil-1.json'),
        join(dir, 'leases', 'evil-1.revert.sh'),
      ])
      expect(listing.active.find(a => a.id === 'evil-1')?.unsafe?.owner).toBe('nobody')
      expect(listing.active.find(a => a.id === 'evil-1')?.fault, 'an unsafe lease file is never read').toBeUndefined()

      // --all: our lease's owner (this test process) is still alive.
      const r = await runCli(['recover', '-c', deploymentFile(dir), '--all'], {timeoutMs: 60_000})
      expect(r.code, r.stdout + r.stderr).toBe(2)
      expect(r.stdout).toContain(`reverted  ${ours.id}`)
      expect(r.stdout).toMatch(/REFUSED\s+evil-1 .*owner nobody, uid 65534/)
      expect(r.stdout).toContain("local: 1 lease(s) refused: another user's files, not run")
      expectOneLineRefusal(r.stderr, 'leases/evil-1', 'owner nobody')
      expect(existsSync(mark), 'our own lease is reverted').toBe(true)
      expect(existsSync(pwned), 'the planted script ran').toBe(false)
      // Asked directly, the host-side reverter refuses too.
      const direct = await revertLease(host, dir, 'evil-1', 'recover').catch((e: unknown) => e)
      expect((direct as PdError).code).toBe('E_UNSAFE_STATE_DIR')
      expect(existsSync(pwned)).toBe(false)
    },
  )

  it('a revert script that is a symbolic link (even to a root-owned script) is refused', async () => {
    const {dir, pwned} = freshCase('symlink')
    mkdirSync(join(dir, 'leases'), {recursive: true, mode: 0o700})
    chmodSync(dir, 0o700)
    const target = join(root, 'symlink-target.sh')
    writeFileSync(target, `id -u > ${pwned}\n`, {mode: 0o600})
    writeFileSync(join(dir, 'leases', 'evil-2.json'), '{"id":"evil-2","fault":"drop-dest-info"}', {mode: 0o600})
    symlinkSync(target, join(dir, 'leases', 'evil-2.revert.sh'))
    const report = await recoverAll(host, dir)
    const o = report.recovered.find(x => x.id === 'evil-2')!
    expect(o.action).toBe('refused')
    expect(o.why).toContain('evil-2.revert.sh (owner root, uid 0) is a symbolic link')
    expect(existsSync(pwned)).toBe(false)
  })

  it(
    'a lease file that is a FIFO or larger than 1 MiB: recover refuses each by name, at once (never opened), exit ' +
      "2; our own lease is reverted; a revert of the FIFO's lease refuses it too",
    async () => {
      const {dir, pwned} = freshCase('nodes')
      mkdirSync(join(dir, 'leases', 'done'), {recursive: true, mode: 0o700})
      chmodSync(dir, 0o700)
      const leases = join(dir, 'leases')
      // Private nodes in this test's own temp dir: a FIFO no writer will ever open, and a sparse 1 MiB + 1 file.
      execFileSync('mkfifo', ['-m', '600', join(leases, 'fifo-1.json')])
      writeFileSync(join(leases, 'fifo-1.revert.sh'), `id -u > ${pwned}\n`, {mode: 0o600})
      writeFileSync(join(leases, 'big-1.json'), '', {mode: 0o600})
      truncateSync(join(leases, 'big-1.json'), MAX_LEASE_FILE_BYTES + 1)
      const mark = join(root, 'nodes.ours')
      const ours = await createLease(host, dir, {
        fault: 'drop-dest-info',
        ttlMs: 60_000,
        revert: [['touch', mark]],
        command: 'test',
      })
      const r = await runCli(['recover', '-c', deploymentFile(dir), '--all'], {timeoutMs: 60_000})
      expect(r.code, r.stdout + r.stderr).toBe(2)
      expect(r.ms, 'nothing blocked on the FIFO').toBeLessThan(30_000)
      expect(r.stdout).toContain(`reverted  ${ours.id}`)
      expect(r.stdout).toContain(`${join(leases, 'fifo-1.json')} (owner root, uid 0) is a FIFO (named pipe), not a`)
      expect(r.stdout).toMatch(
        new RegExp(`big-1\\.json \\(owner root, uid 0\\) is larger than 1 MiB \\(${MAX_LEASE_FILE_BYTES + 1} bytes\\)`),
      )
      expectOneLineRefusal(r.stderr, 'refusing 2 lease file(s)')
      expect(existsSync(mark), 'our own lease is reverted').toBe(true)
      // The reverter asked for the FIFO's lease directly refuses it by the same check, and runs nothing.
      const direct = await revertLease(host, dir, 'fifo-1', 'recover').catch((e: unknown) => e)
      expect((direct as PdError).code).toBe('E_UNSAFE_STATE_DIR')
      expect((direct as PdError).message).toContain('fifo-1.json (owner root, uid 0) is a FIFO (named pipe)')
      expect(existsSync(pwned), "the FIFO lease's script ran").toBe(false)
    },
  )

  it('inject and the run lock refuse an unsafe state dir before writing anything; / is never a state dir', async () => {
    const {dir} = freshCase('inject')
    mkdirSync(dir, {mode: 0o777})
    chmodSync(dir, 0o777)
    for (const attempt of [
      () => createLease(host, dir, {fault: 'drop-dest-info', ttlMs: 60_000, revert: [['true']], command: 'test'}),
      () => acquireHostLock(host, dir, {command: 'test', ttlMs: 60_000}),
    ]) {
      const err = await attempt().catch((e: unknown) => e)
      expect((err as PdError).code).toBe('E_UNSAFE_STATE_DIR')
      expect((err as PdError).exitCode).toBe(2)
    }
    expect(existsSync(join(dir, 'lock.json'))).toBe(false)
    expect(existsSync(join(dir, 'leases'))).toBe(false)
    expect(reverters(dir)).toEqual([])
    for (const bad of ['/', '/run/../etc', 'relative/dir', '/tmp//x', '/tmp/x/']) {
      const err = await acquireHostLock(host, bad, {command: 'test', ttlMs: 1000}).catch((e: unknown) => e)
      expect((err as PdError).exitCode, bad).toBe(2)
    }
  })

  it('a fresh state dir is made private: dirs 0700, lease files and the lock 0600 (S7)', async () => {
    const dir = join(root, 'fresh', 'state')
    const lock = await acquireHostLock(host, dir, {command: 'test', ttlMs: 60_000})
    const lease = await createLease(host, dir, {
      fault: 'drop-dest-info',
      ttlMs: 60_000,
      revert: [['true']],
      command: 'test',
    })
    try {
      for (const d of [join(root, 'fresh'), dir, join(dir, 'leases'), join(dir, 'leases', 'done')])
        expect(statSync(d).mode & 0o777, d).toBe(0o700)
      for (const f of [
        'lock.json',
        `leases/${lease.id}.json`,
        `leases/${lease.id}.revert.sh`,
        `leases/${lease.id}.log`,
      ]) {
        expect(lstatSync(join(dir, f)).mode & 0o777, f).toBe(0o600)
      }
      expect(existsSync(join(dir, 'bin')), 'no reverter file to swap: it runs from its text').toBe(false)
    } finally {
      await revertLease(host, dir, lease.id)
      await lock.release()
    }
    expect(await eventually(() => reverters(dir).length === 0, 5000)).toBe(true)
    expect(readFileSync(join(dir, 'leases', 'done', `${lease.id}.json`), 'utf8')).toContain('"exitStatus":0')
  })

  it.skipIf(missingTool('/usr/bin/tcsh', 'tcsh') !== undefined)(
    'over ssh, with tcsh as the login shell: the host-side checks refuse the planted lease the same way',
    async () => {
      const {dir, pwned} = freshCase('over-ssh')
      mkdirSync(dir, {mode: 0o777})
      chmodSync(dir, 0o777)
      asNobody(PLANT, dir, pwned)
      chmodSync(dir, 0o700)
      chownSync(join(dir, 'leases'), 0, 0)
      chmodSync(join(dir, 'leases'), 0o700)
      const sshd = await startSshd({loginShell: '/usr/bin/tcsh'})
      writeFileSync(`${sshd.dir}/known_hosts`, sshd.knownHostsLine)
      const ssh = new SshHost(
        await resolveSshEndpoint(
          {
            kind: 'ssh',
            hostname: sshd.host,
            port: sshd.port,
            user: 'root',
            identityFile: sshd.clientKeyPath,
            knownHosts: `${sshd.dir}/known_hosts`,
            connectTimeoutSeconds: 10,
          },
          {sshConfigPath: '/nonexistent'},
        ),
      )
      try {
        const report = await recoverAll(ssh, dir)
        const o = report.recovered.find(x => x.id === 'evil-1')!
        expect(o.action).toBe('refused')
        expect(o.why).toContain('(owner nobody, uid 65534) is owned by another user, not by root')
        expect(existsSync(pwned)).toBe(false)
      } finally {
        await ssh.close()
        await sshd.stop()
      }
    },
  )
})
