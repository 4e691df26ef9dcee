import {resolve} from 'node:path'
import {writeFileSync, mkdirSync} from 'node:fs'
import {dirname} from 'node:path'

import {Args, Flags} from '@oclif/core'

import {BaseCommand} from '../cli/base-command.js'
import {acquireHostLock} from '../faults/lease/host-lock.js'
import {assertMayDisturb} from '../deployment/protection.js'
import {ExitCode} from '../exit-codes.js'
import {targetFlags} from '../cli/flags.js'
import {renderHtml} from '../report/html.js'
import {writeJournal} from '../report/journal.js'
import {renderJUnit} from '../report/junit.js'
import {pushRun} from '../report/push.js'
import {failedChecks, runCounts, runIdOf, type SuiteRun} from '../model/run.js'
import {runSuite, type SuiteOutcome} from '../suite/runner.js'
import {defaultSuite, GateSchema, loadSuite} from '../suite/suite-file.js'
import {renderSuite} from '../suite/text.js'
import {resolveTarget} from '../cli/target.js'

export default class Suite extends BaseCommand<typeof Suite> {
  static override summary = 'Run a suite of fault scenarios and co-restarts, in conflict-free concurrent batches: the nightly run and the release gate.'
  static override description = [
    'Without FILE the built-in suite runs: stall-kv on GPUs 1-3 and abort-mid-transfer on GPU 0 together, then drop-dest-info on each prefill rank together, then a co-restart.',
    'The batch plan is printed and checked for conflicts before any injection. Stop conditions (router health, collateral loss, a new Xid line in the kernel log)',
    'and SIGINT stop the run, revert everything and exit 3; a stopped run is never resumed.',
    'Exit 0 all checks passed (or the gate passed), 1 a check failed (or the gate failed), 2 bad input, 3 stopped, 4 cleanup unverified, 5 unreachable.',
    'With --sim and no twin running, the twin is started with a short watchdog (deadline 3 s, poll 0.5 s) so the suite takes well under a minute.',
  ].join(' ')
  static override examples = [
    '<%= config.bin %> suite --sim',
    '<%= config.bin %> suite nightly.yaml -c pdchaos.yaml --journal run.json --junit junit.xml --html report.html',
    '<%= config.bin %> suite release.yaml -c pdchaos.yaml --gate --push http://127.0.0.1:9091',
  ]
  static override args = {
    file: Args.string({description: 'Suite file (YAML); `pdchaos schema suite` prints its shape. Default: the built-in suite.'}),
  }
  static override flags = {
    ...targetFlags,
    gate: Flags.boolean({summary: 'Make the exit code the release verdict (0 pass, 1 fail); thresholds from the file\'s gate section or: no failed check, no fault left behind.'}),
    journal: Flags.string({summary: 'Write the run journal (JSON: every pin, lease, verdict and timeline) to this file.'}),
    junit: Flags.string({summary: 'Write JUnit XML (one testcase per check and per pin) to this file.'}),
    html: Flags.string({summary: 'Write the single-file HTML report (a timeline per scenario) to this file.'}),
    push: Flags.string({summary: 'Push the run\'s metrics to this Prometheus Pushgateway URL.'}),
    'one-at-a-time': Flags.boolean({summary: 'Run every scenario in a batch of its own (no concurrency), e.g. to measure what batching saves.'}),
    'run-id': Flags.string({summary: 'Name of this run (Pushgateway grouping, reports). Default: derived from the start time.'}),
    'sim-deadline': Flags.string({summary: 'With --sim, when the suite starts the twin itself: its watchdog deadline in seconds.', default: '3'}),
    'sim-poll': Flags.string({summary: 'With --sim, when the suite starts the twin itself: its watchdog poll interval in seconds.', default: '0.5'}),
    'allow-production': Flags.boolean({summary: 'Allow running against a deployment labelled environment: production.'}),
    'accept-new-host-key': Flags.boolean({summary: 'Trust and record the host key of a host not yet in known_hosts.'}),
  }

