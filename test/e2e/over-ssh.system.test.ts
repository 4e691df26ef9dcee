import {existsSync, readdirSync} from 'node:fs'
import {join} from 'node:path'

import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {createTestHost, type TestHost} from '../harness/test-host.js'
import {evictionOf as evictionOfIn, expectDroppedPin, runCli} from './cli.js'

// One namespace host for the file: sshd inside, the twin inside (started over SSH), pdchaos on the root side.
// Deadline 2 s, poll 0.5 s: short enough for a test, long enough that early and late are far apart.
const DEADLINE = 2
const POLL = 0.5
let host: TestHost

beforeAll(async () => {
  host = await createTestHost({twin: {deadlineSeconds: DEADLINE, pollSeconds: POLL}})
}, 120_000)

afterAll(async () => {
  await host?.destroy()
}, 60_000)

const json = (stdout: string): Record<string, any> => JSON.parse(stdout) as Record<string, any>

/** The host is clean of pdchaos: no rules, no active lease, no stopped rank. */
async function assertHostClean(): Promise<void> {
  const nft = await host.netns.run(['nft', 'list', 'ruleset'], {reject: false})
  expect(nft.stdout).not.toMatch(/pdchaos/)
  const ipt = await host.netns.run(['iptables-save'], {reject: false})
  expect(ipt.stdout).not.toMatch(/PDCHAOS/)
  const leases = join(host.leaseStateDir, 'leases')
  const active = existsSync(leases)
    ? readdirSync(leases).filter(f => f.endsWith('.json') || f.endsWith('.revert.sh'))
    : []
  expect(active).toEqual([])
  // The PID namespace is shared with every other test: judge only the processes inside this host's namespace.
  const pids = (await host.netns.run(['ip', 'netns', 'pids', host.netns.name], {reject: false})).stdout
    .split('\n')
    .filter(Boolean)
  const ps = pids.length
    ? await host.netns.run(['ps', '-o', 'stat=,args=', '-p', pids.join(',')], {reject: false})
    : {stdout: ''}
  expect(ps.stdout.split('\n').filter(l => l.startsWith('T') && l.includes('sglang::'))).toEqual([])
}

const evictionOf = (rid: string) => evictionOfIn(host.twin!.stateDir, rid)

