/**
 * Accuracy of the vLLM lease verdicts of the experiments beyond drop-dest-info, against the vLLM twin's truth (issue
 * 31; a benchmark, not a test). Run through scripts/bench-vllm-accuracy.ts:
 * `node --import tsx scripts/bench-vllm-accuracy.ts --experiments abort,wedge,kill,stall,pinned [--rounds 3]
 *  [--bug-rounds 1]` runs each campaign (one twin per campaign, rounds of `pdchaos inject … --journal J` with pdchaos
 * from this checkout's dist/: `npm run build` first) and saves its rows in $TMPDIR/bench-vllm-exp-<campaign>.json;
 * `--experiments report` reads every saved file and writes `## vLLM lease accuracy, the other experiments` of
 * BENCHMARKS.md. Campaigns may run in separate processes (the rows are files), the report once after.
 *
 * The truth per request is scripts/bench-vllm-lease-truth.ts (`leaseTruth`, `pinnedTruth`); pdchaos's release time is
 * the middle of its evidence's `releasedInSampled` (drop-dest-info's counter scrapes, the stall-kv bystander) or
 * else `releasedIn` (the whole second of P's log line); error = that − the truth's `freed.t`.
 */
import {existsSync, mkdtempSync, readFileSync, writeFileSync} from 'node:fs'
import {loadavg} from 'node:os'
import {join} from 'node:path'

import {simDown} from '../src/sim/lifecycle/down.js'
import {vllmUp} from '../src/sim/vllm/up.js'
import {freeVllmPorts} from '../test/sim/lifecycle-helpers.js'
import {runNode} from './bench-common.js'
import {leaseTruth, pinnedTruth, releaseEstimate, type TruthEvent} from './bench-vllm-lease-truth.js'

export const STEP_MS = 20
/** The twin's step as run beyond its timer (the round trip to its workers; scripts/bench-vllm-accuracy.ts). */
export const OVERHEAD_MS = 5
export const TOL_MS = 1

export interface Campaign {
  /** File key and table name. */
  name: string
  experiment: 'abort-mid-transfer' | 'wedge-rank' | 'kill-decode' | 'stall-kv'
  flags: string[]
  leaseS: number
  tp: number
  bugs: string[]
  xferStallTimeoutS?: number
  rounds: number
  /** Every request must fail by the truth and by pdchaos (a bug row). */
  mustFail: boolean
}

export interface Row {
  campaign: string
  round: number
  check: string
  rid: string
  pd: 'pass' | 'fail' | 'unverified'
  pdFailure?: string
  pdWhy: string
  truth: 'pass' | 'fail'
  truthWhy: string
  deadlineBy?: string
  lateMs?: number
  renewals: number
  errorMs?: number
  estimateFrom?: string
  inInterval?: boolean
  windowMs?: [number, number]
  freedInPdWindow?: boolean
}

export interface Saved {
  campaign: Campaign
  rows: Row[]
  loads: number[]
  secs: number
  exits: number[]
  retried: string[]
}

interface JVerdict {
  check: string
  subject: string
  verdict: Row['pd']
  summary: string
  evidence: Record<string, unknown> & {
    releasedIn?: [number, number]
    releasedInSampled?: [number, number]
    windowMs?: [number, number]
    failure?: string
    why?: string
  }
}
interface JScenario {
  verdicts: JVerdict[]
  leases?: Array<{revertedAt: number | null}>
}

const JUDGED = new Set(['kv-lease', 'kv-pinned'])

const readTruth = (dir: string): TruthEvent[] => {
  const f = join(dir, 'truth', 'prefill.jsonl')
  if (!existsSync(f)) return []
  return readFileSync(f, 'utf8')
    .split('\n')
    .filter(Boolean)
    .map(l => JSON.parse(l) as TruthEvent)
}

/** One verdict against the truth: kv-pinned rows first by the "pinned" finding, then every row by the lease. */
export function judgeVerdict(c: Campaign, round: number, v: JVerdict, truth: TruthEvent[], revertedAt?: number): Row {
  const lease = {
    durationMs: c.leaseS * 1000,
    extensionMs: Math.floor((c.leaseS * 2) / 3) * 1000,
    stepMs: STEP_MS + OVERHEAD_MS,
    tolMs: TOL_MS,
  }
  const pin = v.check === 'kv-pinned' && revertedAt ? pinnedTruth(truth, v.subject, revertedAt) : undefined
  const lt = leaseTruth(truth, v.subject, lease)
  const t = pin?.pinned ? {verdict: 'fail' as const, why: `pinned: ${pin.why}`} : lt
  const est = releaseEstimate(v.evidence)
  const win = v.evidence.windowMs
  return {
    campaign: c.name,
    round,
    check: v.check,
    rid: v.subject,
    pd: v.verdict,
    ...(v.evidence.failure ? {pdFailure: v.evidence.failure} : {}),
    pdWhy: v.verdict === 'unverified' ? (v.evidence.why ?? v.summary) : v.summary,
    truth: t.verdict,
    truthWhy: t.why,
    deadlineBy: lt.deadlineBy,
    lateMs: lt.lateMs,
    renewals: lt.renewals,
    ...(est && lt.freedMs !== undefined
      ? {
          errorMs: est.ms - lt.freedMs,
          estimateFrom: est.from,
          inInterval: lt.freedMs >= est.interval[0] && lt.freedMs < est.interval[1],
        }
      : {}),
    ...(win ? {windowMs: win} : {}),
    ...(win && lt.freedMs !== undefined ? {freedInPdWindow: lt.freedMs >= win[0] && lt.freedMs <= win[1]} : {}),
  }
}

