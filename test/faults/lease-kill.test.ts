import {existsSync, mkdtempSync, readFileSync, readdirSync, rmSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {afterAll, describe, expect, it} from 'vitest'

import type {DoneLease} from '../../src/faults/lease/lease.js'
import {recoverAll} from '../../src/faults/lease/recover.js'
import {LocalHost} from '../../src/hosts/local-host.js'
import {killAll} from '../hosts/proc.js'
import {activeFiles, killChild, markerCount, reverters, revertersUnder, sleep, spawnChild, type Child} from './lease-helpers.js'

const TRIALS = 20
const BATCH = 4
const TTL_MS = 2000
/** How late after its expiry the host may revert: generous for a loaded 2-core machine (measured lateness is printed). */
const MARGIN_MS = 2500

const host = new LocalHost()
const root = mkdtempSync(join(tmpdir(), 'pdchaos-lease-kill-'))
const children: Child[] = []
afterAll(() => {
  for (const c of children) killChild(c)
  killAll(revertersUnder(root))
  rmSync(root, {recursive: true, force: true})
})

interface Trial {
  i: number
  killAfterMs: number
  armedBeforeKill: boolean
  lateMs: number | null
}

/** One pdchaos stand-in SIGKILLed at a random moment: during lease creation for even trials, any time later for odd ones. */
async function trial(i: number): Promise<Trial> {
  const dir = join(root, `t${i}`)
  const marker = join(dir, 'marker')
  const child = spawnChild(['plain', dir, marker, String(TTL_MS)])
  children.push(child)
  await child.started
  const killAfterMs = Math.round(Math.random() * (i % 2 === 0 ? 120 : 1500))
  await sleep(killAfterMs)
  const armedBeforeKill = /^LEASE /m.test(child.stdout())
  child.proc.kill('SIGKILL')
  await child.exit
  const killedAt = Date.now()
  // Whatever the moment, within TTL + margin the host holds no active lease, no reverter, and every lease that got
  // written was reverted exactly once, by the reverter.
  const until = killedAt + TTL_MS + MARGIN_MS
  while (Date.now() < until && (activeFiles(dir).length > 0 || reverters(dir).length > 0)) await sleep(50)
  expect(activeFiles(dir), `trial ${i}`).toEqual([])
  expect(reverters(dir), `trial ${i}`).toEqual([])
  const doneDir = join(dir, 'leases', 'done')
  const done = existsSync(doneDir) ? readdirSync(doneDir).filter((f) => f.endsWith('.json')) : []
  expect(markerCount(marker), `trial ${i}`).toBe(done.length)
  if (armedBeforeKill) expect(done.length, `trial ${i}`).toBe(1)
  let lateMs: number | null = null
  for (const f of done) {
    const d = JSON.parse(readFileSync(join(doneDir, f), 'utf8')) as DoneLease
    expect(d, `trial ${i}`).toMatchObject({revertedBy: 'reverter', exitStatus: 0})
    lateMs = d.revertedAt - d.expiresAt
    expect(lateMs).toBeGreaterThanOrEqual(0)
    expect(lateMs).toBeLessThan(MARGIN_MS)
  }
  const rec = await recoverAll(host, dir, {all: true})
  expect(rec, `trial ${i}`).toMatchObject({alreadyClean: true, recovered: []})
  return {i, killAfterMs, armedBeforeKill, lateMs}
}

describe('SIGKILL of the process holding a lease', () => {
  it(`the host reverts within the TTL every time and recover finds nothing (${TRIALS} trials)`, async () => {
    const results: Trial[] = []
    for (let b = 0; b < TRIALS; b += BATCH) {
      results.push(...await Promise.all(Array.from({length: Math.min(BATCH, TRIALS - b)}, (_, k) => trial(b + k))))
    }
    const late = results.map((r) => r.lateMs).filter((x): x is number => x !== null)
    process.stderr.write(`lease-kill: ${results.filter((r) => r.armedBeforeKill).length}/${TRIALS} armed before the kill, ` +
      `${late.length} reverted by the host; lateness after expiry ms: max ${Math.max(...late)}, median ${late.sort((a, b) => a - b)[Math.floor(late.length / 2)]}; ` +
      `kill delays ms: ${results.map((r) => r.killAfterMs).join(',')}\n`)
    expect(results).toHaveLength(TRIALS)
  }, 180_000)
})
