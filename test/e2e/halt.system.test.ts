import {execFileSync} from 'node:child_process'
import {existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {nftTableName} from '../../src/faults/mechanisms/packet-filter.js'
import {simDown} from '../../src/sim/lifecycle/down.js'
import {createTestHost, SMALL_TWIN, type TestHost} from '../harness/test-host.js'
import {upOnFreePorts} from '../sim/lifecycle-helpers.js'
import {runCli, startCli} from './cli.js'

/**
 * Issue 32, the kill switch, end to end on the twin: `pdchaos halt` from a second process stops a suite mid-batch (exit
 * 3, its journal written with the unfinished scenarios "halted", nothing left on the host: no nft table of the run, no
 * armed lease, no reverter, no lock); a new run refuses while halted (exit 2) and runs again after `pdchaos resume`; a
 * suite SIGKILLed with its fault in place has the fault taken out by the lease's host-side reverter on the halt, long
 * before the lease's TTL. Latencies are measured from the moment the halt file appears on the host.
 */

let dir: string
let stateDir: string
let deploymentFile: string
const target = (): string[] => ['--sim', '--state-dir', dir]
const sleep = (ms: number) => new Promise(r => setTimeout(r, ms))

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'pdchaos-test-halt-'))
  deploymentFile = (await upOnFreePorts({stateDir: dir, deadlineS: 3, pollS: 0.5, waitS: 60})).deploymentFile
  stateDir = join(dir, 'host-state')
}, 120_000)

afterAll(async () => {
  if (dir) {
    await runCli(['resume', ...target()]).catch(() => undefined)
    await simDown(dir)
    rmSync(dir, {recursive: true, force: true})
  }
}, 60_000)

/** Run `pdchaos halt`; when its file appeared on the host (performance.now(), polled every 5 ms). */
async function halt(reason: string): Promise<{at: number; code: number | null; stdout: string}> {
  const file = join(stateDir, 'halt.json')
  const {child, done} = startCli(['halt', ...target(), '--reason', reason])
  let at = 0
  while (at === 0) {
    if (existsSync(file)) at = performance.now()
    else if (child.exitCode !== null) break
    else await sleep(5)
  }
  const r = await done
  return {at: at || performance.now(), code: r.code, stdout: r.stdout}
}

function reverterOf(lease: string): string {
  try {
    return execFileSync('pgrep', ['-f', `pdchaos-reverter watch ${stateDir} ${lease}`], {encoding: 'utf8'})
  } catch {
    return ''
  }
}

function nftTables(): string {
  return execFileSync('nft', ['list', 'tables'], {encoding: 'utf8'})
}

const armed = (): string[] => readdirSync(join(stateDir, 'leases')).filter(f => f.endsWith('.json'))

/** Nothing of the run's lease left: done, not armed, no reverter, no nft table; and no run lock. */
function expectNothingLeft(stderr: string, lock = true): void {
  const lease = /under lease (\S+)/.exec(stderr)?.[1]
  expect(lease, stderr).toBeDefined()
  expect(armed(), 'armed leases').toEqual([])
  expect(existsSync(join(stateDir, 'leases', 'done', `${lease}.json`))).toBe(true)
  if (lock) expect(existsSync(join(stateDir, 'lock.json')), 'run lock').toBe(false)
  expect(reverterOf(lease!), 'reverter still running').toBe('')
  expect(nftTables(), "the fault's nft table").not.toContain(nftTableName(lease!))
}

