import {existsSync, readdirSync} from 'node:fs'
import {join} from 'node:path'

import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {createTestHost, type TestHost} from '../harness/test-host.js'
import {runCli, startCli} from './cli.js'

// The lease must take the fault out on the host whatever happens to pdchaos: SIGKILL at a random moment, or its
// SSH connection cut. Checked from inside the namespace, never through pdchaos.
let host: TestHost

beforeAll(async () => {
  host = await createTestHost({twin: {deadlineSeconds: 2, pollSeconds: 0.5}})
}, 120_000)

afterAll(async () => {
  await host?.destroy()
}, 60_000)

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms))

async function faultsOnHost(): Promise<{tables: number; activeLeases: string[]}> {
  const nft = await host.netns.run(['nft', 'list', 'tables'], {reject: false})
  const dir = join(host.stateDir, 'leases')
  const activeLeases = existsSync(dir) ? readdirSync(dir).filter((f) => f.endsWith('.json')) : []
  return {tables: (nft.stdout.match(/pdchaos_/g) ?? []).length, activeLeases}
}

/** Poll until the host has no pdchaos rule and no active lease, or the deadline passes. */
async function waitClean(deadlineMs: number): Promise<{tables: number; activeLeases: string[]; afterMs: number}> {
  const started = performance.now()
  let s = await faultsOnHost()
  while ((s.tables > 0 || s.activeLeases.length > 0) && performance.now() - started < deadlineMs) {
    await sleep(100)
    s = await faultsOnHost()
  }
  return {...s, afterMs: performance.now() - started}
}

describe('leases on the host', () => {
  it('SIGKILL of pdchaos mid-fault at random moments: the host reverts within the TTL every time, recover finds nothing', async () => {
    const TTL_S = 4
    const outcomes: Array<{killAtMs: number; injected: boolean; cleanAfterMs: number}> = []
    for (let trial = 0; trial < 20; trial++) {
      const {child, done} = startCli(['inject', 'drop-dest-info', '-c', host.deploymentFile, '--ttl', String(TTL_S), '--pins', '1', '--load-interval', '0'])
      let injected = false
      child.stderr!.on('data', (d: Buffer) => { if (/in place:/.test(d.toString())) injected = true })
      // Kill anywhere from start-up to well inside the fault (injection happens about 1.5-3 s in).
      const killAtMs = 300 + Math.random() * 4500
      await sleep(killAtMs)
      child.kill('SIGKILL')
      await done
      const killedAt = performance.now()
      const clean = await waitClean((TTL_S + 5) * 1000)
      expect(clean, `trial ${trial}: killed at ${killAtMs.toFixed(0)} ms`).toMatchObject({tables: 0, activeLeases: []})
      outcomes.push({killAtMs, injected, cleanAfterMs: performance.now() - killedAt})
      // Everything clean also by pdchaos's own account.
      const rec = await runCli(['recover', '-c', host.deploymentFile, '--json'])
      expect(rec.code).toBe(0)
      expect(JSON.parse(rec.stdout).alreadyClean).toBe(true)
    }
    console.log(`SIGKILL trials: ${outcomes.filter((o) => o.injected).length}/20 killed with the fault in place; clean after kill: max ${Math.max(...outcomes.map((o) => o.cleanAfterMs)).toFixed(0)} ms`)
    // The fault was really in place when killed in a good share of trials (else this test proves little).
    expect(outcomes.filter((o) => o.injected).length).toBeGreaterThanOrEqual(5)
    // Reverted within the TTL (+ the reverter's poll step and this test's own polling).
    expect(Math.max(...outcomes.map((o) => o.cleanAfterMs))).toBeLessThan((TTL_S + 3) * 1000)
  }, 600_000)

  it('with the SSH connection cut mid-fault, pdchaos exits 4 and the lease reverts the host by itself', async () => {
    const {child, done} = startCli(['inject', 'drop-dest-info', '-c', host.deploymentFile, '--ttl', '8', '--pins', '1', '--load-interval', '0'])
    await new Promise<void>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('the fault was never reported in place')), 60_000)
      child.stderr!.on('data', (d: Buffer) => {
        if (/in place:/.test(d.toString())) { clearTimeout(timer); resolve() }
      })
    })
    expect((await faultsOnHost()).tables).toBe(1)
    // Cut the connection: kill every sshd in the namespace (the listener and the session).
    const pids = (await host.netns.run(['pgrep', '-f', 'sshd'], {reject: false})).stdout.split('\n').filter(Boolean)
    expect(pids.length).toBeGreaterThan(0)
    await host.netns.run(['kill', '-KILL', ...pids], {reject: false})
    const r = await done
    expect(r.code).toBe(4)
    expect(r.stderr).toMatch(/cleanup unverified/)
    expect(r.stderr).toMatch(/reverts it by itself/)
    const clean = await waitClean(15_000)
    expect(clean).toMatchObject({tables: 0, activeLeases: []})
  }, 120_000)
})
