/**
 * Inject and revert latency of every fault over SSH (issue 4; a benchmark, not a test):
 * `node --import tsx scripts/bench-faults.ts [--runs 5]`.
 *
 * One namespace test host (sshd and the twin inside, deadline 2 s, poll 0.5 s). For each fault, N runs of
 * `pdchaos inject … -c FILE --journal J --ttl 120` (compiled CLI, not --json so that its progress lines reach stderr,
 * each stamped on arrival). Per run:
 *  - inject to verified in place: from the lease's creation (the host's clock in the first lease command, read back as
 *    leases[0].expiresAt − TTL) to the `in place:` line, which follows the verification probes; split into arming the
 *    lease (to `injecting …`), the injection commands (to leases[0].injectedAt = the timeline's fault-injected) and
 *    the verification probes.
 *  - revert to verified clean: from the `reverting lease` line to the `verified clean` line; split into the revert
 *    (to leases[0].revertedAt = fault-reverted) and the verification probes.
 * The namespace shares the machine's clock, so host and local times compare. Writes `## Faults` of BENCHMARKS.md.
 */
import {mkdtempSync, readFileSync, rmSync} from 'node:fs'
import {cpus, tmpdir} from 'node:os'
import {join} from 'node:path'

import {createTestHost, type TestHost} from '../test/harness/test-host.js'
import {compiledCli, median, quantile, runNode, verdict, writeSection} from './bench-common.js'

const runsArg = process.argv.indexOf('--runs')
const RUNS = runsArg > 0 ? Number(process.argv[runsArg + 1]) : 5
const TTL_S = 120
const DEADLINE = 2
const POLL = 0.5

const FAULTS: Array<{name: string; args: string[]}> = [
  {name: 'drop-dest-info', args: ['drop-dest-info', '--pins', '1']},
  {name: 'stall-kv (packet-filter)', args: ['stall-kv', '--gpu', '1', '--mechanism', 'packet-filter', '--pins', '1']},
  {
    name: 'stall-kv (sigstop, prefill)',
    args: ['stall-kv', '--gpu', '1', '--mechanism', 'sigstop', '--side', 'prefill', '--pins', '1'],
  },
  {name: 'abort-mid-transfer', args: ['abort-mid-transfer', '--trials', '2']},
]

interface Sample {
  inject: number
  arm: number
  commands: number
  verifyIn: number
  revert: number
  revertCmd: number
  verifyClean: number
  clean: boolean
}

async function one(cli: string, host: TestHost, args: string[], dir: string, i: number): Promise<Sample> {
  const journal = join(dir, `journal-${args[0]}-${i}-${Date.now()}.json`)
  const r = await runNode(
    [cli, 'inject', ...args, '-c', host.deploymentFile, '--journal', journal, '--ttl', String(TTL_S)],
    {timeoutMs: 180_000},
  )
  const at = (re: RegExp): number => {
    const l = r.lines.find(x => re.test(x.line))
    if (!l)
      throw new Error(
        `inject ${args.join(' ')}: no progress line ${re} ` +
          `(exit ${r.code}): ${r.stderr.trim().split('\n').slice(-4).join(' | ')}`,
      )
    return l.t
  }
  const j = JSON.parse(readFileSync(journal, 'utf8')) as {
    leases: Array<{
      injectedAt: number
      revertedAt: number
      expiresAt: number
      verifiedInjected: boolean
      verifiedClean: boolean
    }>
    timeline: {observations: Array<{kind: string; t: number}>}
  }
  const lease = j.leases[0]!
  const obs = j.timeline?.observations ?? []
  const injectedAt = obs.find(o => o.kind === 'fault-injected')?.t ?? lease.injectedAt
  const revertedAt = obs.find(o => o.kind === 'fault-reverted')?.t ?? lease.revertedAt
  const created = lease.expiresAt - TTL_S * 1000
  const injecting = at(/^injecting /)
  const inPlace = at(/^in place: /)
  const reverting = at(/^reverting lease /)
  const clean = at(/^verified clean/)
  if (!lease.verifiedInjected) throw new Error(`inject ${args.join(' ')}: not verified in place`)
  return {
    inject: inPlace - created,
    arm: injecting - created,
    commands: injectedAt - injecting,
    verifyIn: inPlace - injectedAt,
    revert: clean - reverting,
    revertCmd: revertedAt - reverting,
    verifyClean: clean - revertedAt,
    clean: lease.verifiedClean,
  }
}

