/**
 * Wall time of the CLI (issue 3; a benchmark, not a test): `node --import tsx scripts/bench-cli.ts [--runs 10]`.
 * `pdchaos --help`, `pdchaos status --sim --json` against a running twin on loopback, and `pdchaos status -c` over SSH
 * into the namespace test host (sshd and the twin inside), each the median of N runs after one warm-up, with
 * `node -e 0` measured in the same run as the baseline (this 2-core machine is noisy). pdchaos runs compiled, as an
 * installed copy runs it (tsc and the bundle into node_modules/.cache/pdchaos-bench-cli, never dist/). Writes `## CLI`
 * of BENCHMARKS.md.
 */
import {mkdtempSync, renameSync, rmSync} from 'node:fs'
import {cpus, tmpdir} from 'node:os'
import {join} from 'node:path'

import {createTestHost, type TestHost} from '../test/harness/test-host.js'
import {
  compiledCli,
  manifestOf,
  median,
  quantile,
  repo,
  runNode,
  type Run,
  verdict,
  writeSection,
} from './bench-common.js'

const runsArg = process.argv.indexOf('--runs')
const RUNS = runsArg > 0 ? Number(process.argv[runsArg + 1]) : 10
const TIMEOUT_MS = 60_000

interface Timed {
  runs: number[]
  median: number
  p99: number
}

async function time(label: string, args: string[], ok: (r: Run) => boolean = r => r.code === 0): Promise<Timed> {
  const warm = await runNode(args, {timeoutMs: TIMEOUT_MS})
  if (!ok(warm))
    throw new Error(
      `${label}: exit ${warm.code} ${warm.signal ?? ''}: ${warm.stderr.trim().split('\n').slice(-3).join(' | ')}`,
    )
  const runs: number[] = []
  for (let i = 0; i < RUNS; i++) {
    const r = await runNode(args, {timeoutMs: TIMEOUT_MS})
    if (!ok(r))
      throw new Error(`${label}: run ${i + 1} exit ${r.code}: ${r.stderr.trim().split('\n').slice(-3).join(' | ')}`)
    runs.push(r.ms)
  }
  const t = {runs, median: median(runs), p99: quantile(runs, 0.99)}
  process.stderr.write(`${label}: median ${t.median.toFixed(0)} ms (${runs.map(m => m.toFixed(0)).join(', ')})\n`)
  return t
}

/** `sim up` on a random base port (retrying when taken: other work on this machine uses ports too). */
async function simUp(cli: string, stateDir: string): Promise<void> {
  for (let attempt = 0; ; attempt++) {
    const base = 20_000 + Math.floor(Math.random() * 400) * 100
    const r = await runNode([cli, 'sim', 'up', '--state-dir', stateDir, '--base-port', String(base), '--json'], {
      timeoutMs: 120_000,
    })
    if (r.code === 0) return
    if (attempt >= 5 || !/in use/.test(r.stdout + r.stderr))
      throw new Error(`sim up exited ${r.code}: ${(r.stdout + r.stderr).trim().slice(-400)}`)
  }
}

async function main(): Promise<void> {
  process.stderr.write('compiling src/ into node_modules/.cache/pdchaos-bench-cli …\n')
  const cli = compiledCli()
  const dev = join(repo, 'bin', 'dev.js')

  const base = await time('node -e 0', ['-e', '0'])
  const help = await time('pdchaos --help', [cli, '--help'])
  // As from a build without oclif.manifest.json: oclif then imports every command to list them.
  renameSync(manifestOf(cli), manifestOf(cli) + '.off')
  let helpNoManifest: Timed
  try {
    helpNoManifest = await time('pdchaos --help (no manifest)', [cli, '--help'])
  } finally {
    renameSync(manifestOf(cli) + '.off', manifestOf(cli))
  }
  const devHelp = await time('bin/dev.js --help (tsx)', [dev, '--help'])

  const dir = mkdtempSync(join(tmpdir(), 'pdchaos-test-bench-cli-'))
  let simStatus: Timed
  try {
    await simUp(cli, dir)
    simStatus = await time('status --sim --json', [cli, 'status', '--sim', '--state-dir', dir, '--json'])
  } finally {
    await runNode([cli, 'sim', 'down', '--state-dir', dir, '--json'], {timeoutMs: 60_000})
    rmSync(dir, {recursive: true, force: true})
  }

  let host: TestHost | undefined
  let sshStatus: Timed
  try {
    host = await createTestHost({twin: true})
    sshStatus = await time('status -c (ssh)', [cli, 'status', '-c', host.deploymentFile, '--json'])
  } finally {
    await host?.destroy()
  }

  const ms = (x: number): string => `${x.toFixed(0)} ms`
  const row = (name: string, t: Timed, goal: string): string =>
    `| ${name} | ${ms(t.median)} | ${ms(t.p99)} | ${ms(Math.min(...t.runs))}–${ms(Math.max(...t.runs))} ` +
    `| ${(t.median / base.median).toFixed(1)}x | ${goal} |`
  const body = [
    `\`node --import tsx scripts/bench-cli.ts\`: wall time of one CLI process from spawn to exit, median and p99 ` +
      `of ${RUNS} runs after one`,
    'warm-up each, run sequentially. pdchaos runs compiled as an installed copy does (tsc and scripts/bundle.mjs ' +
      'into node_modules/.cache/pdchaos-bench-cli',
    'with a copy of bin/run.js and package.json, and its oclif.manifest.json as `npm run build` writes it; ' +
      'dependencies from the repo).',
    'Baseline: `node -e 0` in the same run.',
    '`status --sim` targets a twin already running on loopback; `status -c` goes over SSH (ssh2, pure-JS handshake ' +
      'per process)',
    `into the namespace test host, whose twin runs from the TypeScript sources via tsx. ` +
      `Measured ${new Date().toISOString().slice(0, 10)} on ${cpus().length} cores with other work running.`,
    '',
    '| command | median | p99 | range | vs baseline (median) | goal |',
    '|---|---|---|---|---|---|',
    row('`node -e 0` (baseline)', base, '-'),
    row('`pdchaos --help`', help, `< 0.5 s: ${verdict(help.median < 500)}`),
    row('`pdchaos --help` without oclif.manifest.json (for comparison)', helpNoManifest, '-'),
    row('`pdchaos status --sim --json` (running twin)', simStatus, '-'),
    row('`pdchaos status -c FILE --json` (over SSH)', sshStatus, '-'),
    row('`bin/dev.js --help` (sources via tsx, for comparison)', devHelp, '-'),
    '',
    `- \`pdchaos --help\` costs ${ms(help.median - base.median)} over bare Node start-up (median); the goal is ` +
      `judged on the median.`,
  ].join('\n')
  writeSection('CLI', body)
  process.stdout.write(body + '\n')
}

await main()
