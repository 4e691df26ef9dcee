import {execFile} from 'node:child_process'
import {existsSync, mkdtempSync, readFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join, resolve} from 'node:path'
import {promisify} from 'node:util'

import {describe, expect, it} from 'vitest'

import {judgeKvLeases, type KvLeaseVerdict} from '../../src/checks/kv-lease.js'
import {readNixlCounters, sendPrefillOnly, type PrefillGrant} from '../../src/engines/vllm/client.js'
import {parseReleaseLog} from '../../src/engines/vllm/log-lines.js'

import {freeVllmPorts} from '../sim/lifecycle-helpers.js'

/**
 * Judging vLLM's lease end to end: the vLLM twin with a short lease, P-only requests (the D leg dropped) sent with
 * the client as vLLM's toy proxy sends them, P's log read and parsed, the kv-lease check's verdicts — each compared
 * with the twin's truth log. A correct twin passes; `lease-never-expires` and `expire-early` fail.
 */
const run = promisify(execFile)
const CLI = resolve('bin/run.js')
const LEASE_S = 4
const STEP_MS = 20
const REQUESTS = 3

interface Truth {
  t: number
  rid: string
  event: string
  detail?: {cause?: string; expiryMs?: number; ttlS?: number}
}

interface Outcome {
  verdicts: KvLeaseVerdict[]
  truth: Truth[]
  grants: PrefillGrant[]
  expiredCounter: number | undefined
}

/** Up, REQUESTS P-only requests, wait the window out, judge; down on every path. */
async function judgeTwin(bugs: string[]): Promise<Outcome> {
  const dir = mkdtempSync(join(process.env.TMPDIR ?? tmpdir(), 'vllm-lease-'))
  const {base, side} = await freeVllmPorts()
  const args = ['sim', 'up', '--engine', 'vllm', '--state-dir', dir, '--base-port', String(base)]
  args.push('--side-channel-port', String(side), '--kv-lease-duration', String(LEASE_S))
  args.push('--vllm-step-ms', String(STEP_MS))
  for (const b of bugs) args.push('--vllm-bug', b)
  const prefill = `http://127.0.0.1:${base + 100}`
  try {
    await run(process.execPath, [CLI, ...args], {timeout: 60_000})
    const grants: PrefillGrant[] = []
    for (let i = 0; i < REQUESTS; i++)
      grants.push(
        await sendPrefillOnly({
          baseUrl: prefill,
          model: 'pdchaos/twin-model',
          prompt: 'x '.repeat(64),
          timeoutMs: 10_000,
        }),
      )
    // Past the last window's close and the log's 1 s resolution, with room for a loaded box.
    const until = grants.at(-1)!.answeredMs + LEASE_S * 1000 + 2 * STEP_MS + 2500
    await new Promise(r => setTimeout(r, Math.max(0, until - Date.now())))
    const counters = await readNixlCounters(prefill, 10_000)
    const observedUntilMs = Date.now()
    const log = readFileSync(join(dir, 'logs', 'prefill.log'), 'utf8')
    const verdicts = judgeKvLeases({
      requests: grants.map(g => ({
        requestId: g.requestId,
        sentMs: g.sentMs,
        answeredMs: g.answeredMs,
        decodeSent: false,
      })),
      settings: {
        mode: 'lease',
        duration: {seconds: LEASE_S, source: '--kv-lease-duration of sim up'},
        stepMs: STEP_MS,
        reaperMs: STEP_MS,
      },
      logReleases: parseReleaseLog(log, {nearMs: observedUntilMs}),
      observedUntilMs,
    })
    const tf = join(dir, 'truth', 'prefill.jsonl')
    const truth = existsSync(tf)
      ? readFileSync(tf, 'utf8')
          .split('\n')
          .filter(Boolean)
          .map(l => JSON.parse(l) as Truth)
      : []
    return {verdicts, truth, grants, expiredCounter: counters.values['vllm:nixl_num_kv_expired_reqs']}
  } finally {
    await run(process.execPath, [CLI, 'sim', 'down', '--state-dir', dir], {timeout: 30_000}).catch(() => undefined)
  }
}

const freedOf = (o: Outcome, rid: string) => o.truth.find(e => e.rid === rid && e.event === 'freed')
const grantedOf = (o: Outcome, rid: string) => o.truth.find(e => e.rid === rid && e.event === 'granted')

describe('judging the vLLM lease against the twin', () => {
  it('passes every pin of a correct twin, each agreeing with the truth log', async () => {
    const o = await judgeTwin([])
    expect(o.verdicts.map(v => [v.subject, v.verdict, v.summary])).toEqual(
      o.grants.map(g => [g.requestId, 'pass', 'released by the lease expiry path in its window']),
    )
    for (const g of o.grants) {
      const freed = freedOf(o, g.requestId)
      expect(freed?.detail?.cause).toBe('lease-expired')
      // The truth's release lies inside the window the verdict used.
      const [open, close] = o.verdicts.find(v => v.subject === g.requestId)!.evidence.windowMs as [number, number]
      expect(freed!.t).toBeGreaterThanOrEqual(open)
      expect(freed!.t).toBeLessThanOrEqual(close + 1000)
    }
    expect(o.expiredCounter).toBe(REQUESTS)
  }, 90_000)

  it('fails "never" under lease-never-expires, where the truth log has no release', async () => {
    const o = await judgeTwin(['lease-never-expires'])
    for (const v of o.verdicts) {
      expect(v.verdict).toBe('fail')
      expect(v.evidence.failure).toBe('never')
      expect(freedOf(o, v.subject)).toBeUndefined()
    }
    expect(o.expiredCounter).toBe(0)
  }, 90_000)

  it('fails "early" under expire-early, where the truth log frees at half the lease', async () => {
    const o = await judgeTwin(['expire-early'])
    for (const v of o.verdicts) {
      expect(v.verdict).toBe('fail')
      expect(v.evidence.failure).toBe('early')
      expect(grantedOf(o, v.subject)?.detail?.ttlS).toBe(LEASE_S / 2)
      const g = o.grants.find(x => x.requestId === v.subject)!
      expect(freedOf(o, v.subject)!.t).toBeLessThan(g.sentMs + LEASE_S * 1000)
    }
  }, 90_000)
})
