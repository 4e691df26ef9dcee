import {existsSync, mkdtempSync, readFileSync, readdirSync, rmSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {afterAll, describe, expect, it} from 'vitest'

import type {DoneLease} from '../../src/faults/lease/lease.js'
import {recoverAll} from '../../src/faults/lease/recover.js'
import {LocalHost} from '../../src/hosts/local-host.js'
import {killAll} from '../hosts/proc.js'
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

/** Trials whose kill lands after the lease is armed (the child printed it): each must be reverted by the host. */
const ARMED_TRIALS = 10
/** Trials whose kill lands anywhere in lease creation, measured by the armed trials: before, during or just after. */
const RACING_TRIALS = 10
const BATCH = 4
const TTL_MS = 2000
/**
 * How late after its expiry the host may revert: generous for a loaded 2-core machine (measured lateness is printed).
 */
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
  kind: 'armed' | 'racing'
  /** After START (the child is about to create its lease). */
  killAfterMs: number
  /** START → the child printed its armed lease (armed trials). */
  armedAfterMs: number | null
  armedBeforeKill: boolean
  lateMs: number | null
}

/**
 * One pdchaos stand-in SIGKILLed. `armed`: once it has printed its armed lease, after a random delay inside the TTL,
 * so the kill always finds a lease in place. `racing`: a random moment from START over `windowMs` (a little longer
 * than the armed trials took to arm), so kills land before, inside and just after lease creation.
 */
async function trial(i: number, kind: Trial['kind'], windowMs: number): Promise<Trial> {
  const dir = join(root, `t${i}`)
  const marker = join(dir, 'marker')
  const child = spawnChild(['plain', dir, marker, String(TTL_MS)])
  children.push(child)
  await child.started
  const startedAt = performance.now()
  let armedAfterMs: number | null = null
  let killAfterMs: number
  if (kind === 'armed') {
    const lease = await child.lease
    expect(lease, `trial ${i}: the child never armed its lease: ${child.stderr().slice(-500)}`).not.toBeNull()
    armedAfterMs = performance.now() - startedAt
    killAfterMs = armedAfterMs + Math.random() * TTL_MS * 0.75
  } else {
    killAfterMs = Math.random() * windowMs
  }
  await sleep(killAfterMs - (performance.now() - startedAt))
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
  const done = existsSync(doneDir) ? readdirSync(doneDir).filter(f => f.endsWith('.json')) : []
  expect(done.length, `trial ${i}`).toBeLessThanOrEqual(1)
  expect(markerCount(marker), `trial ${i}`).toBe(done.length)
  if (armedBeforeKill) expect(done.length, `trial ${i}: armed before the kill, so the host must revert it`).toBe(1)
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
  return {i, kind, killAfterMs: Math.round(killAfterMs), armedAfterMs, armedBeforeKill, lateMs}
}

async function inBatches(kind: Trial['kind'], first: number, count: number, windowMs: number): Promise<Trial[]> {
  const out: Trial[] = []
  for (let b = 0; b < count; b += BATCH) {
    out.push(
      ...(await Promise.all(
        Array.from({length: Math.min(BATCH, count - b)}, (_, k) => trial(first + b + k, kind, windowMs)),
      )),
    )
  }
  return out
}

const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!

describe('SIGKILL of the process holding a lease', () => {
  it(`the host reverts within the TTL every time and recover finds nothing (${ARMED_TRIALS} armed ` +
    `+ ${RACING_TRIALS} racing trials)`, async () => {
    const armed = await inBatches('armed', 0, ARMED_TRIALS, 0)
    // How long arming took under this load sets the racing window: kills from START to a little past arming.
    const arming = armed.map(r => r.armedAfterMs!)
    const windowMs = Math.max(...arming) * 1.2
    const racing = await inBatches('racing', ARMED_TRIALS, RACING_TRIALS, windowMs)
    const results = [...armed, ...racing]
    const late = results.map(r => r.lateMs).filter((x): x is number => x !== null)
    process.stderr.write(
      `lease-kill: ${results.filter(r => r.armedBeforeKill).length}/${results.length} killed with the lease armed ` +
        `(${racing.filter(r => r.armedBeforeKill).length}/${RACING_TRIALS} of the racing ones); START to armed ms: ` +
        `median ${median(arming).toFixed(0)}, max ${Math.max(...arming).toFixed(0)}; ` +
        `${late.length} reverted by the host, lateness after expiry ms: max ${Math.max(...late)}, ` +
        `median ${median(late)}; ` +
        `racing kill delays ms: ${racing.map(r => r.killAfterMs).join(',')}\n`,
    )
    expect(results).toHaveLength(ARMED_TRIALS + RACING_TRIALS)
    // By design every armed trial was killed with its lease in place, so the revert assertions ran for each of them.
    expect(armed.filter(r => r.armedBeforeKill)).toHaveLength(ARMED_TRIALS)
    expect(late.length).toBeGreaterThanOrEqual(ARMED_TRIALS)
  }, 240_000)
})
