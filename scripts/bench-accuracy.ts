/**
 * Accuracy of the eviction oracle against the twin's ground truth (issue 5; a benchmark, not a test):
 * `node --import tsx scripts/bench-accuracy.ts [--bursts 2] [--burst-pins 50] [--batches 10] [--batch-pins 10] [--stalls 5]`.
 *
 * A namespace test host (sshd and the twin inside; deadline 2 s, poll 0.5 s, scope all), pdchaos compiled, over SSH:
 * `inject drop-dest-info` in bursts of 50 pins and batches of 10, and `inject stall-kv --mechanism packet-filter`. For every
 * pin: pdchaos's eviction time = evictedAt − (sentAt + the entry offset it assumed; 0 under scope all, which is
 * exactly its journal's evictionSeconds at full precision), the truth = evicted.t − enter(watched queue).t from
 * DIR/truth/prefill.jsonl (bootstrap queue under scope all), error = the difference. Truth verdict: pass iff
 * deadline <= held <= deadline + poll (±1 ms for the twin's own timestamps). A wrong verdict is a pin whose
 * pdchaos verdict differs from the truth's. Then one twin with --bug late-evict and one with --bug early-evict,
 * where every pin must fail by the truth and by pdchaos. Writes `## Accuracy` of BENCHMARKS.md.
 */
import {mkdtempSync, readFileSync, rmSync} from 'node:fs'
import {cpus, tmpdir} from 'node:os'
import {join} from 'node:path'

import {createTestHost, type TestHost} from '../test/harness/test-host.js'
import {truth} from '../test/e2e/cli.js'
import {compiledCli, runNode, stats, verdict, writeSection, type Stats} from './bench-common.js'

const arg = (name: string, d: number): number => {
  const i = process.argv.indexOf(`--${name}`)
  return i > 0 ? Number(process.argv[i + 1]) : d
}
const BURSTS = arg('bursts', 1)
const BURST_PINS = arg('burst-pins', 50)
const BATCHES = arg('batches', 4)
const BATCH_PINS = arg('batch-pins', 50)
const STALLS = arg('stalls', 5)
const STALL_PINS = arg('stall-pins', 10)
const DEADLINE = 2
const POLL = 0.5
const TOLERANCE_S = 0.001

interface JournalPin {rid: string; sentAt: number; evictedAt: number | null; evictionSeconds: number | null; verdict: 'pass' | 'fail'; evidence: {entry?: string}}
interface Journal {contract: {scope: string; deadlineSeconds: number; pollSeconds: number}; pins: JournalPin[]}

interface PinResult {fault: string; rid: string; errorMs: number | null; entryLagMs: number | null; answerLagMs: number | null; rawErrorMs: number | null; truthPass: boolean; pdPass: boolean; truthHeldS: number | null; truthQueue?: string; pdS: number | null}

/** Runs that ended before injecting (no journal: discovery or calibration failed), retried and counted. */
const retried: string[] = []

async function inject(cli: string, host: TestHost, args: string[], dir: string, tag: string): Promise<{journal: Journal; code: number | null}> {
  for (let attempt = 1; ; attempt++) {
    const file = join(dir, `${tag}-${Date.now()}.json`)
    const r = await runNode([cli, 'inject', ...args, '-c', host.deploymentFile, '--journal', file], {timeoutMs: 300_000})
    try {
      return {journal: JSON.parse(readFileSync(file, 'utf8')) as Journal, code: r.code}
    } catch {
      const why = `inject ${args.join(' ')} wrote no journal (exit ${r.code}): ${r.stderr.trim().split('\n').slice(-2).join(' | ')}`
      process.stderr.write(`${why}\n`)
      if (attempt >= 3) throw new Error(why)
      retried.push(why)
      await new Promise((res) => setTimeout(res, 3000))
    }
  }
}

