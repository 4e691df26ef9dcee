import {spawn} from 'node:child_process'
import {chmodSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {afterAll, describe, expect, it} from 'vitest'

import {simDown} from '../../src/sim/lifecycle/down.js'
import {writeDeploymentFile} from '../../src/sim/lifecycle/deployment-file.js'
import {buildSimConfig} from '../../src/sim/lifecycle/options.js'
import {isSameProcess, refOf} from '../../src/sim/lifecycle/procs.js'
import {SimError} from '../../src/sim/lifecycle/sim-error.js'
import {assertOwnDeploymentFile, claimStateDir, MARKER, untrustedBecause} from '../../src/sim/lifecycle/state-marker.js'
import {simUp} from '../../src/sim/lifecycle/up.js'

/** Issue 12, S2: sim up/down only clear, rewrite or signal what a twin of pdchaos owns. */

const root = mkdtempSync(join(tmpdir(), 'pdchaos-state-marker-'))
const children: number[] = []
afterAll(() => {
  for (const pid of children) {
    try {
      process.kill(pid, 'SIGKILL')
    } catch {
      /* gone */
    }
  }
  rmSync(root, {recursive: true, force: true})
})

const badInput = (fn: () => unknown): SimError => {
  try {
    fn()
  } catch (error) {
    expect(error).toBeInstanceOf(SimError)
    expect((error as SimError).kind).toBe('bad-input')
    return error as SimError
  }
  throw new Error('expected bad input')
}

/** A project directory: a hand-written deployment file and logs that must survive. */
function project(name: string): string {
  const dir = join(root, name)
  mkdirSync(join(dir, 'logs'), {recursive: true})
  writeFileSync(join(dir, 'pdchaos.yaml'), 'host: {kind: ssh, hostname: gpu-01}\n# the real one\n')
  writeFileSync(join(dir, 'logs', 'keep.log'), 'keep me\n')
  return dir
}

const sleeper = (): number => {
  const child = spawn('sleep', ['60'], {detached: true, stdio: 'ignore'})
  child.unref()
  children.push(child.pid!)
  return child.pid!
}

describe('twin state dirs (issue 12, S2)', () => {
  it('sim up refuses a non-empty dir it did not make, before touching anything in it', async () => {
    const dir = project('project')
    const err = await simUp({stateDir: dir, basePort: 47_000}).catch((e: unknown) => e)
    expect(err).toBeInstanceOf(SimError)
    expect((err as SimError).kind).toBe('bad-input')
    expect((err as SimError).message).toContain(
      `--state-dir ${dir} is not empty and is not a twin state dir made by pdchaos (no ${MARKER})`,
    )
    expect(readFileSync(join(dir, 'pdchaos.yaml'), 'utf8')).toContain('# the real one')
    expect(readFileSync(join(dir, 'logs', 'keep.log'), 'utf8')).toBe('keep me\n')
    expect(existsSync(join(dir, MARKER))).toBe(false)
    expect(existsSync(join(dir, 'sim.lock'))).toBe(false)
  })

  it('a new dir is created private with its marker; an empty one gets the marker', () => {
    const fresh = join(root, 'fresh', 'twin')
    claimStateDir(fresh)
    expect(statSync(fresh).mode & 0o777).toBe(0o700)
    expect(existsSync(join(fresh, MARKER))).toBe(true)
    claimStateDir(fresh) // idempotent: a twin's own dir
    const empty = join(root, 'empty')
    mkdirSync(empty)
    claimStateDir(empty)
    expect(existsSync(join(empty, MARKER))).toBe(true)
    const file = join(root, 'a-file')
    writeFileSync(file, 'x')
    expect(badInput(() => claimStateDir(file)).message).toContain('not a directory')
  })

  it('never overwrites a deployment file pdchaos did not write, even in a twin dir', async () => {
    const dir = join(root, 'twin-edited')
    claimStateDir(dir)
    const config = buildSimConfig({stateDir: dir, basePort: 47_100})
    await writeDeploymentFile(config) // its own: rewritten freely
    await writeDeploymentFile(config)
    writeFileSync(join(dir, 'pdchaos.yaml'), 'host: {kind: local}\n# edited by hand\n')
    const refused = await writeDeploymentFile(config).then(
      () => undefined,
      (error: unknown) => error,
    )
    expect(refused).toBeInstanceOf(SimError)
    expect((refused as SimError).kind).toBe('bad-input')
    expect((refused as SimError).message).toContain(
      `refusing to overwrite ${join(dir, 'pdchaos.yaml')}: pdchaos did not write it`,
    )
    expect(readFileSync(join(dir, 'pdchaos.yaml'), 'utf8')).toContain('edited by hand')
    expect(() => assertOwnDeploymentFile(join(dir, 'none.yaml'))).not.toThrow()
  })

  it('sim down leaves a dir it did not make alone, and never signals a pid whose start time differs', async () => {
    const pid = sleeper()
    const start = refOf(pid)!.start
    // A project dir with a lock naming a live process: not a twin's, so nothing is signalled or removed.
    const dir = project('project-down')
    writeFileSync(
      join(dir, 'sim.lock'),
      JSON.stringify({owner: {pid: 0, start: ''}, createdAt: 0, services: {router: {pid, start}}}),
    )
    expect((await simDown(dir)).stopped).toEqual([])
    expect(isSameProcess({pid, start})).toBe(true)
    expect(existsSync(join(dir, 'sim.lock'))).toBe(true)
    // A twin dir whose lock names the pid with another start time: a recycled pid, never touched.
    const twin = join(root, 'twin-recycled')
    claimStateDir(twin)
    writeFileSync(
      join(twin, 'sim.lock'),
      JSON.stringify({
        owner: {pid: 0, start: ''},
        createdAt: 0,
        services: {router: {pid, start: String(Number(start) + 7)}},
      }),
      {mode: 0o600},
    )
    expect((await simDown(twin)).stopped).toEqual([])
    expect(isSameProcess({pid, start})).toBe(true)
  })

  it('sim down refuses a lock that others can write, naming it', async () => {
    const pid = sleeper()
    const start = refOf(pid)!.start
    const twin = join(root, 'twin-open')
    claimStateDir(twin)
    writeFileSync(
      join(twin, 'sim.lock'),
      JSON.stringify({owner: {pid: 0, start: ''}, createdAt: 0, services: {router: {pid, start}}}),
    )
    chmodSync(join(twin, 'sim.lock'), 0o666)
    expect(untrustedBecause(join(twin, 'sim.lock'))).toContain('can be written by group or others (mode 666)')
    const err = await simDown(twin).catch((e: unknown) => e)
    expect((err as SimError).kind).toBe('bad-input')
    expect((err as SimError).message).toContain(`refusing to stop the processes named in ${join(twin, 'sim.lock')}`)
    expect(isSameProcess({pid, start})).toBe(true)
  })
})
