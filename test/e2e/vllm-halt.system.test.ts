import {execFile} from 'node:child_process'
import {existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {promisify} from 'node:util'

import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {nftTableName} from '../../src/faults/mechanisms/packet-filter.js'
import {freeVllmPorts} from '../sim/lifecycle-helpers.js'
import {progressLines, runCli, startCli} from './cli.js'

/**
 * The on-call commands on a vLLM deployment (issue 31, round 2), end to end on a vLLM twin of its own (lease 3 s, free
 * ports, its own state dir): `pdchaos halt` writes the halt file in the file's stateDir on its host (the same file and
 * checks as SGLang's), `status` shows it, a new inject or restart is refused (exit 2, E_HALTED, before anything is
 * planned), a vLLM suite under way stops (exit 3, the halt and the halted scenario in its journal), `resume` lifts it
 * (by -c and by --sim --engine vllm). `recover` reverts the nft table of a stall-kv whose pdchaos was SIGKILLed while
 * it held the READ stalled, and resumes a D a SIGKILLed wedge-rank left stopped (root: nft); a halt makes a lease's
 * reverter act at once. A fleet with the vLLM deployment runs its vLLM suite (exit 0, its journal engine vllm), is
 * halted and resumed with --fleet, and refuses an SGLang suite for it (exit 2).
 */

const run = promisify(execFile)
const isRoot = process.getuid?.() === 0
let root: string
let dir: string
let file: string

interface Journal {
  engine?: string
  stopped?: {reason: string; halt?: {by: string; reason: string}}
  scenarios: Array<{name: string; status?: string; verdicts: Array<{check: string; verdict: string}>}>
}

const haltFile = (): string => join(dir, 'host-state', 'halt.json')
const journalOf = (f: string): Journal => JSON.parse(readFileSync(f, 'utf8')) as Journal
const twin = (): string[] => ['--sim', '--engine', 'vllm', '--state-dir', dir]
const QUICK_SUITE =
  'engine: vllm\nname: quick-vllm\nscenarios:\n  - {fault: drop-dest-info, pins: 1}\ncoRestart: false\n'

async function nftTables(): Promise<string[]> {
  const {stdout} = await run('nft', ['-j', 'list', 'tables'])
  return (JSON.parse(stdout) as {nftables: Array<{table?: {name: string}}>}).nftables.flatMap(o =>
    o.table ? [o.table.name] : [],
  )
}

/** An inject stall-kv SIGKILLed while it holds P's READ stalled: its lease id (its nft table and lease left behind). */
async function stallKilled(): Promise<string> {
  const {child, done} = startCli(['inject', 'stall-kv', '-c', file])
  const lines = progressLines(child)
  const killer = setTimeout(() => child.kill('SIGKILL'), 120_000)
  try {
    await lines.waitFor(/observing .* with the READ stalled/, 90_000)
    const leaseId = /lease (stall-kv-\S+),/.exec(lines.lines.map(l => l.text).join('\n'))?.[1]
    child.kill('SIGKILL')
    await done
    expect(leaseId).toBeDefined()
    return leaseId!
  } finally {
    clearTimeout(killer)
  }
}

/** D's process tree on the twin (from status's pid and ps): its size, and the processes stopped (state T). */
async function decodeTree(): Promise<{size: number; stopped: string[]}> {
  const status = await runCli(['status', '-c', file, '--json'], {timeoutMs: 60_000})
  const servers = (JSON.parse(status.stdout) as {servers: Array<{role: string; pid?: number}>}).servers
  const rows = (await run('ps', ['-eo', 'pid=,ppid=,stat=,args='])).stdout
    .split('\n')
    .map(l => /^\s*(\d+)\s+(\d+)\s+(\S+)\s+(.*)$/.exec(l))
    .filter(m => m !== null)
    .map(m => ({pid: Number(m[1]), ppid: Number(m[2]), stat: m[3]!, args: m[4]!}))
  const tree = new Set([servers.find(s => s.role === 'decode')!.pid])
  for (let grew = true; grew; ) {
    grew = false
    for (const r of rows) if (tree.has(r.ppid) && !tree.has(r.pid)) grew = tree.add(r.pid) !== undefined
  }
  return {size: tree.size, stopped: rows.filter(r => tree.has(r.pid) && r.stat.startsWith('T')).map(r => r.args)}
}

beforeAll(async () => {
  root = mkdtempSync(join(process.env.TMPDIR ?? tmpdir(), 'vllm-halt-'))
  dir = join(root, 'tw')
  file = join(dir, 'pdchaos.yaml')
  writeFileSync(join(root, 'quick.yaml'), QUICK_SUITE)
  const {base, side} = await freeVllmPorts()
  const args = ['sim', 'up', '--engine', 'vllm', '--state-dir', dir, '--base-port', String(base)]
  const r = await runCli([...args, '--side-channel-port', String(side), '--kv-lease-duration', '3'], {
    timeoutMs: 60_000,
  })
  if (r.code !== 0) throw new Error(`sim up failed: ${r.stderr}`)
}, 90_000)

afterAll(async () => {
  await runCli(['sim', 'down', '--state-dir', dir], {timeoutMs: 30_000}).catch(() => undefined)
  rmSync(root, {recursive: true, force: true})
}, 60_000)

describe('pdchaos halt / resume / recover / --fleet on an engine: vllm deployment', () => {
  it('halt writes the halt file, status shows it, a new inject or restart is refused (exit 2), resume lifts it', async () => {
    const h = await runCli(['halt', '-c', file, '--reason', 'INC-31: P OOMs', '--json'], {timeoutMs: 30_000})
    expect(h.code, h.stderr).toBe(0)
    const record = JSON.parse(readFileSync(haltFile(), 'utf8')) as {pdchaos: number; by: string; reason: string}
    expect([record.pdchaos, record.reason]).toEqual([1, 'INC-31: P OOMs'])
    // A second halt keeps the first record (from the twin's own form of the target).
    const again = await runCli(['halt', ...twin(), '--reason', 'later'], {timeoutMs: 30_000})
    expect(again.code, again.stderr).toBe(0)
    expect(again.stdout).toContain('already halted by')
    expect(again.stdout).toContain('INC-31: P OOMs')

    const status = await runCli(['status', '-c', file, '--json'], {timeoutMs: 60_000})
    expect(status.code, status.stderr).toBe(0)
    const sj = JSON.parse(status.stdout) as {halt?: {reason: string}; hostState?: {leases: unknown[]}}
    expect(sj.halt?.reason).toBe('INC-31: P OOMs')
    expect(sj.hostState?.leases).toEqual([])
    const text = await runCli(['status', '-c', file], {timeoutMs: 60_000})
    expect(text.stdout).toMatch(/^HALTED {6}halted by .*: INC-31: P OOMs$/m)

    const inject = await runCli(['inject', 'drop-dest-info', '-c', file, '--pins', '1'], {timeoutMs: 60_000})
    expect(inject.code, inject.stderr).toBe(2)
    expect(inject.stderr).toMatch(/^Error: the deployment is halted by .*: INC-31: P OOMs; no chaos runs until/m)
    expect(inject.stderr).toContain(`Try this: pdchaos resume -c ${file}`)
    // Refused before anything was discovered or planned: no plan printed, nothing sent to P.
    expect(inject.stdout).toBe('')

    // So is the vLLM co-restart (it restarts the deployment's services).
    const restart = await runCli(['restart', '-c', file], {timeoutMs: 60_000})
    expect(restart.code, restart.stderr).toBe(2)
    expect(restart.stderr).toMatch(/^Error: the deployment is halted by .*: INC-31: P OOMs/m)

    const resumed = await runCli(['resume', ...twin()], {timeoutMs: 30_000})
    expect(resumed.code, resumed.stderr).toBe(0)
    expect(resumed.stdout).toMatch(/resumed by .*; it was halted by .*: INC-31: P OOMs/)
    expect(existsSync(haltFile())).toBe(false)
    const twice = await runCli(['resume', '-c', file], {timeoutMs: 30_000})
    expect([twice.code, twice.stdout.trim()]).toEqual([0, 'pdchaos-twin-vllm on host (local): was not halted'])
    const restarted = await runCli(['restart', '-c', file, '--json'], {timeoutMs: 120_000})
    expect(restarted.code, restarted.stderr).toBe(0)
  }, 180_000)

  it('`pdchaos halt` while a vLLM suite waits a lease out stops it: exit 3, the halt in its journal', async () => {
    const journal = join(root, 'halted.json')
    const cli = startCli(['suite', join(root, 'quick.yaml'), '-c', file, '--journal', journal])
    const lines = progressLines(cli.child)
    const killer = setTimeout(() => cli.child.kill('SIGKILL'), 120_000)
    try {
      await lines.waitFor(/waiting [\d.]+ s for every window to close/, 90_000)
      const h = await runCli(['halt', ...twin(), '--reason', 'INC-32'], {timeoutMs: 30_000})
      const haltedAt = performance.now()
      expect(h.code, h.stderr).toBe(0)
      const exitedAt = await cli.done.then(() => performance.now())
      const r = await cli.done
      expect(r.code, r.stderr).toBe(3)
      expect(r.stderr).toMatch(/HALT: halted by .*: INC-32/)
      const j = journalOf(journal)
      expect(j.engine).toBe('vllm')
      expect(j.stopped?.halt?.reason).toBe('INC-32')
      expect(j.scenarios.map(s => [s.name, s.status])).toEqual([['drop-dest-info (vllm)', 'halted']])
      // A wide bound (the poll is 400 ms): the run stopped long before its 4.5 s of waiting was out.
      console.log(`vllm-halt: suite exited ${((exitedAt - haltedAt) / 1000).toFixed(2)} s after halt returned`)
      expect(exitedAt - haltedAt).toBeLessThan(30_000)
      // Halted, a new suite is refused; resumed, it runs to its verdict.
      const refused = await runCli(['suite', join(root, 'quick.yaml'), ...twin(), '--json'], {timeoutMs: 60_000})
      expect(refused.code, refused.stderr).toBe(2)
      expect(refused.stdout).toContain('E_HALTED')
    } finally {
      clearTimeout(killer)
      await runCli(['resume', '-c', file], {timeoutMs: 30_000})
    }
    expect(existsSync(haltFile())).toBe(false)
    const after = await runCli(['suite', join(root, 'quick.yaml'), '-c', file], {timeoutMs: 90_000})
    expect(after.code, after.stderr).toBe(0)
  }, 300_000)

  it.skipIf(!isRoot)(
    'recover reverts the nft table of a stall-kv whose pdchaos was SIGKILLed',
    async () => {
      const leaseId = await stallKilled()
      // Left on the host: the table and the armed lease (its reverter would revert it only at its TTL).
      expect(await nftTables()).toContain(nftTableName(leaseId))
      const status = await runCli(['status', '-c', file, '--json'], {timeoutMs: 60_000})
      const sj = JSON.parse(status.stdout) as {hostState?: {leases: Array<{id: string}>}}
      expect(sj.hostState?.leases.map(l => l.id)).toEqual([leaseId])

      const r = await runCli(['recover', ...twin(), '--json'], {timeoutMs: 60_000})
      expect(r.code, r.stderr).toBe(0)
      const rj = JSON.parse(r.stdout) as {clean: boolean; recovered: Array<{id: string; action: string}>}
      expect(rj.clean).toBe(true)
      expect(rj.recovered.map(o => [o.id, o.action])).toEqual([[leaseId, 'reverted']])
      expect(await nftTables()).not.toContain(nftTableName(leaseId))
      expect(readdirSync(join(dir, 'host-state', 'leases')).filter(f => f.endsWith('.json'))).toEqual([])
      // Idempotent: nothing left the second time.
      const again = await runCli(['recover', '-c', file], {timeoutMs: 60_000})
      expect([again.code, again.stdout.trim()]).toEqual([0, `nothing to recover on local (${join(dir, 'host-state')})`])
    },
    180_000,
  )

  it.skipIf(!isRoot)(
    "halt: the lease reverter takes out a SIGKILLed stall-kv's nft table at once",
    async () => {
      const leaseId = await stallKilled()
      const table = nftTableName(leaseId)
      expect(await nftTables()).toContain(table)
      try {
        const h = await runCli(['halt', '-c', file, '--reason', 'INC-34'], {timeoutMs: 30_000})
        expect(h.code, h.stderr).toBe(0)
        const haltedAt = performance.now()
        // The reverter looks for the halt file every step (at most 1 s): a wide deadline, polled.
        let gone = false
        for (let i = 0; i < 100 && !gone; i++) {
          gone = !(await nftTables()).includes(table)
          if (!gone) await new Promise(r => setTimeout(r, 100))
        }
        expect(gone).toBe(true)
        const doneFile = join(dir, 'host-state', 'leases', 'done', `${leaseId}.json`)
        for (let i = 0; i < 50 && !existsSync(doneFile); i++) await new Promise(r => setTimeout(r, 100))
        console.log(
          `vllm-halt: reverter took the table out ${((performance.now() - haltedAt) / 1000).toFixed(2)} s after halt`,
        )
        const done = JSON.parse(readFileSync(doneFile, 'utf8')) as {revertedBy?: string}
        expect(done.revertedBy).toBe('reverter')
      } finally {
        await runCli(['resume', '-c', file], {timeoutMs: 30_000})
        await runCli(['recover', '-c', file], {timeoutMs: 60_000})
      }
    },
    180_000,
  )

  it.skipIf(!isRoot)(
    'recover: a SIGKILLed wedge-rank --side decode leaves D stopped; recover resumes it',
    async () => {
      const {child, done} = startCli(['inject', 'wedge-rank', '--side', 'decode', '-c', file])
      const lines = progressLines(child)
      const killer = setTimeout(() => child.kill('SIGKILL'), 120_000)
      try {
        await lines.waitFor(/waiting [\d.]+ s for every window to close/, 90_000)
        child.kill('SIGKILL')
        await done
      } finally {
        clearTimeout(killer)
      }
      // Left behind: D's processes stopped (state T) under the SIGSTOP lease, and the READ stall's table.
      expect((await decodeTree()).stopped.length).toBeGreaterThan(0)
      const r = await runCli(['recover', '-c', file, '--json'], {timeoutMs: 60_000})
      expect(r.code, r.stderr).toBe(0)
      const rj = JSON.parse(r.stdout) as {clean: boolean; recovered: Array<{fault: string; action: string}>}
      expect(rj.clean).toBe(true)
      expect(rj.recovered.map(o => o.action).every(a => a === 'reverted')).toBe(true)
      expect(rj.recovered.map(o => o.fault)).toContain('wedge-rank')
      const after = await decodeTree()
      expect(after.size).toBeGreaterThan(1)
      expect(after.stopped).toEqual([])
      expect(readdirSync(join(dir, 'host-state', 'leases')).filter(f => f.endsWith('.json'))).toEqual([])
    },
    180_000,
  )

  it('a fleet runs its vLLM deployment with its vLLM suite, is halted and resumed with --fleet', async () => {
    const fleet = join(root, 'fleet.yaml')
    writeFileSync(fleet, `name: mixed\ndeployments:\n  - {name: v1, deployment: ${file}, suite: quick.yaml}\n`)
    const jdir = join(root, 'journals')
    const r = await runCli(['suite', '--fleet', fleet, '--journal-dir', jdir], {timeoutMs: 120_000})
    expect(r.code, r.stderr).toBe(0)
    expect(r.stderr).toContain('[v1] starting: deployment pdchaos-twin-vllm (engine vllm), suite quick-vllm')
    const j = journalOf(join(jdir, 'v1.json'))
    expect(j.engine).toBe('vllm')
    expect(j.scenarios.map(s => [s.name, s.verdicts.map(v => v.verdict)])).toEqual([
      ['drop-dest-info (vllm)', ['pass']],
    ])

    const h = await runCli(['halt', '--fleet', fleet, '--reason', 'INC-33'], {timeoutMs: 30_000})
    expect(h.code, h.stderr).toBe(0)
    expect(h.stdout).toMatch(/^v1 on host \(local\): halted by .*: INC-33$/m)
    const refused = await runCli(['suite', '--fleet', fleet], {timeoutMs: 60_000})
    expect(refused.code, refused.stderr).toBe(2)
    expect(refused.stdout).toMatch(/ERROR v1 .*the deployment is halted by .*: INC-33/)
    const resumed = await runCli(['resume', '--fleet', fleet], {timeoutMs: 30_000})
    expect(resumed.code, resumed.stderr).toBe(0)
    expect(existsSync(haltFile())).toBe(false)

    const sglangSuite = join(root, 'sglang-suite.yaml')
    writeFileSync(sglangSuite, 'name: sg\nscenarios:\n  - {name: dd, fault: drop-dest-info, pins: 1}\n')
    const bad = join(root, 'bad-fleet.yaml')
    writeFileSync(bad, `suite: sglang-suite.yaml\ndeployments:\n  - {name: v1, deployment: ${file}}\n`)
    const wrong = await runCli(['suite', '--fleet', bad], {timeoutMs: 30_000})
    expect(wrong.code, wrong.stderr).toBe(2)
    expect(wrong.stderr).toMatch(/deployment v1 is a vLLM deployment and its suite .* is an SGLang suite file/)
  }, 240_000)
})