/** Compare every pin of one run with the twin's truth. */
function judge(host: TestHost, fault: string, j: Journal): PinResult[] {
  const {scope, deadlineSeconds: d, pollSeconds: p} = j.contract
  const watched = scope === 'inflight' ? 'inflight' : 'bootstrap'
  const events = truth(host.twin!.stateDir, 'prefill')
  return j.pins.map((pin) => {
    const mine = events.filter((e) => e.rid === pin.rid)
    const enter = mine.find((e) => e.event === 'enter' && e.queue === watched)
    const evicted = mine.find((e) => e.event === 'evicted')
    const held = enter && evicted ? ((evicted.t as number) - (enter.t as number)) / 1000 : null
    const truthPass = held !== null && held >= d - TOLERANCE_S && held <= d + p + TOLERANCE_S
    const offset = /send \+ ([\d.]+) ms/.exec(pin.evidence?.entry ?? '')
    const pdS = pin.evictedAt === null ? null : (pin.evictedAt - pin.sentAt - (offset ? Number(offset[1]) : 0)) / 1000
    return {
      fault, rid: pin.rid, truthHeldS: held,
      entryLagMs: enter ? (enter.t as number) - pin.sentAt : null,
      answerLagMs: evicted && pin.evictedAt !== null ? pin.evictedAt - (evicted.t as number) : null, truthQueue: evicted ? String(evicted.queue) : undefined, pdS,
      errorMs: held !== null && pdS !== null ? (pdS - held) * 1000 : null,
      rawErrorMs: held !== null && pin.evictionSeconds !== null ? (pin.evictionSeconds - held) * 1000 : null,
      truthPass, pdPass: pin.verdict === 'pass',
    }
  })
}

const SETS = {
  burst: `drop-dest-info, ${BURST_PINS} pins at once (--pin-interval 0; contrast, not judged)`,
  batch: `drop-dest-info, ${BATCH_PINS} pins 20 ms apart`,
  stall: `stall-kv (packet-filter), ${STALL_PINS} pins 20 ms apart`,
}
/** Pins the truth fails without a defect: the twin's own watchdog left its window (its poll tick ran late on a loaded machine). */
function truthFailLines(rs: PinResult[]): string[] {
  const bad = rs.filter((r) => !r.truthPass)
  if (bad.length === 0) return []
  const held = bad.flatMap((r) => (r.truthHeldS === null ? [] : [r.truthHeldS]))
  return [`- Without a defect the truth itself failed ${bad.length} pin(s) (${[...new Set(bad.map((r) => r.fault))].join('; ')}): held ` +
    (held.length ? `${Math.min(...held).toFixed(3)}–${Math.max(...held).toFixed(3)} s` : 'never evicted') +
    ` against the window [${DEADLINE}, ${DEADLINE + POLL}] s: the twin's watchdog tick itself ran late on the loaded machine. pdchaos failed ${bad.filter((r) => !r.pdPass).length} of them too.`]
}

/** Where the error comes from, from the two measured parts, and what the wrong verdicts were. */
function whyLines(rs: PinResult[], p99Abs: number, wrongCount: number): string[] {
  if (p99Abs <= 25 && wrongCount === 0) return []
  const q = (xs: number[]): string => (xs.length ? `${stats(xs).p99.toFixed(1)} ms` : '-')
  const entry = rs.flatMap((r) => (r.entryLagMs === null ? [] : [r.entryLagMs]))
  const answer = rs.flatMap((r) => (r.answerLagMs === null ? [] : [r.answerLagMs]))
  const wrongs = rs.filter((r) => r.truthPass !== r.pdPass)
  const falseFail = wrongs.filter((r) => !r.pdPass).length
  return [
    `- Why the goal is missed: the error is mostly ${stats(entry).p99 >= stats(answer).p99 ? 'entry' : 'answer'} lag (entry lag p99 ${q(entry)}; answer lag p99 ${q(answer)}). Under scope all pdchaos takes`,
    '  the send time as the entry into the bootstrap queue; when the twin (one Node process per service, on 2 busy cores) queues',
    '  requests slower than they are sent, entry lags send and its ε (floor 5 ms + 2 × the observation delay calibrated on single',
    `  unfaulted requests) does not cover it. ${falseFail} of the ${wrongs.length} wrong verdicts are false failures (${wrongs.length - falseFail} false passes).`,
  ]
}

const DROP = (n: number): string[] => ['drop-dest-info', '--pins', String(n)]
const DROP_BURST = (n: number): string[] => [...DROP(n), '--pin-interval', '0']
const STALL = (n: number): string[] => ['stall-kv', '--gpu', '1', '--mechanism', 'packet-filter', '--pins', String(n)]

