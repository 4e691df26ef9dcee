import {execFile} from 'node:child_process'
import {mkdtempSync, readdirSync, readFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {promisify} from 'node:util'

import {describe, expect, it} from 'vitest'

import {nftTableName} from '../../src/faults/mechanisms/packet-filter.js'
import {freeVllmPorts} from '../sim/lifecycle-helpers.js'
import {progressLines, runCli, startCli, truth} from './cli.js'

/**
 * `pdchaos inject stall-kv -c <engine: vllm file>` end to end on the vLLM twin (lease 4 s): P's data port is dropped by
 * an nft table of the run's own lease (root, loopback ports the twin owns; no other rule is touched), two requests go
 * through both legs (D's READ stalls, D heartbeats) and one bystander to P only. Each row's verdicts are compared with
 * the twin's truth log: a correct twin FAILs "pinned" (the finding: no `freed` for those rids before the revert),
 * `--xfer-stall-timeout 2` PASSes, `no-renew` FAILs "freed-early" (with a 3 s READ stall timeout "not-renewed": P at
 * DEBUG logged no renewal), `reaper-head-block` strands the bystander. Ctrl-C
 * exits 3 with no table and no armed lease left.
 */
const run = promisify(execFile)
const LEASE_S = 4
const isRoot = process.getuid?.() === 0

interface Verdict {
  check: string
  subject: string
  verdict: string
  summary: string
  evidence: Record<string, unknown>
}

interface Lease {
  id: string
  revertedAt: number | null
  verifiedClean: boolean
}

interface Outcome {
  code: number | null
  dir: string
  stderr: string
  stdout: string
  pinned: Verdict[]
  bystanders: Verdict[]
  lease: Lease
  notes: string[]
}

type Event = {t: number; rid: string; event: string; detail?: {cause?: string}}

const events = (dir: string, svc: 'prefill' | 'decode'): Event[] => truth(dir, svc) as unknown as Event[]
const firstOf = (dir: string, svc: 'prefill' | 'decode', rid: string, event: string): Event | undefined =>
  events(dir, svc).find(e => e.rid === rid && e.event === event)

async function up(bugs: string[], extra: string[] = []): Promise<string> {
  const dir = mkdtempSync(join(process.env.TMPDIR ?? tmpdir(), 'vllm-stall-'))
  const {base, side} = await freeVllmPorts()
  const args = ['sim', 'up', '--engine', 'vllm', '--state-dir', dir, '--base-port', String(base)]
  args.push('--side-channel-port', String(side), '--kv-lease-duration', String(LEASE_S), ...extra)
  for (const b of bugs) args.push('--vllm-bug', b)
  const r = await runCli(args, {timeoutMs: 60_000})
  if (r.code !== 0) throw new Error(`sim up failed: ${r.stderr}`)
  return dir
}

const down = (dir: string) => runCli(['sim', 'down', '--state-dir', dir], {timeoutMs: 30_000}).catch(() => undefined)

/** No nft table of the lease, and no armed lease file (leases/<id>.json; reverted ones move to leases/done/). */
async function expectClean(dir: string, leaseId: string | undefined): Promise<void> {
  const {stdout} = await run('nft', ['-j', 'list', 'tables'])
  const names = (JSON.parse(stdout) as {nftables: Array<{table?: {name: string}}>}).nftables.flatMap(o =>
    o.table ? [o.table.name] : [],
  )
  if (leaseId) expect(names).not.toContain(nftTableName(leaseId))
  const armed = readdirSync(join(dir, 'host-state', 'leases')).filter(f => f.endsWith('.json'))
  expect(armed).toEqual([])
}

async function inject(
  bugs: string[],
  extra: string[] = [],
  args: string[] = [],
  before?: (dir: string) => Promise<void>,
): Promise<Outcome> {
  const dir = await up(bugs, extra)
  try {
    await before?.(dir)
    const journal = join(dir, 'run.json')
    const r = await runCli(['inject', 'stall-kv', '-c', join(dir, 'pdchaos.yaml'), '--journal', journal, ...args], {
      timeoutMs: 120_000,
    })
    const s = (
      JSON.parse(readFileSync(journal, 'utf8')) as {
        scenarios: Array<{verdicts: Verdict[]; leases: Lease[]; notes: string[]}>
      }
    ).scenarios[0]!
    await expectClean(dir, s.leases[0]?.id)
    return {
      code: r.code,
      dir,
      stderr: r.stderr,
      stdout: r.stdout,
      pinned: s.verdicts.filter(v => v.check === 'kv-pinned'),
      bystanders: s.verdicts.filter(v => v.check === 'kv-lease'),
      lease: s.leases[0]!,
      notes: s.notes,
    }
  } finally {
    await down(dir)
  }
}

describe.skipIf(!isRoot)('inject stall-kv on the vLLM twin (nft on the twin loopback ports)', () => {
  it('a correct twin: FAIL "pinned" (exit 1), no release before the revert by the truth; the bystander passes', async () => {
    const o = await inject([])
    expect(o.code).toBe(1)
    expect(o.lease.verifiedClean).toBe(true)
    expect(o.pinned).toHaveLength(2)
    for (const v of o.pinned) {
      expect([v.verdict, v.evidence.failure]).toEqual(['fail', 'pinned'])
      expect(v.summary).toMatch(/^pinned: P held the blocks .* while D heartbeated/)
      // The truth: D renewed the lease, and P never freed the blocks while the filter was in place.
      const renewals = events(o.dir, 'prefill').filter(e => e.rid === v.subject && e.event === 'heartbeat')
      expect(renewals.length).toBeGreaterThan(1)
      const freed = firstOf(o.dir, 'prefill', v.subject, 'freed')
      if (freed) {
        expect(freed.t).toBeGreaterThan(o.lease.revertedAt!)
        expect(freed.detail?.cause).toBe('read-notified')
      }
    }
    // After the revert the READs completed and P freed on their notification.
    expect(o.notes.filter(n => /D answered 200 .* after the revert/.test(n))).toHaveLength(2)
    expect(o.bystanders.map(v => v.verdict)).toEqual(['pass'])
    expect(firstOf(o.dir, 'prefill', o.bystanders[0]!.subject, 'freed')?.detail?.cause).toBe('lease-expired')
  }, 180_000)

  it('--xfer-stall-timeout 2: PASS (exit 0), freed by lease expiry after D failed the READ, by the truth', async () => {
    const o = await inject([], ['--xfer-stall-timeout', '2'])
    expect(o.code).toBe(0)
    expect(o.pinned).toHaveLength(2)
    for (const v of o.pinned) {
      expect(v.verdict).toBe('pass')
      expect(String(v.evidence.line)).toContain(v.subject)
      const failed = firstOf(o.dir, 'decode', v.subject, 'read-failed')!
      const freed = firstOf(o.dir, 'prefill', v.subject, 'freed')!
      expect(freed.detail?.cause).toBe('lease-expired')
      expect(freed.t).toBeGreaterThan(failed.t)
      expect(freed.t).toBeLessThan(o.lease.revertedAt!)
    }
  }, 180_000)

  it('--vllm-bug no-renew: FAIL "freed-early" (exit 1): P freed while D still held the request', async () => {
    const o = await inject(['no-renew'])
    expect(o.code).toBe(1)
    for (const v of o.pinned) {
      expect([v.verdict, v.evidence.failure]).toEqual(['fail', 'freed-early'])
      const freed = firstOf(o.dir, 'prefill', v.subject, 'freed')!
      expect(freed.detail?.cause).toBe('lease-expired')
      // D had neither failed nor finished the request when P freed it; P dropped its heartbeats.
      const dEnd = events(o.dir, 'decode').find(
        e => e.rid === v.subject && ['read-failed', 'read-done', 'answered'].includes(e.event),
      )
      expect(dEnd === undefined || dEnd.t > freed.t).toBe(true)
      expect(firstOf(o.dir, 'prefill', v.subject, 'heartbeat-dropped')).toBeDefined()
    }
  }, 180_000)

  it('--xfer-stall-timeout 3 --vllm-bug no-renew: FAIL "not-renewed" (exit 1): P at DEBUG logged no renewal', async () => {
    const o = await inject(['no-renew'], ['--xfer-stall-timeout', '3'])
    expect(o.code).toBe(1)
    expect(o.pinned).toHaveLength(2)
    for (const v of o.pinned) {
      expect([v.verdict, v.evidence.failure]).toEqual(['fail', 'not-renewed'])
      expect(String(v.evidence.debug)).toContain('VLLM_LOGGING_LEVEL=DEBUG')
      // The truth: P dropped D's renewals and freed by expiry, before a correct P's deadline (D's last renewal + 2 s).
      const dropped = events(o.dir, 'prefill').filter(e => e.rid === v.subject && e.event === 'heartbeat-dropped')
      const freed = firstOf(o.dir, 'prefill', v.subject, 'freed')!
      expect(freed.detail?.cause).toBe('lease-expired')
      expect(dropped.length).toBeGreaterThan(1)
      expect(freed.t).toBeLessThan(dropped.at(-1)!.t + 2000)
    }
  }, 180_000)

  it('--vllm-bug reaper-head-block: the bystander behind the renewed heads fails, freed late by the truth', async () => {
    const o = await inject(['reaper-head-block'])
    expect(o.code).toBe(1)
    const [b] = o.bystanders
    expect([b!.verdict, b!.evidence.failure]).toEqual(['fail', 'never'])
    const [, close] = b!.evidence.windowMs as [number, number]
    const freed = firstOf(o.dir, 'prefill', b!.subject, 'freed')
    // Freed only once the heads left the table after the revert (or not at all while the run watched).
    expect(freed === undefined || freed.t > Math.max(close, o.lease.revertedAt!)).toBe(true)
    expect(o.pinned.map(v => v.evidence.failure)).toEqual(['pinned', 'pinned'])
  }, 180_000)

  it('--vllm-notif-path data: the drop cuts the heartbeats too; P frees at its lease, kv-pinned says unverified', async () => {
    const o = await inject([], ['--vllm-notif-path', 'data'])
    expect(o.code, o.stderr).toBe(0) // neither a false pass nor a false "freed-early" fail
    expect(o.lease.verifiedClean).toBe(true)
    expect(o.pinned).toHaveLength(2)
    for (const v of o.pinned) {
      expect(v.verdict).toBe('unverified')
      expect(v.summary).toBe("released while D held the request; D's heartbeats were not seen reaching P")
      expect(String(v.evidence.why)).toMatch(/no traffic from D into P's side channel .* may share the stalled path/)
      expect(String(v.evidence.toVerify)).toMatch(/read P's lease renewals/)
      // The truth: D heartbeated all along, P took none of it while the filter was in place, and freed the blocks at
      // its first lease (grant + 4 s), by expiry, before the revert.
      const sent = events(o.dir, 'decode').filter(e => e.rid === v.subject && e.event === 'heartbeat-sent')
      expect(sent.filter(e => e.t < o.lease.revertedAt!).length).toBeGreaterThan(1)
      const renewed = events(o.dir, 'prefill').filter(e => e.rid === v.subject && e.event === 'heartbeat')
      expect(renewed.filter(e => e.t < o.lease.revertedAt!)).toEqual([])
      const granted = firstOf(o.dir, 'prefill', v.subject, 'granted')!
      const freed = firstOf(o.dir, 'prefill', v.subject, 'freed')!
      expect(freed.detail?.cause).toBe('lease-expired')
      expect(freed.t).toBeLessThan(o.lease.revertedAt!)
      expect(freed.t - granted.t).toBeGreaterThanOrEqual(LEASE_S * 1000)
      expect(freed.t - granted.t).toBeLessThan(LEASE_S * 1000 + 2000)
    }
    expect(o.bystanders.map(v => v.verdict)).toEqual(['pass'])
  }, 180_000)

  it("--gpu 1 at TP 2 drops only rank 1's listener (Worker_TP1): rank 0 serves its share, the READ waits on rank 1", async () => {
    let base = 0
    const o = await inject([], ['--vllm-tp', '2'], ['--gpu', '1'], async dir => {
      base = (JSON.parse(readFileSync(join(dir, 'vllm.json'), 'utf8')) as {ports: {proxy: number}}).ports.proxy
      // A GPU with no rank of P is refused before anything is touched (exit 2), naming the ranks present.
      const r = await runCli(['inject', 'stall-kv', '-c', join(dir, 'pdchaos.yaml'), '--gpu', '2'], {timeoutMs: 60_000})
      expect(r.code, r.stderr).toBe(2)
      expect(r.stderr).toMatch(
        /--gpu 2: P has no TP rank on GPU 2 \(2 rank\(s\): rank 0: VLLM::Worker_TP0 pid \d+; rank 1/,
      )
      expect(r.stderr).toMatch(/^Try this: pass --gpu 0 or 1/m)
    })
    const out = o.stdout + o.stderr
    expect(out).toMatch(new RegExp(`P's data listener 127\\.0\\.0\\.1:${base + 301} \\(pid \\d+\\)`))
    expect(out).toMatch(/P's rank 1 on the GPU: VLLM::Worker_TP1 pid \d+/)
    expect(out).not.toMatch(new RegExp(`P's data listener 127\\.0\\.0\\.1:${base + 300}`))
    expect(o.code).toBe(1)
    for (const v of o.pinned) {
      expect([v.verdict, v.evidence.failure]).toEqual(['fail', 'pinned'])
      const served = events(o.dir, 'prefill').filter(
        e => e.rid === v.subject && e.event === 'read-served' && e.t < o.lease.revertedAt!,
      ) as Array<Event & {detail?: {rank?: number}}>
      expect(served.map(e => e.detail?.rank)).toEqual([0])
      const freed = firstOf(o.dir, 'prefill', v.subject, 'freed')
      if (freed) expect(freed.t).toBeGreaterThan(o.lease.revertedAt!)
    }
  }, 180_000)

  it('Ctrl-C while the READ is stalled exits 3 with the filter lifted and no armed lease', async () => {
    const dir = await up([])
    try {
      const {child, done} = startCli(['inject', 'stall-kv', '-c', join(dir, 'pdchaos.yaml')])
      const lines = progressLines(child)
      await lines.waitFor(/observing .* with the READ stalled/, 60_000)
      const leaseId = /lease (stall-kv-\S+),/.exec(lines.lines.map(l => l.text).join('\n'))?.[1]
      child.kill('SIGINT')
      const r = await done
      expect(r.code).toBe(3)
      expect(r.stderr).toMatch(/READ stall lifted: revert reverted/)
      expect(leaseId).toBeDefined()
      await expectClean(dir, leaseId)
    } finally {
      await down(dir)
    }
  }, 120_000)
})
