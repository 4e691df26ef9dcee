/**
 * Accuracy of the eviction oracle against the twin's ground truth (issue 5; a benchmark, not a test):
 * `node --import tsx scripts/bench-accuracy.ts [--bursts 2] [--burst-pins 50] [--batches 10] [--batch-pins 10]
 * [--stalls 5] [--stall-pins 10]`.
 *
 * A namespace test host (sshd and the twin inside; deadline 2 s, poll 0.5 s, scope all), pdchaos compiled, over SSH:
 * `inject drop-dest-info` in bursts of 50 pins and batches of 10, and `inject stall-kv --mechanism packet-filter`. For
 * every
 * pin: pdchaos's eviction time = evictedAt − (sentAt + the entry offset it assumed; 0 under scope all, which is
 * exactly its journal's evictionSeconds at full precision), the truth = evicted.t − enter(watched queue).t from
 * DIR/truth/prefill.jsonl (bootstrap queue under scope all), error = the difference. Truth verdict: pass iff
 * deadline <= held <= deadline + poll (±1 ms for the twin's own timestamps). A wrong verdict is a pin whose
 * pdchaos verdict differs from the truth's. Then one twin with --bug late-evict and one with --bug early-evict,
 * where every pin must fail by the truth and by pdchaos. In the same run, a second host whose twin has rail NICs
 * (`sim up --rail-nics --ucx-rc-timeout 2s`: each GPU's KV as UDP to 4791 over its own interface, UCX giving up only
 * after 2 s × 8 transmissions ≈ 16 s, past the deadline) gets as many `inject stall-kv --gpu 1` (auto: the rail's
 * netfilter match) as the TCP stalls, judged the same way, and the two stall paths are tabled side by side. A pin a
 * transport error released is no accuracy sample (the oracle calls it unverified): counted apart.
 * Writes `## Accuracy` of BENCHMARKS.md.
 */
import {mkdtempSync, readFileSync, rmSync} from 'node:fs'
import {cpus, loadavg, tmpdir} from 'node:os'
import {join} from 'node:path'

import {createTestHost, type TestHost} from '../test/harness/test-host.js'
import {truth} from '../test/e2e/cli.js'
import {arg, compiledCli, runNode, stats, verdict, writeSection, type Stats} from './bench-common.js'

const BURSTS = arg('bursts', 1)
const BURST_PINS = arg('burst-pins', 50)
const BATCHES = arg('batches', 4)
const BATCH_PINS = arg('batch-pins', 50)
const STALLS = arg('stalls', 5)
const STALL_PINS = arg('stall-pins', 10)
const DEADLINE = 2
const POLL = 0.5
const TOLERANCE_S = 0.001

interface JournalPin {
  rid: string
  sentAt: number
  evictedAt: number | null
  evictionSeconds: number | null
  verdict: 'pass' | 'fail' | 'unverified'
  evidence: {entry?: string; releasedBy?: string; why?: string}
}
interface Journal {
  contract: {scope: string; deadlineSeconds: number; pollSeconds: number}
  pins: JournalPin[]
  mechanism?: string
  description?: string
}

interface PinResult {
  fault: string
  rid: string
  errorMs: number | null
  entryLagMs: number | null
  answerLagMs: number | null
  rawErrorMs: number | null
  truthPass: boolean
  pdPass: boolean
  truthHeldS: number | null
  truthQueue?: string
  pdS: number | null
  /**
   * pdchaos called the pin unverified because a transport error released it (the rail path with too short an RC limit):
   * not an accuracy sample.
   */
  byTransport: boolean
  /**
   * pdchaos called the pin unverified for another reason (shown, and counted as not passed in the verdict rows): why.
   */
  otherUnverified?: string
}

/** Runs that ended before injecting (no journal: discovery or calibration failed), retried and counted. */
const retried: string[] = []

async function inject(
  cli: string,
  host: TestHost,
  args: string[],
  dir: string,
  tag: string,
): Promise<{journal: Journal; code: number | null}> {
  for (let attempt = 1; ; attempt++) {
    const file = join(dir, `${tag}-${Date.now()}.json`)
    const r = await runNode([cli, 'inject', ...args, '-c', host.deploymentFile, '--journal', file], {
      timeoutMs: 300_000,
    })
    try {
      return {journal: JSON.parse(readFileSync(file, 'utf8')) as Journal, code: r.code}
    } catch {
      const why =
        `inject ${args.join(' ')} wrote no journal ` +
        `(exit ${r.code}): ${r.stderr.trim().split('\n').slice(-2).join(' | ')}`
      process.stderr.write(`${why}\n`)
      if (attempt >= 3) throw new Error(why)
      retried.push(why)
      await new Promise(res => setTimeout(res, 3000))
    }
  }
}

