import {SuiteCommand} from '../cli/suite-command.js'
import {VLLM_BUILTIN_SUITE} from '../engines/vllm/experiments/builtin-suite.js'
import {badInput} from '../errors.js'

export default class Suite extends SuiteCommand {
  static override summary =
    'Run a suite of fault scenarios and co-restarts, in conflict-free concurrent batches: the nightly run and the ' +
    'release gate.'
  static override description = [
    'Without FILE the built-in suite runs: stall-kv on GPUs 1-3 and abort-mid-transfer on GPU 0 together, then ' +
      'drop-dest-info on each prefill rank together, then prefill restarted alone (SGLang #34289), then a co-restart.',
    'The batch plan is printed and checked for conflicts before any injection. Stop conditions (router health, ' +
      'collateral loss, a new Xid line in the kernel log)',
    'and SIGINT stop the run, revert everything and exit 3; a stopped run is never resumed.',
    'Exit 0 all checks passed (or the gate passed), 1 a check failed (or the gate failed), 2 bad input, 3 stopped, ' +
      '4 cleanup unverified, 5 unreachable.',
    'With --sim and no twin running, the twin is started with a short watchdog (deadline 3 s, poll 0.5 s) and a ' +
      'gateway circuit breaker that half-opens after 5 s (60 by default) so the suite takes well under a minute.',
    'A deployment file with engine: vllm, or --sim --engine vllm (the vLLM twin, started with a 4 s KV lease when ' +
      `none runs), runs the built-in vLLM suite instead: ${VLLM_BUILTIN_SUITE.entries.map(e => e.fault).join(', ')} ` +
      'one at a time, then the co-restart prefill, decode, proxy;',
    'or FILE, a vLLM suite file: engine: vllm, name, scenarios (each {fault, pins, gpu, side, mechanism, ttl} as ' +
      'inject takes them), coRestart (default true).',
    'With --fleet each deployment of the fleet file runs as its own suite run; the exit code is the most urgent of ' +
      'theirs: 4 > 3 > 1 > 5 > 2 > 0.',
  ].join(' ')
  static override examples = [
    '<%= config.bin %> suite --sim',
    '<%= config.bin %> suite --sim --engine vllm --journal run.json --junit junit.xml',
    '<%= config.bin %> suite nightly.yaml -c pdchaos.yaml --journal run.json --junit junit.xml --html report.html',
    '<%= config.bin %> suite release.yaml -c pdchaos.yaml --gate --push http://127.0.0.1:9091',
    '<%= config.bin %> suite --fleet fleet.yaml --max-parallel 4 --journal-dir /var/lib/pdchaos/nightly --junit ' +
      'junit.xml --html fleet.html',
  ]

  async run(): Promise<Record<string, unknown>> {
    const f = this.flags
    // An empty run id would name no run: the Pushgateway grouping and the reports need one.
    if (f['run-id'] !== undefined && f['run-id'].trim() === '') {
      throw badInput(
        '--run-id is empty',
        'give the run a name, e.g. --run-id nightly-2026-12-04, or leave the flag out for one from the start time',
      )
    }
    // SIGINT (Ctrl-C) or SIGTERM (a scheduler's deadline) stops the run in any phase, from reading the suite file on;
    // a run that started has its journal still written (exit 3).
    return this.withStopSignal(({signal}) =>
      f.fleet === undefined ? this.runOne(signal) : this.runFleet(f.fleet, signal),
    )
  }
}