async function main(): Promise<void> {
  process.stderr.write('compiling src/ into node_modules/.cache/pdchaos-bench-faults …\n')
  const cli = compiledCli('pdchaos-bench-faults')
  const dir = mkdtempSync(join(tmpdir(), 'pdchaos-test-bench-faults-'))
  let host: TestHost | undefined
  const results: Array<{name: string; samples: Sample[]}> = []
  try {
    host = await createTestHost({twin: {deadlineSeconds: DEADLINE, pollSeconds: POLL}})
    for (const f of FAULTS) {
      const samples: Sample[] = []
      for (let i = 0; i < RUNS; i++) {
        const s = await one(cli, host, f.args, dir, i)
        samples.push(s)
        process.stderr.write(
          `${f.name} #${i + 1}: in place after ${s.inject} ms (arm ${s.arm}, commands ${s.commands}, ` +
            `verify ${s.verifyIn}); clean after ${s.revert} ms (revert ${s.revertCmd}, verify ${s.verifyClean})\n`,
        )
      }
      results.push({name: f.name, samples})
    }
  } finally {
    await host?.destroy()
    rmSync(dir, {recursive: true, force: true})
  }

  const ms = (x: number): string => `${Math.round(x)} ms`
  const col = (xs: number[]): string => `${ms(median(xs))} / ${ms(quantile(xs, 0.99))}`
  const rows = results.map(({name, samples: s}) => {
    const inj = s.map(x => x.inject)
    const rev = s.map(x => x.revert)
    return (
      `| ${name} | ${col(inj)} | ${ms(median(s.map(x => x.arm)))} + ${ms(median(s.map(x => x.commands)))} ` +
      `+ ${ms(median(s.map(x => x.verifyIn)))} | ${col(rev)} | ${ms(median(s.map(x => x.revertCmd)))} ` +
      `+ ${ms(median(s.map(x => x.verifyClean)))} | ${s.filter(x => x.clean).length}/${s.length} ` +
      `| ${verdict(Math.max(...inj) < 1000 && Math.max(...rev) < 1000)} |`
    )
  })
  const all = results.flatMap(r => r.samples)
  const worstIn = Math.max(...all.map(x => x.inject))
  const worstRev = Math.max(...all.map(x => x.revert))
  const body = [
    `\`node --import tsx scripts/bench-faults.ts\`: ${RUNS} runs of \`pdchaos inject\` per fault, over SSH (ssh2) ` +
      `into the namespace test host`,
    `(real sshd; the twin inside with deadline ${DEADLINE} s, poll ${POLL} s, running from the sources via tsx), ` +
      `pdchaos compiled.`,
    '**In place**: from the lease being created on the host (its host-clock stamp, = `leases[0].expiresAt` − ' +
      '`--ttl`) to the fault',
    "verified in place by probes of the host's state (the `in place:` progress line); split into arming the lease " +
      '(lease files +',
    'detached reverter, 3 SSH commands), the injection commands (to `leases[0].injectedAt` = the `fault-injected` ' +
      'observation) and',
    'the verification probes. **Clean**: from `reverting lease` to `verified clean`; split into the revert through ' +
      'the lease',
    '(to `revertedAt` = `fault-reverted`) and the verification probes. Times are median / p99 (p99 of 5 = the ' +
      'worst run).',
    `Measured ${new Date().toISOString().slice(0, 10)} on ${cpus().length} cores with other work running.`,
    '',
    '| fault | inject → verified in place | = arm + inject + verify (medians) | revert → verified clean | = revert ' +
      '+ verify (medians) | verified clean | goal: each < 1 s |',
    '|---|---|---|---|---|---|---|',
    ...rows,
    '',
    `- Worst single run: in place after ${ms(worstIn)}, clean after ${ms(worstRev)} (goal < 1000 ` +
      `ms: ${verdict(worstIn < 1000 && worstRev < 1000)}).`,
    '- The goal is judged on every run, not only the median.',
  ].join('\n')
  writeSection('Faults', body)
  process.stdout.write(body + '\n')
}

await main()