/** Compare every pin of one run with the twin's truth. */
function judge(host: TestHost, fault: string, j: Journal): PinResult[] {
  const {scope, deadlineSeconds: d, pollSeconds: p} = j.contract
  const watched = scope === 'inflight' ? 'inflight' : 'bootstrap'
  const events = truth(host.twin!.stateDir, 'prefill')
  return j.pins.map(pin => {
    const mine = events.filter(e => e.rid === pin.rid)
    const enter = mine.find(e => e.event === 'enter' && e.queue === watched)
    const evicted = mine.find(e => e.event === 'evicted')
    const held = enter && evicted ? ((evicted.t as number) - (enter.t as number)) / 1000 : null
    const truthPass = held !== null && held >= d - TOLERANCE_S && held <= d + p + TOLERANCE_S
    const offset = /send \+ ([\d.]+) ms/.exec(pin.evidence?.entry ?? '')
    const pdS = pin.evictedAt === null ? null : (pin.evictedAt - pin.sentAt - (offset ? Number(offset[1]) : 0)) / 1000
    return {
      fault,
      rid: pin.rid,
      truthHeldS: held,
      entryLagMs: enter ? (enter.t as number) - pin.sentAt : null,
      answerLagMs: evicted && pin.evictedAt !== null ? pin.evictedAt - (evicted.t as number) : null,
      truthQueue: evicted ? String(evicted.queue) : undefined,
      pdS,
      errorMs: held !== null && pdS !== null ? (pdS - held) * 1000 : null,
      rawErrorMs: held !== null && pin.evictionSeconds !== null ? (pin.evictionSeconds - held) * 1000 : null,
      truthPass,
      pdPass: pin.verdict === 'pass',
      byTransport:
        pin.verdict === 'unverified' && /^(transport-error|transfer-failed)$/.test(pin.evidence?.releasedBy ?? ''),
      ...(pin.verdict === 'unverified' && !/^(transport-error|transfer-failed)$/.test(pin.evidence?.releasedBy ?? '')
        ? {otherUnverified: pin.evidence?.why ?? 'no reason given'}
        : {}),
    }
  })
}

const SETS = {
  burst: `drop-dest-info, ${BURST_PINS} pins at once (--pin-interval 0; contrast, not judged)`,
  batch: `drop-dest-info, ${BATCH_PINS} pins 20 ms apart`,
  stall: `stall-kv (packet-filter), ${STALL_PINS} pins 20 ms apart`,
  rail: `stall-kv (rail NIC), ${STALL_PINS} pins 20 ms apart`,
}
/** The rail-NIC twin's flags beside the deadline and poll: an RC limit (2 s × (7 + 1) ≈ 16 s) past deadline + poll. */
const RAIL_ARGS = ['--rail-nics', '--ucx-rc-timeout', '2s']
/**
 * What the rail stalls' journals named as the mechanism (the report shows it: auto must have picked the rail's filter).
 */
const railMechanisms = new Set<string>()
/**
 * Pins the truth fails without a defect: the twin's own watchdog left its window (its poll tick ran late on a loaded
 * machine).
 */
function truthFailLines(rs: PinResult[]): string[] {
  const bad = rs.filter(r => !r.truthPass)
  if (bad.length === 0) return []
  const held = bad.flatMap(r => (r.truthHeldS === null ? [] : [r.truthHeldS]))
  return [
    `- Without a defect the truth itself failed ${bad.length} pin(s) ` +
      `(${[...new Set(bad.map(r => r.fault))].join('; ')}): held ` +
      (held.length ? `${Math.min(...held).toFixed(3)}–${Math.max(...held).toFixed(3)} s` : 'never evicted') +
      ` against the window [${DEADLINE}, ${DEADLINE + POLL}] s: the twin's watchdog tick itself ran late on the ` +
      `loaded machine. pdchaos failed ${bad.filter(r => !r.pdPass).length} of them too.`,
  ]
}

