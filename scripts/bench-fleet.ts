/**
 * Benchmark of `pdchaos suite --fleet` (not a test): `node --import tsx scripts/bench-fleet.ts`.
 * Three twins on loopback (the quick start's watchdog: deadline 3 s, poll 0.5 s), each with the same suite (the three
 * faults, one batch each). In the same run: each deployment's suite alone, one after the other (baseline: the slowest
 * of them), then the three as one fleet at --max-parallel 3. Reports the fleet's wall against the slowest single run
 * (goal: at most 1.2x) and pdchaos's memory with 3 deployments (the fleet process and its 3 children: the peak of their
 * summed RSS, polled from /proc every 50 ms). The CLI runs compiled, as an installed pdchaos does.
 * Writes the `## Fleet` section of BENCHMARKS.md (other sections are kept).
 */
import {spawn} from 'node:child_process'
import {mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {parse as parseYaml} from 'yaml'

import {simDown} from '../src/sim/lifecycle/down.js'
import {simUp} from '../src/sim/lifecycle/up.js'
import {compiledCli, verdict, writeSection} from './bench-common.js'

const N = 3
const DEADLINE = Number(process.env.BENCH_DEADLINE ?? 3)
const POLL = Number(process.env.BENCH_POLL ?? 0.5)

interface Cli {code: number | null; stdout: string; ms: number; peakRssKb: number}

/** RSS (kB) of a process and all its descendants, from /proc. */
function treeRssKb(root: number): number {
  const children = new Map<number, number[]>()
  for (const d of readdirSync('/proc')) {
    if (!/^\d+$/.test(d)) continue
    try {
      const stat = readFileSync(`/proc/${d}/stat`, 'utf8')
      const ppid = Number(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[1])
      children.set(ppid, [...(children.get(ppid) ?? []), Number(d)])
    } catch { /* gone */ }
  }
  let kb = 0
  const stack = [root]
  while (stack.length > 0) {
    const pid = stack.pop()!
    try { kb += Number(/VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'))?.[1] ?? 0) } catch { /* gone */ }
    stack.push(...(children.get(pid) ?? []))
  }
  return kb
}

function cli(bin: string, args: string[], timeoutMs: number): Promise<Cli> {
  const t0 = performance.now()
  const child = spawn(process.execPath, [bin, ...args], {stdio: ['ignore', 'pipe', 'ignore'], env: {...process.env, OCLIF_SKIP_NEW_VERSION_CHECK: '1'}})
  let stdout = ''
  let peak = 0
  child.stdout.on('data', (d: Buffer) => { stdout += d.toString() })
  const poll = setInterval(() => { peak = Math.max(peak, treeRssKb(child.pid!)) }, 50)
  const killer = setTimeout(() => child.kill('SIGINT'), timeoutMs)
  return new Promise((resolve) => child.on('close', (code) => {
    clearInterval(poll)
    clearTimeout(killer)
    resolve({code, stdout, ms: performance.now() - t0, peakRssKb: peak})
  }))
}

const s = (ms: number) => `${(ms / 1000).toFixed(1)} s`

async function main(): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'pdchaos-bench-fleet-'))
  const twins: string[] = []
  try {
    const bin = compiledCli('pdchaos-bench-fleet')
    const files: string[] = []
    for (let i = 0; i < N; i++) {
      const stateDir = join(dir, `twin${i}`)
      for (let attempt = 0; ; attempt++) {
        try {
          const up = await simUp({stateDir, deadlineS: DEADLINE, pollS: POLL, basePort: 41_000 + Math.floor(Math.random() * 800) * 10})
          files.push(up.deploymentFile)
          twins.push(stateDir)
          break
        } catch (error) {
          if (attempt === 7 || !/already in use/.test(String(error))) throw error
        }
      }
    }
    const suite = join(dir, 'suite.yaml')
    writeFileSync(suite, 'name: three-faults\nscenarios:\n  - {name: drop, fault: drop-dest-info, pins: 2}\n  - {name: stall, fault: stall-kv, params: {gpu: 1}, pins: 2}\n  - {name: abort, fault: abort-mid-transfer, params: {trials: 4}}\nstop: {kernelXid: false}\n')
    // Warm every twin first (a fresh deployment opens its routes and KV connections on its first request, seconds on
    // 2 cores): otherwise the first single run pays it and inflates the baseline the fleet is compared with.
    for (const file of files) {
      const router = (parseYaml(readFileSync(file, 'utf8')) as {services: {router: {url: string}}}).services.router.url
      for (let i = 0; i < 3; i++) {
        await fetch(`${router}/generate`, {method: 'POST', headers: {'content-type': 'application/json'}, body: JSON.stringify({text: 'warm up', sampling_params: {max_new_tokens: 1}}), signal: AbortSignal.timeout(30_000)})
          .then((r) => r.text()).catch(() => undefined)
      }
    }
    const alone: Cli[] = []
    for (const file of files) alone.push(await cli(bin, ['suite', suite, '-c', file, '--json'], 600_000))
    writeFileSync(join(dir, 'fleet.yaml'), `name: bench\nsuite: suite.yaml\nmaxParallel: ${N}\ndeployments:\n${files.map((f, i) => `  - {name: d${i}, deployment: ${JSON.stringify(f)}}`).join('\n')}\n`)
    const fleet = await cli(bin, ['suite', '--fleet', join(dir, 'fleet.yaml'), '--json', '--journal-dir', join(dir, 'journals')], 900_000)
    const jf = JSON.parse(fleet.stdout) as {exitCode: number; deployments: Array<{name: string; status: string; startedAt?: number; finishedAt?: number}>}
    // What made a member slow: the gateway's circuit breaker opened by a fault's failed load, waited out before the canaries.
    const breakerWaits = (name: string): number => (readFileSync(join(dir, 'journals', `${name}.json`), 'utf8').match(/router-breaker-open/g) ?? []).length
    const slowest = Math.max(...alone.map((r) => r.ms))
    const walls = jf.deployments.filter((d) => d.startedAt && d.finishedAt).map((d) => d.finishedAt! - d.startedAt!)
    const inside = (): number => walls.reduce((a, b) => a + b, 0) / Math.max(1, walls.length)
    const slowestInside = (): number => Math.max(1, ...walls)
    const ratio = fleet.ms / slowest
    const body = [
      '`node --import tsx scripts/bench-fleet.ts`: three twins on loopback (8 GPUs each, deadline ' + `${DEADLINE} s, poll ${POLL} s), each with the same suite`,
      '(drop-dest-info, stall-kv, abort-mid-transfer: three batches). In the same run: each deployment\'s `pdchaos suite` alone, one after',
      'the other (baseline: the slowest), then the three as one `suite --fleet` at `--max-parallel 3`. Memory: the peak of the summed RSS',
      'of the fleet process and its children (one `pdchaos suite` per deployment), polled every 50 ms. The CLI runs compiled.',
      `Measured ${new Date().toISOString().slice(0, 10)} on ${process.env.BENCH_CORES ?? '2'} cores; the twins (about 11 processes each) share them with pdchaos.`,
      '',
      '| run | wall | exit | peak RSS of pdchaos |',
      '|---|---|---|---|',
      ...alone.map((r, i) => `| d${i} alone | ${s(r.ms)} | ${r.code} | ${(r.peakRssKb / 1024).toFixed(0)} MiB |`),
      `| fleet of ${N} (max-parallel ${N}) | ${s(fleet.ms)} | ${fleet.code} (${jf.deployments.map((d) => `${d.name} ${d.status}`).join(', ')}) | ${(fleet.peakRssKb / 1024).toFixed(0)} MiB |`,
      ...jf.deployments.map((d) => `| - ${d.name} inside the fleet | ${d.startedAt && d.finishedAt ? s(d.finishedAt - d.startedAt) : '?'} | breaker waits: ${breakerWaits(d.name)} | |`),
      '',
      `- Fleet wall / slowest single run: **${ratio.toFixed(2)}x** (goal at most 1.2x: ${verdict(ratio <= 1.2)}); / the three run one after the other: ${(fleet.ms / alone.reduce((a, r) => a + r.ms, 0)).toFixed(2)}x.`,
      '- Each twin served three requests before any run (warm), so no run pays a cold start the others do not.',
      `- Where the difference goes: the members' own wall inside the fleet against alone, ${(inside() / (alone.reduce((a, r) => a + r.ms, 0) / alone.length)).toFixed(2)}x on average (three twins of`,
      '  11 processes each and three suites share these 2 cores; in a real fleet each deployment has its own GPU hosts and',
      `  only pdchaos shares the machine), and the fleet over its slowest member, ${(fleet.ms / slowestInside()).toFixed(2)}x (pdchaos's own cost: its start,`,
      '  reading every file first, starting the children, and the combined report).',
      `- pdchaos's memory with ${N} deployments: ${(fleet.peakRssKb / 1024).toFixed(0)} MiB at peak (the fleet process and ${N} suite processes).`,
    ].join('\n')
    process.stdout.write(writeSection('Fleet', body))
  } finally {
    for (const t of twins) await simDown(t).catch(() => undefined)
    rmSync(dir, {recursive: true, force: true})
  }
}

await main()
