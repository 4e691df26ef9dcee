import {type ChildProcess, spawn} from 'node:child_process'
import {readFileSync} from 'node:fs'
import {afterEach, describe, expect, it} from 'vitest'

import type {RankInfo} from '../../src/engines/sglang/discovery/discover.js'
import {type FaultDiscovery, runProbe, waitProbes} from '../../src/faults/fault.js'
import {resolveIdentity, type ProcIdentity} from '../../src/faults/mechanisms/proc-identity.js'
import {buildSigstop, signalArgv} from '../../src/faults/mechanisms/signals.js'
import {wedgeRank} from '../../src/faults/wedge-rank.js'
import {parseFaultParams} from '../../src/faults/params.js'
import {LocalHost} from '../../src/hosts/local-host.js'

/** SIGSTOP/SIGCONT by (pid, start time) against real processes, judged from /proc as the plans judge it. */

const host = new LocalHost()
const children: ChildProcess[] = []

function spawnSleeper(): ChildProcess {
  const c = spawn('sleep', ['60'], {stdio: 'ignore'})
  children.push(c)
  return c
}

function identity(pid: number): ProcIdentity {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
  const rest = stat.slice(stat.lastIndexOf(')') + 2).split(' ')
  return {pid, startTicks: Number(rest[19])}
}

const stateOf = (pid: number): string => {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8')
  return stat.slice(stat.lastIndexOf(')') + 2)[0]!
}

/** The state a signal leads to shows in /proc shortly after kill() returns: poll with a deadline. */
async function settle(pid: number, stopped: boolean): Promise<string> {
  const until = Date.now() + 3000
  while (Date.now() < until && (stateOf(pid) === 'T') !== stopped) await new Promise(r => setTimeout(r, 10))
  return stateOf(pid)
}

async function run(argv: string[]) {
  return host.run(argv, {timeoutMs: 5000})
}

afterEach(() => {
  for (const c of children.splice(0)) {
    try {
      process.kill(c.pid!, 'SIGCONT')
    } catch {
      /* gone */
    }
    c.kill('SIGKILL')
  }
})

describe('sigstop mechanism on real processes', () => {
  it('stops and continues the identified process; probes judge from /proc state', async () => {
    const c = spawnSleeper()
    const id = identity(c.pid!)
    const plan = buildSigstop(id, 'test sleeper')
    expect((await runProbe(host, plan.verifyClean)).ok).toBe(true)
    expect((await runProbe(host, plan.verifyInjected)).ok).toBe(false)

    const inj = await run(plan.inject[0]!)
    expect(inj.stdout).toContain(`SIGSTOP sent to pid ${id.pid}`)
    const v = (await waitProbes(host, [plan.verifyInjected], 3000)).results[0]!
    expect(v).toMatchObject({ok: true})
    expect(stateOf(id.pid)).toBe('T')
    expect(v.evidence).toContain('state T')
    expect((await runProbe(host, plan.verifyClean)).ok).toBe(false)

    await run(plan.revert[0]!)
    expect((await waitProbes(host, [plan.verifyClean], 3000)).ok).toBe(true)
    expect(stateOf(id.pid)).not.toBe('T')
    // Idempotent revert.
    expect((await run(plan.revert[0]!)).code).toBe(0)
    expect(stateOf(id.pid)).not.toBe('T')
  })

  it('refuses a live process whose start time differs (a recycled pid): neither STOP nor CONT reaches it', async () => {
    const c = spawnSleeper()
    const real = identity(c.pid!)
    const stale: ProcIdentity = {pid: real.pid, startTicks: real.startTicks - 1}
    const stop = await run(signalArgv(stale, 'STOP'))
    expect(stop.code).toBe(3)
    expect(stop.stdout).toContain('a different process, not signalled')
    expect(stateOf(real.pid)).not.toBe('T')

    process.kill(real.pid, 'SIGSTOP')
    expect(await settle(real.pid, true)).toBe('T')
    const cont = await run(signalArgv(stale, 'CONT'))
    expect(cont.code).toBe(0) // nothing of ours to continue: revert stays idempotent
    expect(cont.stdout).toContain('not signalled')
    await new Promise(r => setTimeout(r, 100))
    expect(stateOf(real.pid)).toBe('T')
    // The probe of the stale identity does not mistake the other process for ours.
    const v = await runProbe(host, buildSigstop(stale, 'stale').verifyInjected)
    expect(v.ok).toBe(false)
    expect(v.evidence).toContain('another process')
  })

  it('a process that died: STOP refuses (exit 3), CONT is a no-op (exit 0), clean probe says gone', async () => {
    const c = spawnSleeper()
    const id = identity(c.pid!)
    c.kill('SIGKILL')
    await new Promise<void>(r => c.once('exit', () => r()))
    expect((await resolveIdentity(host, id)).kind).not.toBe('same')
    const stop = await run(signalArgv(id, 'STOP'))
    expect(stop.code).toBe(3)
    const cont = await run(signalArgv(id, 'CONT'))
    expect(cont.code).toBe(0)
    const clean = await runProbe(host, buildSigstop(id, 'dead').verifyClean)
    expect(clean.ok).toBe(true)
    expect(clean.evidence).toMatch(/no longer exists|reused/)
  })

  it("wedge-rank --side decode stops the paired decode rank's process, by identity", async () => {
    const prefill = spawnSleeper()
    const decode = spawnSleeper()
    const pid = identity(prefill.pid!)
    const did = identity(decode.pid!)
    const ranks: RankInfo[] = [
      {
        service: 'prefill',
        tpRank: 0,
        pid: pid.pid,
        startTicks: pid.startTicks,
        state: 'S',
        title: 'sglang::scheduler_TP0',
        gpu: 0,
        zmqPort: 5000,
      },
      {
        service: 'decode',
        tpRank: 0,
        pid: did.pid,
        startTicks: did.startTicks,
        state: 'S',
        title: 'sglang::scheduler_TP0',
        gpu: 1,
      },
    ]
    const discovery: FaultDiscovery = {ranks, transport: {backend: 'mooncake', source: 'test'}, servicePorts: []}
    const params = parseFaultParams(wedgeRank, {gpu: 0, side: 'decode'})
    const facts = await wedgeRank.gather(host, discovery, params)
    const plan = wedgeRank.plan({discovery, params, leaseId: 'sig1', facts})
    expect(plan.targets).toEqual([{service: 'decode', tpRank: 0, pid: did.pid, startTicks: did.startTicks, gpu: 1}])
    for (const argv of plan.inject) await run(argv)
    expect((await waitProbes(host, plan.verifyInjected, 3000)).ok).toBe(true)
    expect(stateOf(did.pid)).toBe('T')
    expect(stateOf(pid.pid)).not.toBe('T')
    for (const argv of plan.revert) await run(argv)
    expect((await waitProbes(host, plan.verifyClean, 3000)).ok).toBe(true)
    expect(stateOf(did.pid)).not.toBe('T')
  })
})
