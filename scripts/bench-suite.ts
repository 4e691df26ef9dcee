/**
 * Benchmark of `pdchaos suite` (not a test): `node --import tsx scripts/bench-suite.ts`.
 * 1. The built-in suite on a fresh twin with a production-like watchdog (BENCH_DEADLINE, default 20 s; poll 1 s): wall
 * time
 *    against its floor (sum over batches of the longest deadline + poll, plus the restart's health waits, settle and
 *    watch), and the same scenarios one at a time (`--one-at-a-time`) in the same run.
 * 2. One scenario of 1,000 concurrent pins (drop-dest-info), a verdict per pin, with the CLI process's peak RSS
 *    (VmHWM from /proc/<pid>/status, polled until exit).
 * The CLI runs from the sources through tsx (bin/dev.js), as the tests run it: no build needed.
 * Writes the `## Suite` section of BENCHMARKS.md (other sections are kept).
 */
import {spawn} from 'node:child_process'
import {mkdtempSync, readFileSync, rmSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {fileURLToPath} from 'node:url'

import {simDown} from '../src/sim/lifecycle/down.js'
import {simUp} from '../src/sim/lifecycle/up.js'
import {writeSection} from './bench-common.js'

const BIN = fileURLToPath(new URL('../bin/dev.js', import.meta.url))
const PINS = Number(process.env.BENCH_PINS ?? 1000)
// A night runs with production deadlines; with the twin's 3 s quick-start deadline the fixed per-batch work (discovery,
// calibration, canaries, drain) would dominate every ratio.
const DEADLINE = Number(process.env.BENCH_DEADLINE ?? 20)
const POLL = Number(process.env.BENCH_POLL ?? 1)

interface Cli {
  code: number | null
  stdout: string
  stderr: string
  ms: number
  peakRssKb: number
}

function cli(args: string[], timeoutMs: number): Promise<Cli> {
  const t0 = performance.now()
  const child = spawn(process.execPath, [BIN, ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
    env: {...process.env, OCLIF_SKIP_NEW_VERSION_CHECK: '1'},
  })
  let stdout = ''
  let stderr = ''
  let peak = 0
  child.stdout.on('data', (d: Buffer) => {
    stdout += d.toString()
  })
  child.stderr.on('data', (d: Buffer) => {
    stderr += d.toString()
  })
  const poll = setInterval(() => {
    try {
      const m = /VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${child.pid}/status`, 'utf8'))
      if (m) peak = Math.max(peak, Number(m[1]))
    } catch {}
  }, 50)
  const killer = setTimeout(() => child.kill('SIGINT'), timeoutMs)
  return new Promise(resolve =>
    child.on('close', code => {
      clearInterval(poll)
      clearTimeout(killer)
      resolve({code, stdout, stderr, ms: performance.now() - t0, peakRssKb: peak})
    }),
  )
}

const s = (ms: number) => `${(ms / 1000).toFixed(1)} s`

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'pdchaos-bench-suite-'))
  try {
    // A random high base port, retried: other twins may run on this machine.
    let up: Awaited<ReturnType<typeof simUp>> | undefined
    for (let attempt = 0; !up && attempt < 8; attempt++) {
      try {
        up = await simUp({
          stateDir: join(dir, 'twin'),
          deadlineS: DEADLINE,
          pollS: POLL,
          basePort: 41_000 + Math.floor(Math.random() * 800) * 10,
        })
      } catch (error) {
        if (attempt === 7 || !/already in use/.test(String(error))) throw error
      }
    }
    const file = up!.deploymentFile
    const batched = await cli(['suite', '-c', file, '--json'], 300_000)
    const seq = await cli(['suite', '-c', file, '--json', '--one-at-a-time'], 600_000)
    const jb = JSON.parse(batched.stdout) as Record<string, any>
    const js = JSON.parse(seq.stdout) as Record<string, any>
    const faultMs = (j: Record<string, any>) =>
      j.batches.filter((b: any) => !b.scenarios.includes('co-restart')).reduce((a: number, b: any) => a + b.ms, 0)
    const faultFloor = (j: Record<string, any>) =>
      j.batches.filter((b: any) => !b.scenarios.includes('co-restart')).reduce((a: number, b: any) => a + b.floorMs, 0)

    // A suite whose scenarios all batch: stall-kv on each prefill GPU (the built-in suite can batch only 3 of its 5).
    const wideFile = join(dir, 'wide.yaml')
    writeFileSync(
      wideFile,
      `name: wide\nscenarios:\n${[0, 1, 2, 3]
        .map(
          g =>
            `  - {name: stall gpu${g}, fault: stall-kv, params: ` + `{gpu: ${g}, mechanism: packet-filter}, pins: 2}`,
        )
        .join('\n')}\n`,
    )
    const wideB = await cli(['suite', wideFile, '-c', file, '--json'], 300_000)
    const wideS = await cli(['suite', wideFile, '-c', file, '--json', '--one-at-a-time'], 300_000)
    const jwb = JSON.parse(wideB.stdout) as Record<string, any>
    const jws = JSON.parse(wideS.stdout) as Record<string, any>

    const pinsFile = join(dir, 'pins.yaml')
    writeFileSync(
      pinsFile,
      `name: many-pins\nscenarios:\n  - {name: pins-${PINS}, fault: drop-dest-info, pins: ${PINS}}\nload: ` +
        `{intervalMs: 500, promptTokens: 16, canaries: 2}\n`,
    )
    const many = await cli(['suite', pinsFile, '-c', file, '--json', '--journal', join(dir, 'many.json')], 300_000)
    const jm = JSON.parse(many.stdout) as Record<string, any>
    const pins = jm.scenarios[0].pins as Array<{
      verdict: string
      evictionSeconds: number | null
      bounds: [number, number]
    }>
    // The twin's ground truth: how long each pin really sat in the bootstrap queue before the watchdog evicted it.
    const truth = new Map<string, {enter?: number; evicted?: number}>()
    for (const line of readFileSync(join(dir, 'twin', 'truth', 'prefill.jsonl'), 'utf8').split('\n')) {
      if (!line) continue
      const e = JSON.parse(line) as {rid?: string; event?: string; queue?: string; t: number}
      if (!e.rid) continue
      const x = truth.get(e.rid) ?? {}
      if (e.event === 'enter' && e.queue === 'bootstrap') x.enter ??= e.t
      if (e.event === 'evicted') x.evicted ??= e.t
      truth.set(e.rid, x)
    }
    const heldS = (pins as Array<{rid?: string}>)
      .map(p => truth.get(p.rid!))
      .filter(x => x?.enter !== undefined && x.evicted !== undefined)
      .map(x => (x!.evicted! - x!.enter!) / 1000)
    const truthInWindow = heldS.filter(h => h >= DEADLINE && h <= DEADLINE + POLL + 0.05).length
    const late = pins
      .filter(p => p.verdict === 'fail' && p.evictionSeconds !== null)
      .map(p => (p.evictionSeconds! - p.bounds[1]) * 1000)

    const row = (name: string, r: Cli, j: Record<string, any>) =>
      `| ${name} | ${j.batches.length} | ${s(j.wallMs)} | ${s(j.floorMs)} | ${(j.wallMs / j.floorMs).toFixed(2)}x ` +
      `| ${s(faultMs(j))} / ${s(faultFloor(j))} | ${j.summary.passed}/${j.summary.verdicts} | ${r.code} |`
    const body = [
      '`node --import tsx scripts/bench-suite.ts`: the built-in suite (`pdchaos suite`, from the sources via tsx) ' +
        'on a fresh twin with the',
      `production-like watchdog (deadline ${DEADLINE} s, poll ${POLL} s), batched and then one scenario at a time ` +
        `in the same run;`,
      `then one scenario of ${PINS} concurrent pins. Floor = sum over batches of deadline + poll, plus the ` +
        `restart's health waits, its`,
      `settle (5 s, one decode heartbeat) and its 3 s watch. Measured ${new Date().toISOString().slice(0, 10)} on ` +
        `2 cores with other work running.`,
      '',
      '| run | batches | wall | floor | wall / floor | fault batches: wall / floor | checks passed | exit |',
      '|---|---|---|---|---|---|---|---|',
      row('built-in suite, batched', batched, jb),
      row('same scenarios, one at a time', seq, js),
      row('4 × stall-kv (GPU 0-3), batched', wideB, jwb),
      row('4 × stall-kv (GPU 0-3), one at a time', wideS, jws),
      '',
      `- 4 × stall-kv on distinct GPUs (all batchable): batched ${(jws.wallMs / jwb.wallMs).toFixed(2)}x faster ` +
        `than one at a time (goal >= 3x: ${jws.wallMs / jwb.wallMs >= 3 ? 'met' : 'NOT met'}).`,
      `- Batched vs one at a time: ${(js.wallMs / jb.wallMs).toFixed(2)}x faster overall; fault scenarios ` +
        `alone ${(faultMs(js) / faultMs(jb)).toFixed(2)}x`,
      `  (goal >= 3x: ${js.wallMs / jb.wallMs >= 3 ? 'met' : 'NOT met'}; the built-in ` +
        `suite's ${js.batches.length - 1} fault scenarios run in ${jb.batches.length - 1} batches,`,
      '  and the co-restart (process start-up, settle, watch) runs alone either way).',
      `- Wall / floor ${(jb.wallMs / jb.floorMs).toFixed(2)}x (goal <= ` +
        `1.2x: ${jb.wallMs / jb.floorMs <= 1.2 ? 'met' : 'NOT met'}). Per batch beyond the window: discovery, one`,
      '  calibration (reused until the restart), injection and verification over the host, revert, canaries and ' +
        'the queue drain',
      '  (decode releases an abandoned request only after SGLANG_REQUEST_STATE_WAIT_TIMEOUT, 4 s in the twin).',
      `- ${PINS} concurrent pins: ${pins.length} tracked, ${pins.filter(p => p.verdict === 'pass').length} ` +
        `passed, ${pins.filter(p => p.verdict === 'fail').length} failed;`,
      `  run ${s(jm.wallMs)}, exit ${many.code}; CLI peak RSS (VmHWM) ${(many.peakRssKb / 1024).toFixed(0)} MiB ` +
        `(goal < 300 MB: ${many.peakRssKb * 1024 < 300e6 ? 'met' : 'NOT met'}),`,
      '  including the tsx loader (the built CLI is lighter). Pins are sent paced, 10 every 50 ms: sent in one ' +
        'burst, a thousand',
      '  requests queue in front of the twin for up to ~1 s before entering its bootstrap queue, and every pin ' +
        'read ~1 s late.',
      `  Twin ground truth: ${truthInWindow} of ${heldS.length} pins were evicted between ${DEADLINE} s ` +
        `and ${DEADLINE + POLL + 0.05} s after entering its bootstrap queue.`,
      ...(late.length > 0
        ? [
            `  The ${late.length} failing pins were judged late by at most ${Math.max(...late).toFixed(0)} ms past ` +
              `deadline + poll + ε: ε is calibrated on an idle`,
            '  deployment and re-measured while the pins are sent, but under this burst a request can wait up to ' +
              '~0.4 s before it enters the',
            '  bootstrap queue (twin truth), which the client-side clock counts: a measurement artefact, not a ' +
              'twin defect.',
          ]
        : []),
      '',
    ].join('\n')
    process.stdout.write(writeSection('Suite', body) + '\n')
    if (batched.code !== 0 || seq.code !== 0)
      process.stderr.write(
        `suite exits: batched ${batched.code}, one at a ` +
          `time ${seq.code}\n${batched.stderr.slice(-2000)}\n${seq.stderr.slice(-2000)}\n`,
      )
  } finally {
    await simDown(join(dir, 'twin')).catch(() => undefined)
    rmSync(dir, {recursive: true, force: true})
  }
}

await main()