describe('pdchaos halt (issue 32)', () => {
  it('halts a suite mid-batch from a second process: exit 3 within 2 s, journal with every unfinished scenario ' +
    'halted, nothing left on the host', async () => {
    const suite = join(dir, 'two.yaml')
    const journal = join(dir, 'run.json')
    const junit = join(dir, 'junit.xml')
    writeFileSync(
      suite,
      'scenarios:\n  - {name: dd1, fault: drop-dest-info, pins: 2}\n  - {name: dd2, fault: drop-dest-info, pins: 2}\n' +
        'stop: {kernelXid: false}\n',
    )
    const cli = startCli(['suite', suite, ...target(), '--one-at-a-time', '--journal', journal, '--junit', junit], {
      NO_COLOR: '1',
    })
    const killer = setTimeout(() => cli.child.kill('SIGKILL'), 120_000)
    let stderr = ''
    const observing = new Promise<void>(resolve => {
      cli.child.stderr!.on('data', (d: Buffer) => {
        stderr += d.toString()
        if (/waiting for evictions/.test(stderr)) resolve()
      })
    })
    await Promise.race([observing, cli.done])
    expect(stderr).toMatch(/waiting for evictions/)
    expect(nftTables()).toContain(nftTableName(/under lease (\S+)/.exec(stderr)![1]!))
    const h = await halt('e2e: INC-1 prefill on fire')
    expect(h.code).toBe(0)
    const r = await cli.done
    clearTimeout(killer)
    const exitMs = performance.now() - h.at
    console.log(`halt → suite exit: ${exitMs.toFixed(0)} ms`)
    expect(r.code, r.stderr).toBe(3)
    expect(exitMs, r.stderr).toBeLessThan(2000)
    expect(r.stderr).toMatch(/HALT: halted by \S+@\S+ at \S+: e2e: INC-1 prefill on fire/)
    expect(r.stdout).toMatch(/STOPPED: halted by \S+@\S+ at \S+: e2e: INC-1 prefill on fire/)
    const j = JSON.parse(readFileSync(journal, 'utf8'))
    expect(j.stopped.halt).toMatchObject({reason: 'e2e: INC-1 prefill on fire'})
    expect(j.stopped.reason).toMatch(/^halted by /)
    expect(j.scenarios.map((s: {name: string; status?: string}) => [s.name, s.status])).toEqual([
      ['dd1', 'halted'],
      ['dd2', 'halted'],
    ])
    expect(readFileSync(junit, 'utf8').match(/<skipped message="halted: halted by /g)).toHaveLength(2)
    expectNothingLeft(r.stderr)
  }, 180_000)

  it('while halted a new inject refuses before touching anything (exit 2, who, when, why, resume); after ' +
    '`pdchaos resume` it runs', async () => {
    const before = readdirSync(join(stateDir, 'leases', 'done')).length
    const r = await runCli(['inject', 'drop-dest-info', ...target(), '--pins', '1'])
    expect(r.code, r.stderr).toBe(2)
    expect(r.stderr).toMatch(
      /^Error: the deployment is halted by \S+@\S+ at \S+: e2e: INC-1 prefill on fire; no chaos runs until it is resumed$/m,
    )
    expect(r.stderr).toMatch(/^Try this: pdchaos resume --sim --state-dir /m)
    expect(readdirSync(join(stateDir, 'leases', 'done')).length, 'a lease was made').toBe(before)
    expect(existsSync(join(stateDir, 'lock.json')), 'the lock was taken').toBe(false)
    const status = await runCli(['status', ...target()])
    expect(status.stdout).toMatch(/^HALTED {4}halted by .*e2e: INC-1 prefill on fire$/m)
    // A fleet's member refuses too (each is its own run), and --fleet halts and resumes every deployment of the fleet.
    const fleet = join(dir, 'fleet.yaml')
    writeFileSync(fleet, `deployments:\n  - {name: twin, deployment: ${JSON.stringify(deploymentFile)}}\n`)
    const member = await runCli(['suite', '--fleet', fleet])
    expect(member.code, member.stdout + member.stderr).toBe(2)
    expect(member.stdout + member.stderr).toMatch(/halted by \S+ at \S+: e2e: INC-1 prefill on fire/)
    const twice = await runCli(['halt', '--fleet', fleet, '--reason', 'a second halt'])
    expect(twice.code, twice.stderr).toBe(0)
    expect(twice.stdout).toMatch(/^twin on host \(local\): already halted by \S+ at \S+: e2e: INC-1 prefill on fire$/m)
    const resumed = await runCli(['resume', '--fleet', fleet])
    expect(resumed.code, resumed.stderr).toBe(0)
    expect(resumed.stdout).toMatch(/resumed by .*it was halted by/)
    expect(existsSync(join(stateDir, 'halt.json'))).toBe(false)
    const dry = await runCli(['inject', 'drop-dest-info', ...target(), '--dry-run'])
    expect(dry.code, dry.stderr).toBe(0)
  }, 180_000)

  it('a SIGKILLed suite: its fault is taken out by the host-side reverter on the halt, long before its TTL', async () => {
    const suite = join(dir, 'one.yaml')
    writeFileSync(suite, 'scenarios:\n  - {name: dd, fault: drop-dest-info, pins: 2}\nstop: {kernelXid: false}\n')
    const cli = startCli(['suite', suite, ...target()], {NO_COLOR: '1'})
    let stderr = ''
    const observing = new Promise<void>(resolve => {
      cli.child.stderr!.on('data', (d: Buffer) => {
        stderr += d.toString()
        if (/waiting for evictions/.test(stderr)) resolve()
      })
    })
    await Promise.race([observing, cli.done, sleep(120_000)])
    cli.child.kill('SIGKILL')
    await cli.done
    const lease = /under lease (\S+)/.exec(stderr)?.[1]
    expect(lease, stderr).toBeDefined()
    const leaseFile = JSON.parse(readFileSync(join(stateDir, 'leases', `${lease}.json`), 'utf8'))
    expect(armed()).toEqual([`${lease}.json`])
    expect(nftTables()).toContain(nftTableName(lease!))
    expect(reverterOf(lease!)).not.toBe('')
    const h = await halt('e2e: reverter')
    const haltWall = Date.now() - (performance.now() - h.at)
    let cleanMs = Infinity
    for (let waited = 0; waited < 10_000; waited += 100) {
      if (armed().length === 0 && reverterOf(lease!) === '') {
        cleanMs = performance.now() - h.at
        break
      }
      await sleep(100)
    }
    const done = JSON.parse(readFileSync(join(stateDir, 'leases', 'done', `${lease}.json`), 'utf8'))
    console.log(
      `halt → reverter reverted: ${Math.round(done.revertedAt - haltWall)} ms (clean seen after ${cleanMs.toFixed(0)} ms); ` +
        `TTL left at the halt: ${Math.round(leaseFile.expiresAt - haltWall)} ms`,
    )
    expect(done.revertedBy).toBe('reverter')
    expect(done.exitStatus).toBe(0)
    // Reverted on the halt, not at its TTL: the lease had tens of seconds left.
    expect(leaseFile.expiresAt - done.revertedAt).toBeGreaterThan(10_000)
    expect(cleanMs).toBeLessThan(5000)
    expectNothingLeft(stderr, false)
    await runCli(['resume', ...target()])
  }, 180_000)
})

describe('pdchaos halt, a co-restart (issue 32)', () => {
  it('a restart halted in its pin watch exits 3 within 2 s, naming the halt and what was restarted', async () => {
    const cli = startCli(['restart', ...target(), '--service', 'router', '--settle', '0', '--watch', '60'], {
      NO_COLOR: '1',
    })
    let stderr = ''
    const watching = new Promise<void>(resolve => {
      cli.child.stderr!.on('data', (d: Buffer) => {
        stderr += d.toString()
        if (/watching for pins/.test(stderr)) resolve()
      })
    })
    await Promise.race([watching, cli.done, sleep(120_000)])
    expect(stderr).toMatch(/watching for pins/)
    const h = await halt('e2e: restart')
    const r = await cli.done
    const exitMs = performance.now() - h.at
    console.log(`halt → restart exit: ${exitMs.toFixed(0)} ms`)
    expect(r.code, r.stderr).toBe(3)
    expect(exitMs, r.stderr).toBeLessThan(2000)
    expect(r.stderr).toMatch(/^Error: halted by \S+ at \S+: e2e: restart during the pin watch: restarted router/m)
    expect(existsSync(join(stateDir, 'lock.json')), 'run lock').toBe(false)
    expect((await runCli(['resume', ...target()])).code).toBe(0)
  }, 180_000)
})

describe('pdchaos halt over SSH (a host reached as a real one: its own sshd and network namespace)', () => {
  let host: TestHost | undefined
  beforeAll(async () => {
    host = await createTestHost({twin: {...SMALL_TWIN, deadlineSeconds: 3, pollSeconds: 0.5}})
  }, 180_000)
  afterAll(async () => {
    await host?.destroy()
  }, 60_000)

  it('an inject over SSH halted from a second process exits 3, the fault out of the host; the next one refuses ' +
    'until resume', async () => {
    const h = host!
    const tables = async (): Promise<string> => (await h.netns.run(['nft', 'list', 'tables'], {reject: false})).stdout
    const cli = startCli(['inject', 'drop-dest-info', '-c', h.deploymentFile, '--pins', '2'], {NO_COLOR: '1'})
    let stderr = ''
    const observing = new Promise<void>(resolve => {
      cli.child.stderr!.on('data', (d: Buffer) => {
        stderr += d.toString()
        if (/waiting for evictions/.test(stderr)) resolve()
      })
    })
    await Promise.race([observing, cli.done, sleep(120_000)])
    expect(await tables(), stderr).toMatch(/pdchaos_/)
    // The deployment's state dir on the host (test-host.ts writes it as stateDir: in the deployment file).
    const hostState = join(h.dir, 'host-run')
    const file = join(hostState, 'halt.json')
    const halting = runCli(['halt', '-c', h.deploymentFile, '--reason', 'e2e over ssh'])
    let at = 0
    for (let i = 0; i < 6000 && at === 0; i++) {
      if (existsSync(file)) at = performance.now()
      else await sleep(5)
    }
    expect(at, 'the halt file never appeared').toBeGreaterThan(0)
    const r = await cli.done
    const exitMs = performance.now() - at
    console.log(`over SSH: halt → inject exit: ${exitMs.toFixed(0)} ms`)
    expect((await halting).code).toBe(0)
    expect(r.code, r.stderr).toBe(3)
    expect(exitMs, r.stderr).toBeLessThan(2000)
    expect(await tables()).not.toMatch(/pdchaos_/)
    expect(readdirSync(join(hostState, 'leases')).filter(f => f.endsWith('.json'))).toEqual([])
    const refused = await runCli(['inject', 'drop-dest-info', '-c', h.deploymentFile, '--pins', '1'])
    expect(refused.code, refused.stderr).toBe(2)
    expect(refused.stderr).toMatch(/^Error: the deployment is halted by \S+ at \S+: e2e over ssh; /m)
    expect(refused.stderr).toMatch(/^Try this: pdchaos resume -c /m)
    expect((await runCli(['resume', '-c', h.deploymentFile])).code).toBe(0)
    expect(existsSync(file)).toBe(false)
  }, 240_000)
})