async function campaign(cli: string, dir: string, bugs: string[], runs: Array<{fault: string; args: string[]}>): Promise<PinResult[]> {
  let host: TestHost | undefined
  const out: PinResult[] = []
  try {
    host = await createTestHost({twin: {deadlineSeconds: DEADLINE, pollSeconds: POLL, bugs}})
    for (const [i, run] of runs.entries()) {
      const {journal, code} = await inject(cli, host, run.args, dir, `${bugs.join('+') || 'clean'}-${i}`)
      const res = judge(host, run.fault, journal)
      out.push(...res)
      const errs = res.flatMap((r) => (r.errorMs === null ? [] : [r.errorMs]))
      const wrong = res.filter((r) => r.truthPass !== r.pdPass).length
      process.stderr.write(`[${bugs.join(',') || 'no bug'}] ${run.args.join(' ')}: exit ${code}, ${res.length} pins, ` +
        `${errs.length ? `error p50 ${stats(errs).p50.toFixed(1)} ms max ${stats(errs).max.toFixed(1)} ms` : 'no error measured'}, ` +
        `entry lag max ${Math.max(...res.map((r) => r.entryLagMs ?? 0)).toFixed(1)} ms, answer lag max ${Math.max(...res.map((r) => r.answerLagMs ?? 0)).toFixed(1)} ms, ` +
        `truth pass ${res.filter((r) => r.truthPass).length}, pdchaos pass ${res.filter((r) => r.pdPass).length}, wrong ${wrong}\n`)
    }
  } finally {
    await host?.destroy()
  }
  return out
}

