import {execFile, spawn} from 'node:child_process'
import {existsSync, mkdtempSync, readdirSync, readFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join, resolve} from 'node:path'
import {promisify} from 'node:util'

import {describe, expect, it} from 'vitest'

import {freeVllmPorts} from '../sim/lifecycle-helpers.js'

/**
 * `pdchaos inject wedge-rank --side decode` and `inject kill-decode` on the vLLM twin (lease 12 s, TP 2): D's READs
 * held by the READ stall (an nft drop on P's data port, as root), D stopped or killed, P's releases judged from its
 * log — each verdict compared with the twin's truth (`freed {cause: lease-expired}` inside the verdict's window). A
 * correct twin passes; `lease-never-expires` fails "never"; `expire-early` fails "early" for the fresh request; kill-
 * decode leaves D restarted and healthy; Ctrl-C exits 3 with D running and no fault lease left. Every twin is torn
 * down on every path. Repeat with PDCHAOS_WEDGE_REPEAT=N to count false alarms over N clean runs of the correct rows.
 */
const run = promisify(execFile)
const CLI = resolve('bin/run.js')
const LEASE_S = 12
const REPEAT = Math.max(1, Number(process.env.PDCHAOS_WEDGE_REPEAT ?? 1))

interface Truth {
  t: number
  rid: string
  event: string
  detail?: {cause?: string}
}

interface Verdict {
  check: string
  subject: string
  verdict: string
  summary: string
  evidence: Record<string, unknown>
}

interface Twin {
  dir: string
  file: string
}

/** A twin on free ports; another test may take a port between the probe and the bind, so up to 3 tries. */
async function up(bugs: string[], attempt = 1): Promise<Twin> {
  const dir = mkdtempSync(join(process.env.TMPDIR ?? tmpdir(), 'vllm-wedge-'))
  const {base, side} = await freeVllmPorts()
  const args = ['sim', 'up', '--engine', 'vllm', '--state-dir', dir, '--base-port', String(base), '--vllm-tp', '2']
  args.push('--side-channel-port', String(side), '--kv-lease-duration', String(LEASE_S))
  for (const b of bugs) args.push('--vllm-bug', b)
  try {
    await run(process.execPath, [CLI, ...args], {timeout: 60_000})
  } catch (error) {
    const inUse = [join(dir, 'logs', 'prefill.log'), join(dir, 'logs', 'decode.log'), join(dir, 'logs', 'router.log')]
      .filter(f => existsSync(f))
      .some(f => readFileSync(f, 'utf8').includes('EADDRINUSE'))
    if (attempt < 3 && (inUse || /already in use/.test(String(error)))) return up(bugs, attempt + 1)
    throw error
  }
  return {dir, file: join(dir, 'pdchaos.yaml')}
}

const down = (t: Twin) =>
  run(process.execPath, [CLI, 'sim', 'down', '--state-dir', t.dir], {timeout: 30_000}).catch(() => undefined)

const truthOf = (t: Twin, role: string): Truth[] => {
  const f = join(t.dir, 'truth', `${role}.jsonl`)
  return existsSync(f)
    ? readFileSync(f, 'utf8')
        .split('\n')
        .filter(Boolean)
        .map(l => JSON.parse(l) as Truth)
    : []
}

async function inject(t: Twin, fault: string, flags: string[]) {
  const journal = join(t.dir, `${fault}-${Date.now()}.json`)
  const argv = [CLI, 'inject', fault, '-c', t.file, ...flags, '--journal', journal]
  const r = await run(process.execPath, argv, {timeout: 120_000}).then(
    x => ({code: 0, stderr: x.stderr}),
    (e: {code?: number; stderr?: string}) => ({code: e.code ?? -1, stderr: e.stderr ?? ''}),
  )
  const j = JSON.parse(readFileSync(journal, 'utf8')) as {scenarios: Array<{verdicts: Verdict[]}>}
  return {...r, verdicts: j.scenarios[0]!.verdicts}
}

/** Each kv-lease verdict equals the truth: a pass has P's lease-expired release inside its window. */
function expectPassesMatchTruth(t: Twin, verdicts: Verdict[]) {
  const leases = verdicts.filter(v => v.check === 'kv-lease')
  expect(leases).toHaveLength(2)
  for (const v of leases) {
    expect([v.verdict, v.summary]).toEqual([
      'pass',
      "released by the lease's reaper in its window after D's heartbeats stopped",
    ])
    const freed = truthOf(t, 'prefill').find(e => e.rid === v.subject && e.event === 'freed')
    expect(freed?.detail?.cause).toBe('lease-expired')
    const [open, close] = v.evidence.windowMs as [number, number]
    expect(freed!.t).toBeGreaterThanOrEqual(open)
    expect(freed!.t).toBeLessThanOrEqual(close)
  }
}

/** D's processes: none stopped (state T), and its /health answers 200. */
async function expectDecodeRunning(t: Twin) {
  const status = await run(process.execPath, [CLI, 'status', '-c', t.file, '--json'], {timeout: 60_000})
  const d = (JSON.parse(status.stdout) as {servers: Array<{role: string; health: {ok: boolean}; pid?: number}>}).servers
  const decode = d.find(s => s.role === 'decode')!
  expect(decode.health.ok).toBe(true)
  // This twin's D only (other tests on the machine may hold their own processes stopped).
  const ps = await run('ps', ['-eo', 'pid=,ppid=,stat=,args='])
  const rows = ps.stdout
    .split('\n')
    .map(l => /^\s*(\d+)\s+(\d+)\s+(\S+)\s+(.*)$/.exec(l))
    .filter(m => m !== null)
    .map(m => ({pid: Number(m[1]), ppid: Number(m[2]), stat: m[3]!, args: m[4]!}))
  const tree = new Set([decode.pid])
  for (let grew = true; grew; ) {
    grew = false
    for (const r of rows) if (tree.has(r.ppid) && !tree.has(r.pid)) grew = tree.add(r.pid) !== undefined
  }
  expect(tree.size).toBeGreaterThan(1)
  expect(rows.filter(r => tree.has(r.pid) && r.stat.startsWith('T')).map(r => r.args)).toEqual([])
  return decode.pid
}

