import {execFileSync, spawn} from 'node:child_process'
import {chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {isSameProcess, refOf, type ProcRef} from '../../src/sim/lifecycle/procs.js'
import {MARKER} from '../../src/sim/lifecycle/state-marker.js'
import {runCli} from '../e2e/cli.js'
import {missingRoot, missingTool, requireSystemLevel, skipWithout} from '../harness/level.js'

/**
 * Issue 12, S2, from the CLI as root: `sim up` never clears a directory pdchaos did not make for a twin, and
 * `sim down` never signals a process because a file someone else could write says so (nobody plants the lock).
 */

const skip = skipWithout('the twin state dir guard tests', missingRoot(), missingTool('/usr/bin/setpriv', 'util-linux'))
let root: string
let victim: ProcRef | undefined

const expectOneLine = (stderr: string, ...parts: string[]): void => {
  const lines = stderr
    .trim()
    .split('\n')
    .filter(l => l.startsWith('Error: '))
  expect(lines, stderr).toHaveLength(1)
  for (const p of parts) expect(lines[0], stderr).toContain(p)
  expect(stderr).not.toMatch(/\n\s+at /)
}

describe.skipIf(skip)('twin state dirs from the CLI (issue 12, S2)', () => {
  beforeAll(() => {
    requireSystemLevel('sim up/down as a subprocess')
    root = mkdtempSync(join(tmpdir(), 'pdchaos-state-guard-'))
    chmodSync(root, 0o755)
    // A root process an attacker would like root to kill.
    const child = spawn('sleep', ['300'], {detached: true, stdio: 'ignore'})
    child.unref()
    victim = refOf(child.pid!)
  })
  afterAll(() => {
    if (victim) {
      try {
        process.kill(victim.pid, 'SIGKILL')
      } catch {
        /* gone */
      }
    }
    rmSync(root, {recursive: true, force: true})
  })

  it('sim up --state-dir on a project dir exits 2 in one line, and its deployment file and logs survive', async () => {
    const dir = join(root, 'project')
    mkdirSync(join(dir, 'logs'), {recursive: true})
    writeFileSync(join(dir, 'pdchaos.yaml'), 'host: {kind: ssh, hostname: gpu-01}\n# the real one\n')
    writeFileSync(join(dir, 'logs', 'keep.log'), 'keep me\n')
    const r = await runCli(['sim', 'up', '--state-dir', dir], {timeoutMs: 60_000})
    expect(r.code, r.stderr).toBe(2)
    expectOneLine(r.stderr, `${dir} is not empty and is not a twin state dir made by pdchaos (no ${MARKER})`)
    const j = await runCli(['sim', 'up', '--state-dir', dir, '--json'], {timeoutMs: 60_000})
    expect(j.code).toBe(2)
    expect((JSON.parse(j.stdout) as {error: {code: string}}).error.code).toBe('E_INPUT')
    expect(readFileSync(join(dir, 'pdchaos.yaml'), 'utf8')).toContain('# the real one')
    expect(readFileSync(join(dir, 'logs', 'keep.log'), 'utf8')).toBe('keep me\n')
  })

  it(
    'a lock nobody planted in a twin dir others can write: sim down as root refuses (exit 2) and kills ' + 'nothing',
    async () => {
      const dir = join(root, 'shared-twin')
      mkdirSync(dir, {mode: 0o777})
      chmodSync(dir, 0o777)
      writeFileSync(join(dir, MARKER), 'planted\n')
      const lock = JSON.stringify({owner: {pid: 0, start: ''}, createdAt: 0, services: {router: victim}})
      execFileSync(
        'setpriv',
        [
          '--reuid=nobody',
          '--regid=nogroup',
          '--clear-groups',
          'sh',
          '-c',
          'printf "%s" "$2" > "$1/sim.lock"',
          'sh',
          dir,
          lock,
        ],
        {timeout: 10_000},
      )
      const r = await runCli(['sim', 'down', '--state-dir', dir], {timeoutMs: 60_000})
      expect(r.code, r.stdout + r.stderr).toBe(2)
      expectOneLine(
        r.stderr,
        `refusing to stop the processes named in ${join(dir, 'sim.lock')}`,
        'can be written by group or others',
      )
      expect(isSameProcess(victim), 'the planted lock got a root process killed').toBe(true)
      // Locked down by its owner later, the planted lock is still nobody's: still refused.
      chmodSync(dir, 0o700)
      const again = await runCli(['sim', 'down', '--state-dir', dir], {timeoutMs: 60_000})
      expect(again.code).toBe(2)
      expectOneLine(again.stderr, 'is owned by uid 65534')
      expect(isSameProcess(victim)).toBe(true)
      expect(existsSync(join(dir, 'sim.lock'))).toBe(true)
    },
  )
})