describe('pdchaos over SSH into the namespace host', () => {
  it('status discovers services, 8 ranks with their GPUs and ZMQ ports, and the watchdog settings', async () => {
    const r = await runCli(['status', '-c', host.deploymentFile, '--json'])
    expect(r.code).toBe(0)
    const s = json(r.stdout)
    expect(s.deployment.host).toBe(`ssh root@${host.netns.address}:22`)
    expect(s.ranks).toHaveLength(8)
    const prefill = s.ranks.filter((k: any) => k.service === 'prefill')
    expect(prefill.map((k: any) => k.gpu)).toEqual([0, 1, 2, 3])
    expect(s.ranks.filter((k: any) => k.service === 'decode').map((k: any) => k.gpu)).toEqual([4, 5, 6, 7])
    expect(prefill.every((k: any) => Number.isInteger(k.zmqPort) && k.zmqHost === host.netns.address)).toBe(true)
    expect(s.watchdog.prefillEnv).toEqual({scope: 'all', deadlineSeconds: DEADLINE, pollSeconds: POLL})
    expect(s.warnings.filter((w: string) => /watchdog/.test(w))).toEqual([])
  })

  it(
    'inject drop-dest-info: pins sit in Bootstrapping, the watchdog evicts them in its window, the host is clean ' +
      'after',
    async () => {
      const r = await runCli(['inject', 'drop-dest-info', '-c', host.deploymentFile, '--json', '--pins', '3'])
      const j = json(r.stdout)
      expect(j.summary.failed, JSON.stringify(j.verdicts.filter((v: any) => v.verdict === 'fail'))).toBe(0)
      expect(r.code).toBe(0)
      expect(j.pins).toHaveLength(3)
      expect(j.leases[0]).toMatchObject({verifiedInjected: true, verifiedClean: true})
      // Ground truth: each pin held in Bootstrapping, evicted from the bootstrap queue in its window, as pdchaos
      // measured.
      for (const pin of j.pins) expectDroppedPin(host.twin!.stateDir, pin, DEADLINE, POLL)
      await assertHostClean()
    },
  )

  it('inject stall-kv with a packet filter: the pin sits in Transferring and is evicted in its window', async () => {
    const r = await runCli([
      'inject',
      'stall-kv',
      '--gpu',
      '1',
      '--mechanism',
      'packet-filter',
      '-c',
      host.deploymentFile,
      '--json',
      '--pins',
      '2',
    ])
    const j = json(r.stdout)
    expect(j.mechanism).toBe('packet-filter')
    expect(j.summary.failed, JSON.stringify(j.verdicts.filter((v: any) => v.verdict === 'fail'))).toBe(0)
    for (const pin of j.pins) {
      const t = evictionOf(pin.rid)
      expect(t.states.at(-1)).toBe('KVPoll.Transferring')
      expect(t.queue).toBe('inflight')
    }
    await assertHostClean()
  })

  it('inject abort-mid-transfer: every trial gets its own verdict and the host is clean after', async () => {
    const r = await runCli(['inject', 'abort-mid-transfer', '--trials', '6', '-c', host.deploymentFile, '--json'])
    const j = json(r.stdout)
    const trials = j.verdicts.filter((v: any) => v.check === 'abort')
    expect(trials).toHaveLength(6)
    // Each trial passes, or (an abort that fired before its request left the bootstrap queue: on a loaded machine the
    // window opens later than calibration measured) is unverified and not counted. Nothing fails on a correct twin.
    const passed = trials.filter((v: any) => v.verdict === 'pass')
    expect(
      trials.every((v: any) => v.verdict === 'pass' || (v.verdict === 'unverified' && /not counted/.test(v.summary))),
      JSON.stringify(trials),
    ).toBe(true)
    // Coverage: the widening filter held the KV transfer, and at least half the aborts landed in the window, each a
    // pass.
    expect(j.abortCoverage, JSON.stringify(j.abortCoverage)).toMatchObject({
      trials: 6,
      inWindow: passed.length,
      verified: true,
      window: {widening: 'packet-filter'},
    })
    expect(passed.length).toBeGreaterThanOrEqual(3)
    expect(j.abortCoverage.filterMatchedPackets).toBeGreaterThan(0)
    expect(j.aborts.map((t: any) => t.rid).sort()).toEqual(trials.map((v: any) => v.subject).sort())
    expect(r.code).toBe(0)
    await assertHostClean()
  })

  it('--dry-run shows the plan, runs read-only probes and changes nothing', async () => {
    const before = await host.netns.run(['nft', 'list', 'ruleset'], {reject: false})
    const r = await runCli(['inject', 'drop-dest-info', '-c', host.deploymentFile, '--dry-run', '--json'])
    expect(r.code).toBe(0)
    const j = json(r.stdout)
    expect(j.plan.inject.join('\n')).toMatch(/nft/)
    expect(j.dryRun.probes.length).toBeGreaterThan(0)
    expect(j.pins).toEqual([])
    const after = await host.netns.run(['nft', 'list', 'ruleset'], {reject: false})
    expect(after.stdout).toBe(before.stdout)
    await assertHostClean()
  })

  it('recover finds nothing to do on a clean host, twice', async () => {
    for (let i = 0; i < 2; i++) {
      const r = await runCli(['recover', '-c', host.deploymentFile, '--json'])
      expect(r.code).toBe(0)
      expect(json(r.stdout).alreadyClean).toBe(true)
    }
  })

  it('refuses a deployment labelled production unless --allow-production', async () => {
    const {readFileSync, writeFileSync} = await import('node:fs')
    const prod = join(host.dir, 'prod.yaml')
    writeFileSync(
      prod,
      readFileSync(host.deploymentFile, 'utf8').replace(/environment: \w+/, 'environment: production'),
    )
    const r = await runCli(['inject', 'drop-dest-info', '-c', prod])
    expect(r.code).toBe(2)
    expect(r.stderr).toMatch(/refusing to inject a fault into deployment .* environment: production/)
    expect(r.stderr).toMatch(/--allow-production/)
    expect(r.stderr).not.toMatch(/\n\s+at /)
  })
})