/** No fault lease left armed in the twin's state dir (active leases are leases/*.json; done ones move to done/). */
function expectNoLeaseLeft(t: Twin) {
  const dir = join(t.dir, 'host-state', 'leases')
  const active = existsSync(dir) ? readdirSync(dir).filter(f => f.endsWith('.json')) : []
  expect(active).toEqual([])
}

describe.sequential('wedge-rank --side decode and kill-decode on the vLLM twin', () => {
  for (let i = 1; i <= REPEAT; i++) {
    it(`wedge-rank --side decode --gpu 1 passes on a correct twin, each release in its window (run ${i})`, async () => {
      const t = await up([])
      try {
        const r = await inject(t, 'wedge-rank', ['--side', 'decode', '--gpu', '1'])
        expect(r.code).toBe(0)
        expectPassesMatchTruth(t, r.verdicts)
        expect(r.verdicts.filter(v => v.check === 'cleanup').map(v => v.verdict)).toEqual(['pass', 'pass'])
        await expectDecodeRunning(t)
        expectNoLeaseLeft(t)
      } finally {
        await down(t)
      }
    }, 180_000)

    it(`kill-decode passes on a correct twin and leaves D restarted and healthy (run ${i})`, async () => {
      const t = await up([])
      try {
        const r = await inject(t, 'kill-decode', [])
        expect(r.code).toBe(0)
        expectPassesMatchTruth(t, r.verdicts)
        const restart = r.verdicts.find(v => v.check === 'restart')!
        expect(restart.verdict).toBe('pass')
        const pid = await expectDecodeRunning(t)
        expect(pid).toBe(restart.evidence.pid)
        expectNoLeaseLeft(t)
      } finally {
        await down(t)
      }
    }, 180_000)
  }

  it('wedge-rank fails "never" under lease-never-expires (exit 1): the truth has no release', async () => {
    const t = await up(['lease-never-expires'])
    try {
      const r = await inject(t, 'wedge-rank', ['--side', 'decode'])
      expect(r.code).toBe(1)
      const leases = r.verdicts.filter(v => v.check === 'kv-lease')
      expect(leases).toHaveLength(2)
      for (const v of leases) {
        expect([v.verdict, v.evidence.failure]).toEqual(['fail', 'never'])
        expect(truthOf(t, 'prefill').find(e => e.rid === v.subject && e.event === 'freed')).toBeUndefined()
      }
      await expectDecodeRunning(t)
    } finally {
      await down(t)
    }
  }, 180_000)

  it('wedge-rank fails "early" under expire-early (exit 1) for the fresh request, freed before its window', async () => {
    const t = await up(['expire-early'])
    try {
      const r = await inject(t, 'wedge-rank', ['--side', 'decode'])
      expect(r.code).toBe(1)
      const [renewed, fresh] = r.verdicts.filter(v => v.check === 'kv-lease')
      // The renewed request's deadline was D's heartbeats', which the bug does not shorten.
      expect(renewed!.verdict).toBe('pass')
      expect([fresh!.verdict, fresh!.evidence.failure]).toEqual(['fail', 'early'])
      const freed = truthOf(t, 'prefill').find(e => e.rid === fresh!.subject && e.event === 'freed')!
      expect(freed.t).toBeLessThan((fresh!.evidence.windowMs as number[])[0]!)
    } finally {
      await down(t)
    }
  }, 180_000)

  it('wedge-rank --side prefill is refused with its reason (exit 2), nothing installed', async () => {
    const t = await up([])
    try {
      const r = await run(process.execPath, [CLI, 'inject', 'wedge-rank', '-c', t.file, '--side', 'prefill']).then(
        () => ({code: 0, stderr: ''}),
        (e: {code?: number; stderr?: string}) => ({code: e.code ?? -1, stderr: e.stderr ?? ''}),
      )
      expect(r.code).toBe(2)
      expect(r.stderr).toContain('nothing to judge')
      expectNoLeaseLeft(t)
    } finally {
      await down(t)
    }
  }, 120_000)

  for (const fault of ['wedge-rank', 'kill-decode']) {
    it(`Ctrl-C while ${fault} holds D stopped exits 3, D running and no lease left`, async () => {
      const t = await up([])
      try {
        const child = spawn(process.execPath, [CLI, 'inject', fault, '-c', t.file])
        let stderr = ''
        const exited = new Promise<number | null>(ok => child.on('exit', code => ok(code)))
        await new Promise<void>((ok, no) => {
          const timer = setTimeout(() => no(new Error(`never reached the stop: ${stderr}`)), 60_000)
          child.stderr.on('data', (b: Buffer) => {
            stderr += b.toString()
            if (stderr.includes('waiting') && stderr.includes('for every window to close')) {
              clearTimeout(timer)
              ok()
            }
          })
        })
        child.kill('SIGINT')
        expect(await exited).toBe(3)
        expect(stderr).toContain('interrupted')
        await expectDecodeRunning(t)
        expectNoLeaseLeft(t)
      } finally {
        await down(t)
      }
    }, 180_000)
  }
})