/** Where the error comes from, from the two measured parts, and what the wrong verdicts were. */
function whyLines(rs: PinResult[], p99Abs: number, wrongCount: number): string[] {
  if (p99Abs <= 25 && wrongCount === 0) return []
  const q = (xs: number[]): string => (xs.length ? `${stats(xs).p99.toFixed(1)} ms` : '-')
  const entry = rs.flatMap(r => (r.entryLagMs === null ? [] : [r.entryLagMs]))
  const answer = rs.flatMap(r => (r.answerLagMs === null ? [] : [r.answerLagMs]))
  const wrongs = rs.filter(r => r.truthPass !== r.pdPass)
  const falseFail = wrongs.filter(r => !r.pdPass).length
  const entryMost = stats(entry).p99 >= stats(answer).p99
  return [
    `- Why the goal is missed: the error is mostly ${entryMost ? 'entry' : 'answer'} lag (entry lag ` +
      `p99 ${q(entry)}; answer lag p99 ${q(answer)}). ` +
      (entryMost
        ? 'Under scope all pdchaos takes the send time as the entry into the bootstrap queue; when the twin (one ' +
          'Node process per service, ' +
          'on 2 busy cores) queues requests slower than they are sent, entry lags send'
        : "The twin's eviction reaches pdchaos that much later (the 500 answer over HTTP to the namespace's " +
          'address, read by ' +
          "pdchaos's Node process on the same 2 busy cores)"),
    '  and ε (floor 5 ms + 2 × the observation delay calibrated on single unfaulted requests) does not cover it; ' +
      'the error is the',
    "  machine's scheduling delay, not the oracle's arithmetic (see the load average above)." +
      (wrongs.length
        ? ` ${falseFail} of the ${wrongs.length} wrong verdicts are false failures (${wrongs.length - falseFail} ` +
          `false passes).`
        : ' It moved no verdict: 0 wrong.'),
  ]
}

const DROP = (n: number): string[] => ['drop-dest-info', '--pins', String(n)]
const DROP_BURST = (n: number): string[] => [...DROP(n), '--pin-interval', '0']
const STALL = (n: number): string[] => ['stall-kv', '--gpu', '1', '--mechanism', 'packet-filter', '--pins', String(n)]
/** On the rail twin the mechanism is left to auto: discovery sees RDMA (UCX_TLS=rc) and picks GPU 1's rail filter. */
const STALL_RAIL = (n: number): string[] => ['stall-kv', '--gpu', '1', '--pins', String(n)]

async function campaign(
  cli: string,
  dir: string,
  twin: {bugs?: string[]; args?: string[]; label?: string},
  runs: Array<{fault: string; args: string[]}>,
): Promise<PinResult[]> {
  let host: TestHost | undefined
  const out: PinResult[] = []
  const bugs = twin.bugs ?? []
  const label = twin.label ?? (bugs.join(',') || 'no bug')
  try {
    host = await createTestHost({twin: {deadlineSeconds: DEADLINE, pollSeconds: POLL, bugs, args: twin.args}})
    for (const [i, run] of runs.entries()) {
      const {journal, code} = await inject(cli, host, run.args, dir, `${label.replace(/\W+/g, '-')}-${i}`)
      if (twin.args?.includes('--rail-nics')) {
        // Each lease names its own nft table: one entry per distinct mechanism, the table's hash left out.
        railMechanisms.add(
          `${journal.mechanism ?? '?'}: ${journal.description ?? '?'}`.replace(/pdchaos_h[0-9a-f]+/g, 'pdchaos_h…'),
        )
        process.stderr.write(`[${label}] mechanism ${journal.mechanism}: ${journal.description}\n`)
      }
      const res = judge(host, run.fault, journal)
      out.push(...res)
      const errs = res.flatMap(r => (r.errorMs === null ? [] : [r.errorMs]))
      const wrong = res.filter(r => r.truthPass !== r.pdPass).length
      process.stderr.write(
        `[${label}] ${run.args.join(' ')}: exit ${code}, ${res.length} pins, ` +
          `${
            errs.length
              ? `error p50 ${stats(errs).p50.toFixed(1)} ms ` + `max ${stats(errs).max.toFixed(1)} ms`
              : 'no error measured'
          }, ` +
          `entry lag max ${Math.max(...res.map(r => r.entryLagMs ?? 0)).toFixed(1)} ms, answer lag ` +
          `max ${Math.max(...res.map(r => r.answerLagMs ?? 0)).toFixed(1)} ms, ` +
          `truth pass ${res.filter(r => r.truthPass).length}, pdchaos pass ${res.filter(r => r.pdPass).length}, ` +
          `wrong ${wrong}` +
          `${res.some(r => r.byTransport) ? `, released by transport ${res.filter(r => r.byTransport).length}` : ''}\n`,
      )
    }
  } finally {
    await host?.destroy()
  }
  return out
}