async function oneRound(cli: string, c: Campaign, file: string, dir: string, i: number, saved: Saved) {
  for (let attempt = 1; ; attempt++) {
    const journal = join(dir, `${c.name}-${i}-${attempt}.json`)
    const r = await runNode([cli, 'inject', c.experiment, '-c', file, ...c.flags, '--journal', journal], {
      timeoutMs: 240_000,
    })
    try {
      saved.exits.push(r.code ?? -1)
      return JSON.parse(readFileSync(journal, 'utf8')).scenarios[0] as JScenario
    } catch {
      const why = `inject wrote no journal (exit ${r.code}): ${r.stderr.trim().split('\n').slice(-2).join(' | ')}`
      process.stderr.write(`${why}\n`)
      saved.retried.push(why)
      if (attempt >= 2) return undefined
    }
  }
}

/** One campaign: a twin with its bugs, `rounds` injects, every judged verdict against the truth. */
export async function runCampaign(cli: string, c: Campaign, parent: string): Promise<Saved> {
  const saved: Saved = {campaign: c, rows: [], loads: [loadavg()[0]!], secs: 0, exits: [], retried: []}
  const timer = setInterval(() => saved.loads.push(loadavg()[0]!), 10_000)
  const t0 = Date.now()
  const state = mkdtempSync(join(parent, `twin-${c.name}-`))
  try {
    const {base, side} = await freeVllmPorts()
    const up = await vllmUp({
      stateDir: state,
      basePort: base,
      sideChannelPort: side,
      leaseDurationS: c.leaseS,
      stepMs: STEP_MS,
      tp: c.tp,
      bugs: c.bugs,
      ...(c.xferStallTimeoutS ? {xferStallTimeoutS: c.xferStallTimeoutS} : {}),
    })
    for (let i = 0; i < c.rounds; i++) {
      const s = await oneRound(cli, c, up.deploymentFile, parent, i, saved)
      if (!s) continue
      const truth = readTruth(state)
      const reverted = s.leases?.find(l => l.revertedAt)?.revertedAt ?? undefined
      const rows = s.verdicts.filter(v => JUDGED.has(v.check)).map(v => judgeVerdict(c, i, v, truth, reverted))
      saved.rows.push(...rows)
      process.stderr.write(
        `[${c.name}] round ${i + 1}/${c.rounds}: exit ${saved.exits.at(-1)}, ` +
          rows
            .map(r => `${r.check} ${r.pd}/${r.truth}${r.errorMs === undefined ? '' : ` ${r.errorMs.toFixed(0)}ms`}`)
            .join(', ') +
          `, load ${loadavg()[0]!.toFixed(1)}\n`,
      )
    }
  } finally {
    clearInterval(timer)
    await simDown(state).catch(() => undefined)
  }
  saved.loads.push(loadavg()[0]!)
  saved.secs = (Date.now() - t0) / 1000
  return saved
}

export const savedFile = (name: string): string => join(process.env.TMPDIR ?? '/tmp', `bench-vllm-exp-${name}.json`)

export function save(s: Saved): void {
  writeFileSync(savedFile(s.campaign.name), JSON.stringify(s))
}

/** The campaigns of each `--experiments` key: a correct twin `rounds` times, each bug `bugRounds` times. */
export function campaigns(key: string, rounds: number, bugRounds: number): Campaign[] {
  const three = (
    name: string,
    base: Omit<Campaign, 'name' | 'bugs' | 'rounds' | 'mustFail'>,
    bugs: string[],
  ): Campaign[] => [
    {...base, name: `${name}-clean`, bugs: [], rounds, mustFail: false},
    ...bugs.map(b => ({...base, name: `${name}-${b}`, bugs: [b], rounds: bugRounds, mustFail: true})),
  ]
  const leaseBugs = ['lease-never-expires', 'expire-early']
  switch (key) {
    case 'abort':
      return three('abort', {experiment: 'abort-mid-transfer', flags: ['--pins', '2'], leaseS: 4, tp: 1}, leaseBugs)
    case 'wedge':
      return three(
        'wedge',
        {experiment: 'wedge-rank', flags: ['--side', 'decode', '--gpu', '1'], leaseS: 12, tp: 2},
        leaseBugs,
      )
    case 'kill':
      return three('kill', {experiment: 'kill-decode', flags: [], leaseS: 12, tp: 2}, leaseBugs)
    case 'stall':
      return three('stall-xfer', {experiment: 'stall-kv', flags: [], leaseS: 4, tp: 1, xferStallTimeoutS: 2}, [
        'no-renew',
        'lease-never-expires',
      ])
    case 'stall3':
      // A stall timeout 3 s into a 4 s lease (extension 2 s): D's last renewal holds P to about grant + 5 s, so a
      // no-renew P (frees at grant + 4 s) is early by more than the log's second.
      return three('stall-xfer3', {experiment: 'stall-kv', flags: [], leaseS: 4, tp: 1, xferStallTimeoutS: 3}, [
        'no-renew',
      ])
    case 'pinned': {
      // The default twin's finding (a fail by both), and no-renew there: P frees while D still holds the request.
      const base = {experiment: 'stall-kv' as const, flags: [], leaseS: 4, tp: 1, mustFail: true}
      return [
        {...base, name: 'stall-pinned', bugs: [], rounds},
        {...base, name: 'stall-pinned-no-renew', bugs: ['no-renew'], rounds: bugRounds},
      ]
    }
    default:
      throw new Error(`unknown --experiments ${key}: abort, wedge, kill, stall, stall3, pinned, report`)
  }
}