async function main(): Promise<void> {
  process.stderr.write('compiling src/ into node_modules/.cache/pdchaos-bench-accuracy …\n')
  const cli = compiledCli('pdchaos-bench-accuracy')
  const dir = mkdtempSync(join(tmpdir(), 'pdchaos-test-bench-acc-'))
  try {
    const clean = await campaign(cli, dir, [], [
      ...Array.from({length: BURSTS}, () => ({fault: SETS.burst, args: DROP_BURST(BURST_PINS)})),
      ...Array.from({length: BATCHES}, () => ({fault: SETS.batch, args: DROP(BATCH_PINS)})),
      ...Array.from({length: STALLS}, () => ({fault: SETS.stall, args: STALL(STALL_PINS)})),
    ])
    // The goal is judged on pins sent as pdchaos sends them by default (spaced); the burst is shown for contrast.
    const judged = clean.filter((r) => r.fault !== SETS.burst)
    const bugRuns = [{fault: 'drop-dest-info', args: DROP(25)}, {fault: 'stall-kv (packet-filter)', args: STALL(10)}]
    const late = await campaign(cli, dir, ['late-evict'], bugRuns)
    const early = await campaign(cli, dir, ['early-evict'], bugRuns)

    const ms = (x: number): string => `${x.toFixed(1)}`
    const dist = (xs: number[]): Stats | undefined => (xs.length ? stats(xs) : undefined)
    const distRow = (name: string, rs: PinResult[], pick: (r: PinResult) => number | null): string => {
      const s = dist(rs.flatMap((r) => { const v = pick(r); return v === null ? [] : [v] }))
      return s ? `| ${name} | ${s.n} | ${ms(s.min)} | ${ms(s.p50)} | ${ms(s.p90)} | ${ms(s.p99)} | ${ms(s.max)} |` : `| ${name} | 0 | - | - | - | - | - |`
    }
    const wrong = (rs: PinResult[]): number => rs.filter((r) => r.truthPass !== r.pdPass).length
    const byFault = (rs: PinResult[], f: string): PinResult[] => rs.filter((r) => r.fault === f)
    const absErr = judged.flatMap((r) => (r.errorMs === null ? [] : [Math.abs(r.errorMs)]))
    const p99Abs = absErr.length ? stats(absErr).p99 : Number.POSITIVE_INFINITY
    const noTruth = judged.filter((r) => r.errorMs === null).length
    const verdictRow = (name: string, rs: PinResult[], expectAllFail: boolean): string => {
      const tp = rs.filter((r) => r.truthPass).length
      const pp = rs.filter((r) => r.pdPass).length
      const w = wrong(rs)
      const ok = w === 0 && (!expectAllFail || (tp === 0 && pp === 0))
      return `| ${name} | ${rs.length} | ${tp} / ${rs.length - tp} | ${pp} / ${rs.length - pp} | ${w} | ${verdict(ok)} |`
    }
    const sets = [SETS.burst, SETS.batch, SETS.stall]
    const body = [
      `\`node --import tsx scripts/bench-accuracy.ts\`: pdchaos (compiled) over SSH into the namespace test host; the twin inside`,
      `(from the sources via tsx) with deadline ${DEADLINE} s, poll ${POLL} s, scope all, default steady load (one request / 500 ms).`,
      `Pins: \`inject drop-dest-info --pins ${BURST_PINS}\` × ${BURSTS}, \`inject drop-dest-info --pins ${BATCH_PINS}\` × ${BATCHES} and`,
      `\`inject stall-kv --gpu 1 --mechanism packet-filter --pins ${STALL_PINS}\` × ${STALLS}, pins 20 ms apart (inject's default --pin-interval);`,
      `and for contrast \`inject drop-dest-info --pins ${BURST_PINS} --pin-interval 0\` × ${BURSTS} (all at once), not judged against the goal.`,
      'Per pin: pdchaos\'s time = evictedAt − sentAt − its assumed entry offset (0 under scope all: the journal\'s `evictionSeconds`',
      'at full precision); truth = `evicted.t − enter(bootstrap).t` in the twin\'s truth/prefill.jsonl; error = pdchaos − truth, which is',
      'exactly entry lag (send → the twin\'s bootstrap-queue entry) + answer lag (the twin\'s eviction → pdchaos reading the answer).',
      `Truth verdict: pass iff deadline <= held <= deadline + poll (±${TOLERANCE_S * 1000} ms for the twin's own stamps).`,
      `Measured ${new Date().toISOString().slice(0, 10)} on ${cpus().length} cores with other work running.`,
      '',
      'Error = pdchaos − truth (ms), and its two parts:',
      '',
      '| pins | n | min | p50 | p90 | p99 | max |',
      '|---|---|---|---|---|---|---|',
      distRow('**judged (error)**', judged, (r) => r.errorMs),
      distRow('judged, \\|error\\|', judged, (r) => (r.errorMs === null ? null : Math.abs(r.errorMs))),
      ...sets.map((f) => distRow(`${f} (error)`, byFault(clean, f), (r) => r.errorMs)),
      ...sets.map((f) => distRow(`${f}: entry lag`, byFault(clean, f), (r) => r.entryLagMs)),
      ...sets.map((f) => distRow(`${f}: answer lag`, byFault(clean, f), (r) => r.answerLagMs)),
      '',
      'Verdicts (truth and pdchaos as pass / fail; wrong = the two differ):',
      '',
      '| twin | pins | truth | pdchaos | wrong | goal |',
      '|---|---|---|---|---|---|',
      verdictRow('**no defect, judged**', judged, false),
      ...sets.map((f) => verdictRow(`no defect: ${f}`, byFault(clean, f), false)),
      verdictRow('`--bug late-evict` (25 drop-dest-info + 10 stall-kv pins)', late, true),
      verdictRow('`--bug early-evict` (25 drop-dest-info + 10 stall-kv pins)', early, true),
      '',
      `- p99 of |error| over ${absErr.length} pins: ${p99Abs.toFixed(1)} ms (goal <= 25 ms: ${verdict(p99Abs <= 25)}); wrong verdicts without a defect: ${wrong(judged)} (goal 0: ${verdict(wrong(judged) === 0)}); the burst: ${wrong(byFault(clean, SETS.burst))} wrong of ${byFault(clean, SETS.burst).length}.`,
      ...(noTruth ? [`- ${noTruth} pin(s) have no error (no eviction in the truth or no answer seen by pdchaos); they count in the verdict rows only.`] : []),
      `- With the defects every pin must fail by both: late-evict truth ${late.filter((r) => !r.truthPass).length}/${late.length} fail, pdchaos ${late.filter((r) => !r.pdPass).length}/${late.length}; ` +
        `early-evict truth ${early.filter((r) => !r.truthPass).length}/${early.length}, pdchaos ${early.filter((r) => !r.pdPass).length}/${early.length}.`,
      ...truthFailLines(judged),
      ...whyLines(judged, p99Abs, wrong(judged)),
      ...(retried.length ? [`- ${retried.length} inject run(s) stopped before injecting and were retried: ${retried.map((w) => w.replace(/\|/g, '\\|')).join('; ')}`] : []),
    ].join('\n')
    writeSection('Accuracy', body)
    process.stdout.write(body + '\n')
  } finally {
    rmSync(dir, {recursive: true, force: true})
  }
}

await main()
