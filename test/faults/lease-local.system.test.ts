import {existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {spawn} from 'node:child_process'
import {runCommand} from '@oclif/test'
import {afterAll, afterEach, describe, expect, it} from 'vitest'

import {PdError} from '../../src/errors.js'
import {
  LEASE_TTL_MAX_MS,
  createLease,
  leaseTtlMs,
  listLeases,
  revertLease,
  type DoneLease,
  type Lease,
} from '../../src/faults/lease/lease.js'
import {recoverAll} from '../../src/faults/lease/recover.js'
import {LocalHost} from '../../src/hosts/local-host.js'
import {alive, eventually, killAll} from '../hosts/proc.js'
import {
  activeFiles,
  killChild,
  markerCount,
  reverters,
  revertersUnder,
  sleep,
  spawnChild,
  type Child,
} from './lease-helpers.js'

const host = new LocalHost()
const root = mkdtempSync(join(tmpdir(), 'pdchaos-lease-'))
let n = 0
/** A fresh state dir and marker per test, so tests never see each other's leases. */
function fresh(): {dir: string; marker: string} {
  const dir = join(root, `s${++n}`)
  return {dir, marker: join(dir, 'marker')}
}
const markerRevert = (marker: string, delayS = 0): string[][] => [
  ['sh', '-c', `sleep ${delayS}; echo reverted >> "$1"`, 'sh', marker],
]
const done = (dir: string, id: string): DoneLease =>
  JSON.parse(readFileSync(join(dir, 'leases', 'done', `${id}.json`), 'utf8')) as DoneLease

const children: Child[] = []
afterEach(() => {
  for (const c of children.splice(0)) killChild(c)
})
afterAll(() => {
  killAll(revertersUnder(root))
  rmSync(root, {recursive: true, force: true})
})

describe('lease on a host (LocalHost)', () => {
  it('the reverter reverts at the TTL when pdchaos never does', async () => {
    const {dir, marker} = fresh()
    const lease = await createLease(host, dir, {
      fault: 'drop-dest-info',
      params: {rank: 0},
      ttlMs: 1000,
      revert: markerRevert(marker),
      command: 'test',
    })
    expect(lease.expiresAt - lease.createdAt).toBe(1000)
    expect(lease.reverter && alive(lease.reverter.pid)).toBe(true)
    expect(activeFiles(dir).sort()).toEqual([`${lease.id}.json`, `${lease.id}.revert.sh`])
    const onHost = JSON.parse(readFileSync(join(dir, 'leases', `${lease.id}.json`), 'utf8')) as Lease
    expect(onHost).toEqual(lease)
    expect(markerCount(marker)).toBe(0)
    expect(await eventually(() => markerCount(marker) === 1, 4000)).toBe(true)
    expect(await eventually(() => activeFiles(dir).length === 0, 2000)).toBe(true)
    const d = done(dir, lease.id)
    expect(d).toMatchObject({revertedBy: 'reverter', exitStatus: 0})
    // Not before the expiry, and well within a second after it (measured ~20-60 ms here).
    expect(d.revertedAt).toBeGreaterThanOrEqual(lease.expiresAt)
    expect(d.revertedAt - lease.expiresAt).toBeLessThan(1500)
    expect(await eventually(() => !alive(lease.reverter!.pid), 2000)).toBe(true)
    expect(readFileSync(join(dir, 'leases', `${lease.id}.log`), 'utf8')).toMatch(
      /reverter claimed the revert[\s\S]*revert script exited 0/,
    )
    // Idempotent: asking afterwards reports who reverted it and runs nothing.
    const again = await revertLease(host, dir, lease.id)
    expect(again).toMatchObject({reverted: false, status: 'already-reverted', byWhom: 'reverter', exitCode: 0})
    expect(markerCount(marker)).toBe(1)
  })

  // Issue 28: the reverter's pid and start time come from a file on the host; a file that names another process
  // (forged,
  // or a mistake) with that process's true start time must not get its group signalled. As `sim down` checks what it
  // stops, the revert checks that the process is this lease's reverter (its command line) before it signals it.
  it("a revert signals only the lease's own reverter, never another process a lease file names", async () => {
    const {dir, marker} = fresh()
    const lease = await createLease(host, dir, {
      fault: 'drop-dest-info',
      params: {rank: 0},
      ttlMs: 60_000,
      revert: markerRevert(marker),
      command: 'test',
    })
    // A decoy leading its own process group, as the reverter does.
    const decoy = spawn('sleep', ['60'], {stdio: 'ignore', detached: true})
    await eventually(() => decoy.pid !== undefined && alive(decoy.pid), 2000)
    const pid = decoy.pid!
    const ticks = Number(readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ')[19])
    const file = join(dir, 'leases', `${lease.id}.json`)
    writeFileSync(
      file,
      readFileSync(file, 'utf8').replace(/"reverter":\{[^}]*\}/, `"reverter":{"pid":${pid},"startTicks":${ticks}}`),
    )
    try {
      expect(await revertLease(host, dir, lease.id)).toMatchObject({reverted: true, status: 'reverted'})
      expect(markerCount(marker)).toBe(1)
      await sleep(300)
      expect(alive(pid), 'the decoy named by the lease file was signalled').toBe(true)
    } finally {
      try {
        process.kill(-pid, 'SIGKILL')
      } catch {
        /* gone */
      }
      killAll([lease.reverter!.pid])
    }
  })

  it('a normal revert runs the script once and cancels the reverter', async () => {
    const {dir, marker} = fresh()
    const lease = await createLease(host, dir, {
      fault: 'stall-kv',
      ttlMs: 1500,
      revert: markerRevert(marker),
      command: 'test',
    })
    const res = await revertLease(host, dir, lease.id)
    expect(res).toMatchObject({reverted: true, status: 'reverted', byWhom: 'pdchaos', exitCode: 0})
    expect(res.output).toContain("+ sh -c 'sleep 0; echo reverted")
    expect(markerCount(marker)).toBe(1)
    expect(await eventually(() => !alive(lease.reverter!.pid), 2000)).toBe(true)
    await sleep(lease.expiresAt - Date.now() + 1000)
    expect(markerCount(marker)).toBe(1)
    expect(activeFiles(dir)).toEqual([])
    expect(done(dir, lease.id)).toMatchObject({revertedBy: 'pdchaos', exitStatus: 0})
    const listing = await listLeases(host, dir)
    expect(listing.active).toEqual([])
    expect(listing.done.map(l => l.id)).toEqual([lease.id])
  })

  it('a revert racing the reverter at the expiry runs the script exactly once', async () => {
    const {dir, marker} = fresh()
    for (const offset of [-15, -5, 0, 5, 15, 30]) {
      const lease = await createLease(host, dir, {
        fault: 'stall-kv',
        ttlMs: 600,
        revert: markerRevert(marker, 0.2),
        command: 'race',
      })
      const before = markerCount(marker)
      await sleep(Math.max(0, lease.expiresAt + offset - Date.now()))
      // pdchaos twice (as a signal handler and the normal path would) against the reverter.
      const results = await Promise.all([revertLease(host, dir, lease.id), revertLease(host, dir, lease.id, 'recover')])
      expect(markerCount(marker) - before, `offset ${offset}`).toBe(1)
      expect(results.filter(r => r.reverted).length).toBeLessThanOrEqual(1)
      const whom = new Set(results.map(r => r.byWhom))
      expect(whom.size, `offset ${offset}: ${JSON.stringify(results)}`).toBe(1)
      expect(results.every(r => r.exitCode === 0)).toBe(true)
    }
    expect(await eventually(() => reverters(dir).length === 0, 3000)).toBe(true)
    expect(activeFiles(dir)).toEqual([])
  })

  it('runs every revert command even when one fails, and reports the failure', async () => {
    const {dir, marker} = fresh()
    const weird = `it's "quoted" $HOME \`id\` ;|& \n newline`
    const out = join(dir, 'literal')
    const lease = await createLease(host, dir, {
      fault: 'drop-dest-info',
      ttlMs: 30_000,
      command: 'test',
      revert: [['false'], ['sh', '-c', 'printf "%s" "$1" > "$2"', 'sh', weird, out], ...markerRevert(marker)],
    })
    const res = await revertLease(host, dir, lease.id)
    expect(res).toMatchObject({reverted: true, exitCode: 1})
    expect(res.output).toMatch(/! exit 1[\s\S]*! 1 of 3 revert commands failed/)
    expect(readFileSync(out, 'utf8')).toBe(weird)
    expect(markerCount(marker)).toBe(1)
  })

  it('refuses a TTL above the maximum (exit 2) and writes nothing', async () => {
    const {dir, marker} = fresh()
    for (const ttlMs of [LEASE_TTL_MAX_MS + 1, 0, 1.5, Number.NaN]) {
      const err = await createLease(host, dir, {
        fault: 'stall-kv',
        ttlMs,
        revert: markerRevert(marker),
        command: 'test',
      }).catch((e: unknown) => e)
      expect(err).toBeInstanceOf(PdError)
      expect((err as PdError).exitCode).toBe(2)
    }
    const noRevert = await createLease(host, dir, {fault: 'stall-kv', ttlMs: 5000, revert: [], command: 'test'}).catch(
      (e: unknown) => e,
    )
    expect((noRevert as PdError).exitCode).toBe(2)
    expect(existsSync(dir)).toBe(false)
    expect(leaseTtlMs({deadlineSeconds: 30, pollSeconds: 5, holdMs: 10_000})).toBe(75_000)
    expect(leaseTtlMs({deadlineSeconds: 86_400, pollSeconds: 5})).toBe(LEASE_TTL_MAX_MS)
  })

  it('recover reverts leases left by a dead process from the files alone, and is idempotent', async () => {
    const {dir, marker} = fresh()
    const child = spawnChild(['plain', dir, marker, '60000'])
    children.push(child)
    const lease = await child.lease
    expect(lease).not.toBeNull()
    child.proc.kill('SIGKILL')
    await child.exit
    // A lease of a process still running here (this test) is left alone unless --all.
    const mine = await createLease(host, dir, {fault: 'stall-kv', ttlMs: 60_000, revert: [['true']], command: 'live'})
    const first = await recoverAll(host, dir)
    expect(first.alreadyClean).toBe(false)
    const byId = new Map(first.recovered.map(o => [o.id, o]))
    expect(byId.get(lease!.id)).toMatchObject({
      action: 'reverted',
      revertedBy: 'recover',
      exitCode: 0,
      clean: true,
      fault: 'test-fault',
    })
    expect(byId.get(mine.id)).toMatchObject({action: 'skipped', clean: false})
    expect(first.remaining).toEqual([mine.id])
    expect(first.clean).toBe(true)
    expect(markerCount(marker)).toBe(1)
    expect(await eventually(() => !alive(lease!.reverter!.pid), 2000)).toBe(true)

    const all = await recoverAll(host, dir, {all: true})
    expect(all.recovered.map(o => [o.id, o.action])).toEqual([[mine.id, 'reverted']])
    expect(all).toMatchObject({clean: true, remaining: []})
    const second = await recoverAll(host, dir, {all: true})
    expect(second).toMatchObject({alreadyClean: true, clean: true, recovered: [], remaining: []})
    expect(markerCount(marker)).toBe(1)
    expect(reverters(dir)).toEqual([])
  })

  it('recover takes over a revert whose claimer died mid-revert', async () => {
    const {dir, marker} = fresh()
    const lease = await createLease(host, dir, {
      fault: 'stall-kv',
      ttlMs: 60_000,
      revert: markerRevert(marker),
      command: 'test',
    })
    // What a pdchaos killed mid-revert leaves: the script claimed by a process that no longer exists.
    const l = join(dir, 'leases')
    await host.run(['mv', join(l, `${lease.id}.revert.sh`), join(l, `${lease.id}.reverting.sh`)], {timeoutMs: 5000})
    writeFileSync(join(l, `${lease.id}.claim`), '999999999 1\n')
    const listing = await listLeases(host, dir)
    expect(listing.active).toMatchObject([{id: lease.id, state: 'reverting'}])
    const r = await recoverAll(host, dir, {all: true})
    expect(r.recovered).toMatchObject([{id: lease.id, action: 'reverted', clean: true}])
    expect(markerCount(marker)).toBe(1)
    expect(readFileSync(join(l, `${lease.id}.log`), 'utf8')).toContain('recover took over a stale claim (999999999 1)')
  })

  it(
    'a claim with no claim file (its claimer died right after the rename) is taken over after a grace ' + 'period',
    async () => {
      const {dir, marker} = fresh()
      const lease = await createLease(host, dir, {
        fault: 'stall-kv',
        ttlMs: 60_000,
        revert: markerRevert(marker),
        command: 'test',
      })
      const l = join(dir, 'leases')
      await host.run(['mv', join(l, `${lease.id}.revert.sh`), join(l, `${lease.id}.reverting.sh`)], {timeoutMs: 5000})
      const t = performance.now()
      const res = await revertLease(host, dir, lease.id, 'pdchaos', {waitMs: 10_000})
      expect(res).toMatchObject({reverted: true, byWhom: 'pdchaos', exitCode: 0})
      expect(performance.now() - t).toBeGreaterThan(2500)
      expect(markerCount(marker)).toBe(1)
      expect(await eventually(() => !alive(lease.reverter!.pid), 2000)).toBe(true)
    },
  )

  it('`pdchaos recover --json` reports each lease, then "nothing to recover" (exit 0 both times)', async () => {
    const {dir, marker} = fresh()
    const file = join(root, `deploy-${n}.yaml`)
    writeFileSync(
      file,
      [
        'host: {kind: local}',
        `stateDir: ${dir}`,
        'services:',
        '  prefill: {url: "http://127.0.0.1:1"}',
        '  decode: {url: "http://127.0.0.1:2"}',
        '  router: {url: "http://127.0.0.1:3"}',
        'watchdog: {deadlineSeconds: 30, pollSeconds: 5}',
        '',
      ].join('\n'),
    )
    const lease = await createLease(host, dir, {
      fault: 'drop-dest-info',
      ttlMs: 60_000,
      revert: markerRevert(marker),
      command: 'test',
    })
    try {
      const first = await runCommand(['recover', '-c', file, '--all', '--json'], {root: process.cwd()})
      expect(first.error).toBeUndefined()
      expect(process.exitCode ?? 0).toBe(0)
      const doc = JSON.parse(first.stdout) as {recovered: Array<{id: string; action: string}>; alreadyClean: boolean}
      expect(doc.alreadyClean).toBe(false)
      expect(doc.recovered).toMatchObject([{id: lease.id, action: 'reverted'}])
      const second = await runCommand(['recover', '-c', file], {root: process.cwd()})
      expect(second.stdout).toMatch(/nothing to recover/)
      expect(process.exitCode ?? 0).toBe(0)
      expect(markerCount(marker)).toBe(1)
    } finally {
      process.exitCode = undefined
    }
  })
})

describe('LeaseGuard: signals revert before exit', () => {
  it('SIGINT reverts every lease and exits 3; a second SIGINT does not skip the revert', async () => {
    const {dir, marker} = fresh()
    const child = spawnChild(['guard', dir, marker, '60000', '1'])
    children.push(child)
    const lease = await child.lease
    expect(lease).not.toBeNull()
    child.proc.kill('SIGINT')
    await sleep(300)
    child.proc.kill('SIGINT')
    const {code} = await child.exit
    expect(code).toBe(3)
    expect(child.stderr()).toMatch(/SIGINT: reverting 1 lease/)
    expect(child.stderr()).toMatch(/SIGINT again: reverts are running/)
    expect(markerCount(marker)).toBe(1)
    expect(activeFiles(dir)).toEqual([])
    expect(done(dir, lease!.id)).toMatchObject({revertedBy: 'pdchaos', exitStatus: 0})
    expect(await eventually(() => !alive(lease!.reverter!.pid), 2000)).toBe(true)
  })

  it('SIGTERM does the same', async () => {
    const {dir, marker} = fresh()
    const child = spawnChild(['guard', dir, marker, '60000'])
    children.push(child)
    expect(await child.lease).not.toBeNull()
    child.proc.kill('SIGTERM')
    expect((await child.exit).code).toBe(3)
    expect(markerCount(marker)).toBe(1)
    expect(activeFiles(dir)).toEqual([])
  })
})
