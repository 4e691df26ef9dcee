import {existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {VLLM_BUILTIN_SUITE} from '../../src/engines/vllm/experiments/builtin-suite.js'
import {startPushgateway} from '../report/gateway.js'
import {freeVllmPorts} from '../sim/lifecycle-helpers.js'
import {runCli, startCli} from './cli.js'

/**
 * Issue 31, "`pdchaos suite --sim --engine vllm` works from a fresh clone": a newcomer's commands on the vLLM twin, in
 * order. The suite starts the twin itself in a fresh state dir (a short lease; free ports, since other tests run
 * beside this one), runs the built-in vLLM suite (its entries, then the co-restart), exits 0, passes --gate, and names
 * the engine and each scenario in the journal, JUnit, HTML and the Pushgateway; its verdicts agree with the twin's
 * truth log. Then inject, status and restart reach the same twin with --sim --engine vllm, a vLLM suite file runs
 * there (and is refused against an SGLang deployment), --engine without --sim is
 * refused (exit 2), a halted deployment refuses the suite (exit 2), a halt during it stops it (exit 3), and a SIGINT
 * while the suite waits a lease out exits 3 with the journal written. The twin is stopped at the end.
 */

const LEASE_S = 3
let root: string
let dir: string
let ports: {base: number; side: number}

interface Verdict {
  check: string
  subject: string
  verdict: string
  evidence: Record<string, unknown>
}
interface Journal {
  command: string
  engine?: string
  stopped?: {reason: string}
  scenarios: Array<{name: string; kind: string; error?: string; verdicts: Verdict[]}>
}

const journalOf = (file: string): Journal => JSON.parse(readFileSync(file, 'utf8')) as Journal
const twin = (): string[] => ['--sim', '--engine', 'vllm', '--state-dir', dir]

beforeAll(async () => {
  root = mkdtempSync(join(process.env.TMPDIR ?? tmpdir(), 'vllm-suite-'))
  // The vLLM twin's default state dir is the SGLang twin's + -vllm: status below finds it through $PDCHAOS_SIM_DIR.
  dir = join(root, 'sim-vllm')
  ports = await freeVllmPorts()
})

afterAll(async () => {
  await runCli(['sim', 'down', '--state-dir', dir], {timeoutMs: 30_000}).catch(() => undefined)
  rmSync(root, {recursive: true, force: true})
}, 60_000)

describe('pdchaos suite --sim --engine vllm, from a fresh state dir', () => {
  it('starts the vLLM twin, runs the built-in vLLM suite, exit 0, engine and scenarios named', async () => {
    expect(existsSync(dir)).toBe(false)
    const [journal, junit, html] = ['run.json', 'junit.xml', 'report.html'].map(f => join(root, f))
    const gateway = await startPushgateway()
    let pushed = ''
    const r = await runCli([
      'suite',
      ...twin(),
      '--sim-lease',
      String(LEASE_S),
      '--sim-base-port',
      String(ports.base),
      '--sim-side-channel-port',
      String(ports.side),
      '--journal',
      journal!,
      '--junit',
      junit!,
      '--html',
      html!,
      '--push',
      gateway.url,
      '--gate',
      '--run-id',
      'vllm-e2e',
    ]).finally(async () => {
      pushed = await fetch(`${gateway.url}/metrics`).then(x => x.text())
      await gateway.stop()
    })
    expect(r.code, r.stderr).toBe(0)
    expect(r.stdout).toContain('release gate: PASS')
    // The Pushgateway groups the run by run_id and engine.
    expect(pushed).toMatch(/pdchaos_check_passed\{check="kv-lease",engine="vllm",[^}]*run_id="vllm-e2e"/)
    expect(r.stderr).toContain(
      `starting the vLLM twin in ${dir} (kv_lease_duration ${LEASE_S}s, NIXL READ stall timeout 2s)`,
    )
    expect(r.stdout).toMatch(/suite builtin-vllm on pdchaos-twin-vllm \(engine vllm\)/)
    const j = journalOf(journal!)
    expect([j.command, j.engine]).toEqual(['suite', 'vllm'])
    // Every entry of the built-in vLLM suite, in order, then the co-restart; each a scenario with a verdict.
    const names = [...VLLM_BUILTIN_SUITE.entries.map(e => `${e.fault} (vllm)`), 'co-restart (vllm)']
    expect(j.scenarios.map(s => s.name)).toEqual(names)
    expect(j.scenarios.map(s => s.kind).at(-1)).toBe('restart')
    for (const s of j.scenarios) {
      expect(s.error, s.name).toBeUndefined()
      expect(s.verdicts.length, s.name).toBeGreaterThan(0)
      expect(
        s.verdicts.every(v => v.verdict === 'pass'),
        s.name,
      ).toBe(true)
    }
    expectTruthAgrees(j.scenarios.find(s => s.name === 'drop-dest-info (vllm)')!.verdicts)
    const xml = readFileSync(junit!, 'utf8')
    for (const name of names) expect(xml).toContain(`<testsuite name="${name}"`)
    expect(xml).toContain('<property name="engine" value="vllm"/>')
    expect(readFileSync(html!, 'utf8')).toContain('engine vllm · deployment pdchaos-twin-vllm')
  }, 180_000)

  it('inject drop-dest-info, status and restart reach the same twin with --sim --engine vllm', async () => {
    const inject = await runCli(['inject', 'drop-dest-info', ...twin(), '--pins', '1', '--json'])
    expect(inject.code, inject.stderr).toBe(0)
    const ij = JSON.parse(inject.stdout) as Journal
    expect(ij.engine).toBe('vllm')
    expectTruthAgrees(ij.scenarios[0]!.verdicts)
    // No --state-dir: the vLLM twin's default dir, $PDCHAOS_SIM_DIR + -vllm.
    const status = await runCli(['status', '--sim', '--engine', 'vllm', '--json'], {
      env: {PDCHAOS_SIM_DIR: join(root, 'sim')},
    })
    expect(status.code, status.stderr).toBe(0)
    const sj = JSON.parse(status.stdout) as {engine: string; servers: Array<{role: string; lease?: unknown}>}
    expect(sj.engine).toBe('vllm')
    expect(JSON.stringify(sj.servers.find(s => s.role === 'prefill')!.lease)).toContain(`"value":${LEASE_S}`)
    const restart = await runCli(['restart', ...twin(), '--json'])
    expect(restart.code, restart.stderr).toBe(0)
    const rj = JSON.parse(restart.stdout) as {engine: string; verdicts: Verdict[]}
    expect(rj.engine).toBe('vllm')
    expect(rj.verdicts.length).toBeGreaterThan(0)
    expect(rj.verdicts.every(v => v.verdict === 'pass')).toBe(true)
  }, 180_000)

  it('runs a vLLM suite file (engine: vllm) on the twin; refuses it against an SGLang deployment (exit 2)', async () => {
    const file = join(root, 'nightly-vllm.yaml')
    writeFileSync(
      file,
      'engine: vllm\nname: nightly-vllm\nscenarios:\n  - {fault: drop-dest-info, pins: 1}\ncoRestart: false\n',
    )
    const journal = join(root, 'file-run.json')
    const r = await runCli(['suite', file, ...twin(), '--journal', journal])
    expect(r.code, r.stderr).toBe(0)
    const j = journalOf(journal) as Journal & {name: string}
    expect([j.name, j.engine, j.scenarios.map(s => s.name)]).toEqual([
      'nightly-vllm',
      'vllm',
      ['drop-dest-info (vllm)'],
    ])
    expectTruthAgrees(j.scenarios[0]!.verdicts)
    const sglang = join(root, 'sglang.yaml')
    writeFileSync(sglang, 'name: an-sglang-deployment\n')
    const refused = await runCli(['suite', file, '-c', sglang], {timeoutMs: 30_000})
    expect(refused.code, refused.stderr).toBe(2)
    expect(refused.stderr).toMatch(/is a vLLM suite file \(engine: vllm\), and the target is an SGLang deployment/)
  }, 120_000)

  it('refuses --engine without --sim, and an --engine the running twin is not (exit 2, one line)', async () => {
    for (const args of [
      ['suite', '--engine', 'vllm'],
      ['status', '--engine', 'vllm', '-c', join(dir, 'pdchaos.yaml')],
    ]) {
      const r = await runCli(args, {timeoutMs: 30_000})
      expect(r.code, r.stderr).toBe(2)
      expect(r.stderr).toMatch(/^Error: --engine applies only with --sim/m)
      expect(r.stderr).toMatch(/^Try this: /m)
      expect(r.stderr).not.toMatch(/\n\s+at /)
    }
    const wrong = await runCli(['status', '--sim', '--engine', 'sglang', '--state-dir', dir], {timeoutMs: 30_000})
    expect(wrong.code, wrong.stderr).toBe(2)
    expect(wrong.stderr).toContain(`the twin running in ${dir} is the vLLM twin, not --engine sglang`)
  }, 60_000)

  it('a halted deployment refuses the vLLM suite (exit 2, E_HALTED)', async () => {
    const state = join(dir, 'host-state')
    mkdirSync(state, {recursive: true, mode: 0o700})
    const halt = join(state, 'halt.json')
    writeFileSync(halt, `${JSON.stringify({pdchaos: 1, by: 'test@here', at: Date.now(), reason: 'INC-1'})}\n`, {
      mode: 0o600,
    })
    try {
      const r = await runCli(['suite', ...twin(), '--json'], {timeoutMs: 60_000})
      expect(r.code, r.stderr).toBe(2)
      expect(r.stdout).toContain('E_HALTED')
      expect(r.stdout).toContain('INC-1')
    } finally {
      rmSync(halt, {force: true})
    }
  }, 90_000)

  it('a halt while the suite waits a lease out stops it (exit 3, the halt and the halted scenario recorded)', async () => {
    const journal = join(root, 'halted.json')
    const halt = join(dir, 'host-state', 'halt.json')
    const cli = startCli(['suite', ...twin(), '--journal', journal])
    let stderr = ''
    cli.child.stderr!.on('data', (d: Buffer) => {
      stderr += d.toString()
      if (!existsSync(halt) && /waiting [\d.]+ s for every window to close/.test(stderr))
        writeFileSync(halt, `${JSON.stringify({pdchaos: 1, by: 'test@here', at: Date.now(), reason: 'INC-2'})}\n`, {
          mode: 0o600,
        })
    })
    const killer = setTimeout(() => cli.child.kill('SIGKILL'), 120_000)
    try {
      const r = await cli.done
      expect(r.code, r.stderr).toBe(3)
      expect(r.stderr).toContain('HALT: halted by test@here')
      const j = journalOf(journal) as Journal & {stopped?: {halt?: {reason: string}}}
      expect(j.stopped?.halt?.reason).toBe('INC-2')
      expect(j.scenarios.map(s => [s.name, (s as {status?: string}).status])).toEqual([
        ['drop-dest-info (vllm)', 'halted'],
      ])
    } finally {
      clearTimeout(killer)
      rmSync(halt, {force: true})
    }
  }, 150_000)

  it('a SIGINT while the suite waits a lease out exits 3 with the journal written (engine named, stopped)', async () => {
    const journal = join(root, 'stopped.json')
    const cli = startCli(['suite', ...twin(), '--journal', journal])
    let sent = false
    let stderr = ''
    cli.child.stderr!.on('data', (d: Buffer) => {
      stderr += d.toString()
      if (!sent && /waiting [\d.]+ s for every window to close/.test(stderr)) {
        sent = true
        cli.child.kill('SIGINT')
      }
    })
    const killer = setTimeout(() => cli.child.kill('SIGKILL'), 120_000)
    const r = await cli.done
    clearTimeout(killer)
    expect(sent).toBe(true)
    expect(r.code, r.stderr).toBe(3)
    const j = journalOf(journal)
    expect(j.engine).toBe('vllm')
    expect(j.stopped?.reason).toBe('interrupted (SIGINT)')
    expect(j.scenarios.map(s => s.name)).toEqual(['drop-dest-info (vllm)'])
  }, 150_000)
})

/** Each kv-lease pass is a release the twin's truth log records as a lease expiry inside the verdict's window. */
function expectTruthAgrees(verdicts: Verdict[]): void {
  const truth = readFileSync(join(dir, 'truth', 'prefill.jsonl'), 'utf8')
    .split('\n')
    .filter(Boolean)
    .map(l => JSON.parse(l) as {t: number; rid: string; event: string; detail?: {cause?: string}})
  expect(verdicts.length).toBeGreaterThan(0)
  for (const v of verdicts) {
    expect([v.check, v.verdict]).toEqual(['kv-lease', 'pass'])
    const freed = truth.find(e => e.rid === v.subject && e.event === 'freed')
    expect(freed?.detail?.cause).toBe('lease-expired')
    const [open, close] = v.evidence.windowMs as [number, number]
    expect(freed!.t).toBeGreaterThanOrEqual(open)
    expect(freed!.t).toBeLessThanOrEqual(close)
  }
}
