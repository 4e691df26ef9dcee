import {execFileSync, spawn} from 'node:child_process'
import {mkdtempSync, readFileSync, rmSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join, resolve} from 'node:path'

import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {freeVllmPorts} from '../sim/lifecycle-helpers.js'
import {runCli} from './cli.js'
import {parse, stringify} from 'yaml'

import {readLock} from '../../src/sim/lifecycle/lock.js'

/**
 * `pdchaos restart -c` on the vLLM twin's deployment file (issue 31): prefill, decode, then the proxy, each by its
 * restart command and behind its gate, then canaries through the proxy; a failed command or a gate that never passes
 * is a failed verdict (exit 1) and stops there; SIGINT mid-restart exits 3. The twin is torn down in afterAll.
 */
const CLI = resolve('bin/run.js')
const cli = (args: string[]) => runCli(args, {timeoutMs: 150_000})

describe('restart of a vLLM deployment', {timeout: 240_000}, () => {
  const dir = mkdtempSync(join(tmpdir(), 'vllm-restart-'))
  const file = join(dir, 'pdchaos.yaml')
  let base = 0
  const pids = () => {
    const s = readLock(dir)?.services ?? {}
    return {prefill: s.prefill?.pid, decode: s.decode?.pid, router: s.router?.pid}
  }
  /** A copy of the twin's file with one service changed (its restart command or gate). */
  const variant = (name: string, edit: (services: Record<string, Record<string, unknown>>) => void): string => {
    const doc = parse(readFileSync(file, 'utf8')) as {services: Record<string, Record<string, unknown>>}
    edit(doc.services)
    const out = join(dir, `${name}.yaml`)
    writeFileSync(out, stringify(doc))
    return out
  }

  beforeAll(async () => {
    base = (await freeVllmPorts()).base
    const up = await cli([
      'sim',
      'up',
      '--engine',
      'vllm',
      '--state-dir',
      dir,
      '--base-port',
      String(base),
      '--side-channel-port',
      String(base + 7),
    ])
    expect(up.code, up.stderr).toBe(0)
  }, 120_000)
  afterAll(async () => {
    const before = Object.values(pids()).filter((p): p is number => p !== undefined)
    await cli(['sim', 'down', '--state-dir', dir])
    // Torn down: none of the twin's last processes is left.
    const alive = (pid: number) => {
      try {
        process.kill(pid, 0)
        return true
      } catch {
        return false
      }
    }
    // A process that got its SIGTERM may take a moment to be gone: wait for it, bounded.
    const until = Date.now() + 20_000
    while (before.some(alive) && Date.now() < until) await new Promise(r => setTimeout(r, 100))
    const left = before.filter(alive)
    rmSync(dir, {recursive: true, force: true})
    expect(left).toEqual([])
  }, 60_000)

  it('--dry-run shows the steps in vLLM order and restarts nothing', async () => {
    const before = pids()
    const r = await cli(['restart', '-c', file, '--dry-run'])
    expect(r.code, r.stderr).toBe(0)
    expect(r.stdout).toMatch(/engine: vllm; order: prefill → decode → router/)
    expect(r.stdout).toMatch(/1\. restart prefill: .*sim restart prefill.*gate GET \S+\/health = 2xx/)
    expect(r.stdout).toMatch(/3\. restart router \(the proxy\): .*gate GET \S+\/healthcheck = 2xx/)
    expect(r.stdout).toMatch(/canaries POST \S+\/v1\/completions/)
    expect(pids()).toEqual(before)
  })

  it('restarts prefill, decode and the proxy in order, each with a new pid, and the canaries pass', async () => {
    const before = pids()
    const journal = join(dir, 'restart.json')
    const r = await cli(['restart', '-c', file, '--settle', '1', '--canaries', '3', '--journal', journal])
    expect(r.code, r.stderr).toBe(0)
    expect(r.stdout).toMatch(/^engine: vllm/)
    const order = ['prefill', 'decode', 'router'].map(s => r.stderr.indexOf(`restarting ${s}:`))
    expect(order.every(i => i >= 0)).toBe(true)
    expect([...order].sort((a, b) => a - b)).toEqual(order)
    const after = pids()
    for (const s of ['prefill', 'decode', 'router'] as const) {
      expect(after[s]).toBeDefined()
      expect(after[s]).not.toBe(before[s])
    }
    const j = JSON.parse(readFileSync(journal, 'utf8'))
    expect(j.engine).toBe('vllm')
    expect(j.result.steps.map((s: {service: string}) => s.service)).toEqual(['prefill', 'decode', 'router'])
    for (const s of j.result.steps) expect(s.healthyAfterMs).not.toBeNull()
    expect(j.result.canaries).toHaveLength(3)
    for (const c of j.result.canaries) expect(c.status).toBe(200)
    expect(j.result.verdicts.every((v: {verdict: string}) => v.verdict === 'pass')).toBe(true)
  })

  it('a restart command that fails is a failed verdict (exit 1) and nothing after it is restarted', async () => {
    const bad = variant('bad-command', s => {
      s.decode!.restart = [process.execPath, '-e', 'process.exit(4)']
    })
    const before = pids()
    const r = await cli(['restart', '-c', bad, '--settle', '0'])
    expect(r.code, r.stderr).toBe(1)
    expect(r.stdout).toMatch(/FAIL\s+restart\s+decode: decode's restart command exited 4/)
    const after = pids()
    expect(after.prefill).not.toBe(before.prefill)
    expect(after.router).toBe(before.router)
  })

  it('a service that never gets healthy fails its gate within the deadline (exit 1)', async () => {
    const never = variant('never-healthy', s => {
      s.prefill!.restart = ['true']
      s.prefill!.healthPath = '/no-such-health'
    })
    const before = pids()
    const r = await cli(['restart', '-c', never, '--health-timeout', '2'])
    expect(r.code, r.stderr).toBe(1)
    expect(r.stdout).toMatch(/prefill not healthy within 2s of its restart/)
    expect(pids().decode).toBe(before.decode)
  })

  it('SIGINT mid-restart exits 3, says what was restarted and kills the restart command under way', async () => {
    const marker = `slow-restart-${base}`
    const slow = variant('slow', s => {
      s.decode!.restart = [process.execPath, '-e', 'setTimeout(() => {}, 60000)', marker]
    })
    const child = spawn(process.execPath, [CLI, 'restart', '-c', slow], {stdio: ['ignore', 'pipe', 'pipe']})
    let stderr = ''
    let sentAt = 0
    child.stderr.on('data', (b: Buffer) => {
      stderr += b.toString()
      if (!sentAt && stderr.includes('restarting decode:')) {
        sentAt = Date.now()
        child.kill('SIGINT')
      }
    })
    const code = await new Promise<number | null>(res => child.on('exit', c => res(c)))
    const ms = Date.now() - sentAt
    expect(code, stderr).toBe(3)
    // Within a second on a quiet machine; the bound is wide for a loaded one.
    expect(ms).toBeLessThan(15_000)
    console.log(`vllm restart: SIGINT to exit ${ms} ms`)
    expect(stderr).toMatch(/restarted prefill; nothing after/)
    // The slow command was killed with its process group (bounded wait: it may take a moment to go).
    const running = () => execFileSync('ps', ['-eo', 'args'], {encoding: 'utf8'}).includes(marker)
    const until = Date.now() + 20_000
    while (running() && Date.now() < until) await new Promise(r => setTimeout(r, 100))
    expect(running()).toBe(false)
  })
})