/** The 1-minute load average, sampled every 10 s through the run (the machine is shared: the error tracks it). */
const loads: number[] = []

async function main(): Promise<void> {
  loads.push(loadavg()[0]!)
  const sampler = setInterval(() => loads.push(loadavg()[0]!), 10_000)
  sampler.unref()
  process.stderr.write('compiling src/ into node_modules/.cache/pdchaos-bench-accuracy …\n')
  const cli = compiledCli('pdchaos-bench-accuracy')
  const dir = mkdtempSync(join(tmpdir(), 'pdchaos-test-bench-acc-'))
  try {
    const cleanAll = await campaign(cli, dir, {}, [
      ...Array.from({length: BURSTS}, () => ({fault: SETS.burst, args: DROP_BURST(BURST_PINS)})),
      ...Array.from({length: BATCHES}, () => ({fault: SETS.batch, args: DROP(BATCH_PINS)})),
      ...Array.from({length: STALLS}, () => ({fault: SETS.stall, args: STALL(STALL_PINS)})),
    ])
    // The rail-NIC stall path, in the same run: as many stall pins as over TCP, on a twin whose KV crosses rail NICs.
    const railAll = await campaign(
      cli,
      dir,
      {args: RAIL_ARGS, label: 'rail NICs'},
      Array.from({length: STALLS}, () => ({fault: SETS.rail, args: STALL_RAIL(STALL_PINS)})),
    )
    // A pin a transport error released is the oracle's unverified, not an accuracy sample (counted apart, per set).
    const clean = cleanAll.filter(r => !r.byTransport)
    const rail = railAll.filter(r => !r.byTransport)
    const byTransport = [...cleanAll, ...railAll].filter(r => r.byTransport)
    const released = (f: string): number => byTransport.filter(r => r.fault === f).length
    // auto must have picked GPU 1's rail (the journals' mechanism and description name the interface).
    const railNamed = railMechanisms.size > 0 && [...railMechanisms].every(m => /\brail1\b/.test(m))
    const noDefect = [...clean, ...rail]
    // The goal is judged on pins sent as pdchaos sends them by default (spaced), on both stall paths; the burst is
    // shown for contrast.
    const judged = noDefect.filter(r => r.fault !== SETS.burst)
    const bugRuns = [
      {fault: 'drop-dest-info', args: DROP(25)},
      {fault: 'stall-kv (packet-filter)', args: STALL(10)},
    ]
    const late = await campaign(cli, dir, {bugs: ['late-evict']}, bugRuns)
    const early = await campaign(cli, dir, {bugs: ['early-evict']}, bugRuns)

    const ms = (x: number): string => `${x.toFixed(1)}`
    const dist = (xs: number[]): Stats | undefined => (xs.length ? stats(xs) : undefined)
    const distRow = (name: string, rs: PinResult[], pick: (r: PinResult) => number | null): string => {
      const s = dist(
        rs.flatMap(r => {
          const v = pick(r)
          return v === null ? [] : [v]
        }),
      )
      return s
        ? `| ${name} | ${s.n} | ${ms(s.min)} | ${ms(s.p50)} | ${ms(s.p90)} | ${ms(s.p99)} | ${ms(s.max)} |`
        : `| ${name} | 0 | - | - | - | - | - |`
    }
    const wrong = (rs: PinResult[]): number => rs.filter(r => r.truthPass !== r.pdPass).length
    const byFault = (rs: PinResult[], f: string): PinResult[] => rs.filter(r => r.fault === f)
    const absErr = judged.flatMap(r => (r.errorMs === null ? [] : [Math.abs(r.errorMs)]))
    const p99Abs = absErr.length ? stats(absErr).p99 : Number.POSITIVE_INFINITY
    const noTruth = judged.filter(r => r.errorMs === null).length
    const verdictRow = (name: string, rs: PinResult[], expectAllFail: boolean): string => {
      const tp = rs.filter(r => r.truthPass).length
      const pp = rs.filter(r => r.pdPass).length
      const w = wrong(rs)
      const ok = w === 0 && (!expectAllFail || (tp === 0 && pp === 0))
      return (
        `| ${name} | ${rs.length} | ${tp} / ${rs.length - tp} | ${pp} / ${rs.length - pp} | ${w} ` +
        `| ${verdict(ok)} |`
      )
    }
    const sets = [SETS.burst, SETS.batch, SETS.stall, SETS.rail]
    /** One stall path's figures: pins, |error| p50 / p99 / max, wrong verdicts, pins released by the transport. */
    const pathRow = (name: string, rs: PinResult[], byTransport: number): string => {
      const abs = rs.flatMap(r => (r.errorMs === null ? [] : [Math.abs(r.errorMs)]))
      const s = dist(abs)
      const cells = s ? `${ms(s.p50)} | ${ms(s.p99)} | ${ms(s.max)}` : '- | - | -'
      return `| ${name} | ${rs.length} | ${abs.length} | ${cells} | ${wrong(rs)} | ${byTransport} |`
    }
    const loadRange = (): string => {
      const s = stats(loads)
      return `${s.min.toFixed(1)}–${s.max.toFixed(1)} (median ${s.p50.toFixed(1)})`
    }
    const railMech = [...railMechanisms].map(m => m.replace(/\|/g, '\\|').replace(/\.$/, '')).join('; ')
    const body = [
      `\`node --import tsx scripts/bench-accuracy.ts\`: pdchaos (compiled) over SSH into the namespace test host; ` +
        `the twin inside`,
      `(from the sources via tsx) with deadline ${DEADLINE} s, poll ${POLL} s, scope all, default steady load (one ` +
        `request / 500 ms).`,
      `Pins: \`inject drop-dest-info --pins ${BURST_PINS}\` × ${BURSTS}, \`inject drop-dest-info ` +
        `--pins ${BATCH_PINS}\` × ${BATCHES} and`,
      `\`inject stall-kv --gpu 1 --mechanism packet-filter --pins ${STALL_PINS}\` × ${STALLS}, pins 20 ms apart ` +
        `(inject's default --pin-interval);`,
      `on a second host in the same run, the twin with \`--rail-nics --ucx-rc-timeout 2s\` (same deadline, poll, ` +
        `scope and load),`,
      `\`inject stall-kv --gpu 1 --pins ${STALL_PINS}\` × ${STALLS} (auto mechanism: the rail NIC's filter);`,
      `and for contrast \`inject drop-dest-info --pins ${BURST_PINS} --pin-interval 0\` × ${BURSTS} (all at once), ` +
        `not judged against the goal.`,
      "Per pin: pdchaos's time = evictedAt − sentAt − its assumed entry offset (0 under scope all: the journal's " +
        '`evictionSeconds`',
      "at full precision); truth = `evicted.t − enter(bootstrap).t` in the twin's truth/prefill.jsonl; error = " +
        'pdchaos − truth, which is',
      "exactly entry lag (send → the twin's bootstrap-queue entry) + answer lag (the twin's eviction → pdchaos " +
        'reading the answer).',
      `Truth verdict: pass iff deadline <= held <= deadline + poll (±${TOLERANCE_S * 1000} ms for the twin's own ` +
        `stamps).`,
      `Measured ${new Date().toISOString().slice(0, 10)} on ${cpus().length} cores with other work running: ` +
        `1-minute load average ` +
        `${loadRange()} over the run (sampled every 10 s).`,
      '',
      'Stall paths side by side (no defect, same run; |error| in ms; "evicted" = pins with both a truth eviction ' +
        'and a pdchaos answer):',
      '',
      '| stall path | pins | evicted | p50 \\|error\\| | p99 \\|error\\| | max \\|error\\| | wrong verdicts | ' +
        'released by transport (unverified, not judged) |',
      '|---|---|---|---|---|---|---|---|',
      pathRow(
        "TCP: `--mechanism packet-filter` (the KV connection's port)",
        byFault(clean, SETS.stall),
        released(SETS.stall),
      ),
      pathRow(
        `rail NIC: auto (${railNamed ? '`rail1`, UDP 4791' : '**not `rail1`: see the mechanism below**'})`,
        rail,
        released(SETS.rail),
      ),
      '',
      'The rail path: the twin gives each GPU its own NIC (a veth `rail<g>`, 198.18.<g>.1) whose RC engine carries ' +
        'the KV as',
      "UDP to port 4791, RoCEv2's; pdchaos finds GPU 1's NIC from `nvidia-smi topo -m` and drops UDP 4791 on " +
        '`rail1` with netfilter',
      "(the twin's RoCE is kernel UDP; a hardware RoCE NIC bypasses netfilter). UCX's RC limit is 2 s × (7 retries " +
        '+ 1) ≈ 16 s,',
      `past deadline + poll (${DEADLINE + POLL} s), so the stall holds the pin in Transferring until the watchdog ` +
        `evicts it. Under scope all`,
      'the truth is measured from the bootstrap-queue entry on both paths, as the watchdog measures it. Both paths ' +
        'were measured',
      `in the same run, one host after the ` +
        `other.${railMech ? ` Mechanism as the rail journals named it: ${railMech}.` : ''}`,
      '',
      'Error = pdchaos − truth (ms), and its two parts:',
      '',
      '| pins | n | min | p50 | p90 | p99 | max |',
      '|---|---|---|---|---|---|---|',
      distRow('**judged (error)**', judged, r => r.errorMs),
      distRow('judged, \\|error\\|', judged, r => (r.errorMs === null ? null : Math.abs(r.errorMs))),
      ...sets.map(f => distRow(`${f} (error)`, byFault(noDefect, f), r => r.errorMs)),
      ...sets.map(f => distRow(`${f}: entry lag`, byFault(noDefect, f), r => r.entryLagMs)),
      ...sets.map(f => distRow(`${f}: answer lag`, byFault(noDefect, f), r => r.answerLagMs)),
      '',
      'Verdicts (truth and pdchaos as pass / fail; wrong = the two differ):',
      '',
      '| twin | pins | truth | pdchaos | wrong | goal |',
      '|---|---|---|---|---|---|',
      verdictRow('**no defect, judged**', judged, false),
      ...sets.map(f => verdictRow(`no defect: ${f}`, byFault(noDefect, f), false)),
      verdictRow('`--bug late-evict` (25 drop-dest-info + 10 stall-kv pins)', late, true),
      verdictRow('`--bug early-evict` (25 drop-dest-info + 10 stall-kv pins)', early, true),
      '',
      `- p99 of |error| over ${absErr.length} pins (both stall paths and the spaced ` +
        `drop-dest-info): ${p99Abs.toFixed(1)} ms (goal <= 25 ms: ${verdict(p99Abs <= 25)}); wrong verdicts ` +
        `without a defect: ${wrong(judged)} (goal 0: ${verdict(wrong(judged) === 0)}); the ` +
        `burst: ${wrong(byFault(clean, SETS.burst))} wrong of ${byFault(clean, SETS.burst).length}.`,
      ...(byTransport.length
        ? [
            `- Released by a transport error before the watchdog (the oracle's unverified, not accuracy samples, ` +
              `in no row above but the path table's last column): ` +
              `${sets
                .map(f => `${released(f)} ${f}`)
                .filter(x => !x.startsWith('0 '))
                .join('; ')}. With the RC limit past the deadline none is expected.`,
          ]
        : []),
      ...(() => {
        const other = judged.filter(r => r.otherUnverified !== undefined)
        return other.length
          ? [
              `- pdchaos left ${other.length} pin(s) unverified for another reason than a transport release ` +
                `(counted as not passed above, so as wrong where the truth ` +
                `passed): ${[...new Set(other.map(r => r.otherUnverified!))].slice(0, 2).join(' / ').replace(/\|/g, '\\|')}.`,
            ]
          : []
      })(),
      ...(noTruth
        ? [
            `- ${noTruth} pin(s) have no error (no eviction in the truth or no answer seen by pdchaos); they count ` +
              `in the verdict rows only.`,
          ]
        : []),
      `- With the defects every pin must fail by both: late-evict ` +
        `truth ${late.filter(r => !r.truthPass).length}/${late.length} fail, ` +
        `pdchaos ${late.filter(r => !r.pdPass).length}/${late.length}; ` +
        `early-evict truth ${early.filter(r => !r.truthPass).length}/${early.length}, ` +
        `pdchaos ${early.filter(r => !r.pdPass).length}/${early.length}.`,
      ...truthFailLines(judged),
      ...whyLines(judged, p99Abs, wrong(judged)),
      ...(retried.length
        ? [
            `- ${retried.length} inject run(s) stopped before injecting and were ` +
              `retried: ${retried.map(w => w.replace(/\|/g, '\\|')).join('; ')}`,
          ]
        : []),
    ].join('\n')
    writeSection('Accuracy', body)
    process.stdout.write(body + '\n')
  } finally {
    clearInterval(sampler)
    rmSync(dir, {recursive: true, force: true})
  }
}

await main()