  async run(): Promise<Record<string, unknown>> {
    const f = this.flags
    const suite = this.args.file ? await loadSuite(resolve(this.args.file)) : defaultSuite()
    const gateSpec = suite.gate ?? (f.gate ? GateSchema.parse({}) : undefined)
    const live = Boolean(process.stderr.isTTY) && !this.jsonEnabled()
    const spin = live ? this.spinner('starting') : undefined
    let phase = 'starting'
    let deadlineAt: number | undefined
    let last = ''
    const paint = () => {
      if (!spin) return
      const left = deadlineAt === undefined ? '' : ` (${Math.max(0, (deadlineAt - Date.now()) / 1000).toFixed(1)}s left)`
      spin.text = `${phase}${left}${last ? ` — ${last}` : ''}`
    }
    const ticker = spin ? setInterval(paint, 200) : undefined
    const say = (line: string) => {
      if (spin) { last = line; paint() } else this.progress(line)
    }
    const stopController = new AbortController()
    const onSigint = () => stopController.abort('interrupted (SIGINT)')
    process.on('SIGINT', onSigint)

    let twinNote: string | undefined
    try {
      // A twin the suite starts itself gets a short watchdog, so the built-in suite takes well under a minute.
      const twin = {deadlineS: Number(f['sim-deadline']), pollS: Number(f['sim-poll'])}
      const target = await resolveTarget(f, {twin, onProgress: say})
      if (target.startedTwin) {
        twinNote = `started the twin in ${target.startedTwin} with a short watchdog (deadline ${twin.deadlineS}s, poll ${twin.pollS}s) so the suite is quick; ` +
          `it keeps running: \`pdchaos sim down${f['state-dir'] ? ` --state-dir ${target.startedTwin}` : ''}\` stops it`
      }
      let outcome: SuiteOutcome
      const t0 = Date.now()
      try {
        assertMayDisturb(target.deployment, f['allow-production'], 'run a suite against')
        const w = target.deployment.watchdog
        const lock = await acquireHostLock(target.host, target.deployment.stateDir, {command: `suite ${suite.name}`, ttlMs: (suite.scenarios.length * ((w.deadlineSeconds + w.pollSeconds) * 3 + 300) + 600) * 1000})
        try {
          outcome = await runSuite(target.deployment, target.host, suite, {
            gate: gateSpec, say, signal: stopController.signal, runId: f['run-id'], oneAtATime: f['one-at-a-time'],
            onPlan: (lines) => {
              // The plan goes out before any injection, even on a TTY.
              if (spin) spin.clear()
              for (const l of ['plan (checked: no two scenarios in a batch interfere):', ...lines.map((x) => `  ${x}`)]) this.progress(l)
            },
            onPhase: (p, at) => { phase = p; deadlineAt = at; paint() },
          })
        } finally {
          await lock.release().catch(() => {})
        }
      } finally {
        await target.host.close()
      }
      const wallMs = Date.now() - t0
      const run = outcome.run
      const notes = [...outcome.notes, ...(twinNote ? [twinNote] : [])]
      const pushed = await this.writeOutputs(run, {...outcome, wallMs}, notes)
      if (ticker) clearInterval(ticker)
      spin?.stop()
      if (!this.jsonEnabled()) this.log(renderSuite({...outcome, wallMs, twin: twinNote}))
      const c = runCounts(run)
      if (run.stopped) process.exitCode = ExitCode.stopped
      else if (run.gate) process.exitCode = run.gate.passed ? ExitCode.ok : ExitCode.checkFailed
      else if (c.faultsLeftBehind > 0) process.exitCode = ExitCode.cleanupUnverified
      else if (c.failed > 0 || c.errored > 0) process.exitCode = ExitCode.checkFailed
      return {
        ...summaryOf(run), plan: outcome.plan, batches: outcome.batches, floorMs: outcome.floorMs, wallMs, notes, ...(pushed ? {pushed} : {}),
        scenarios: run.scenarios.map(({timeline: _t, ...s}) => s),
      }
    } finally {
      if (ticker) clearInterval(ticker)
      spin?.stop()
      process.removeListener('SIGINT', onSigint)
    }
  }

  private async writeOutputs(run: SuiteRun, o: SuiteOutcome & {wallMs: number}, notes: string[]): Promise<unknown> {
    const f = this.flags
    const write = (file: string, text: string) => {
      mkdirSync(dirname(resolve(file)), {recursive: true})
      writeFileSync(file, text)
    }
    if (f.journal) writeJournal(f.journal, {command: 'suite', ...run, runId: runIdOf(run), plan: o.plan, batches: o.batches, floorMs: o.floorMs, wallMs: o.wallMs, notes})
    if (f.junit) write(f.junit, renderJUnit(run))
    if (f.html) write(f.html, renderHtml(run))
    if (f.push) {
      const r = await pushRun(f.push, run)
      this.progress(`pushed ${r.series} series to ${r.url}`)
      return r
    }
    return undefined
  }
}

function summaryOf(run: SuiteRun) {
  const c = runCounts(run)
  return {
    name: run.name, runId: runIdOf(run), deployment: run.deployment, startedAt: run.startedAt, finishedAt: run.finishedAt,
    summary: c, gate: run.gate, stopped: run.stopped,
    failedChecks: failedChecks(run).map((x) => ({scenario: x.scenario, check: x.verdict.check, subject: x.verdict.subject, summary: x.verdict.summary})),
  }
}
