import {Flags} from '@oclif/core'

import {BaseCommand} from '../../cli/base-command.js'
import {
  lagFlags,
  lagUpOptions,
  railFlags,
  railUpOptions,
  routerFlags,
  routerUpOptions,
  seconds,
  stateDirFlag,
} from '../../cli/sim-flags.js'
import {layoutFlags, layoutUpOptions} from '../../cli/layout-flags.js'
import {simUp} from '../../cli/twin.js'
import {vllmSimUp, vllmUpFlags} from '../../cli/vllm-twin.js'
import type {SimUpResult} from '../../sim/lifecycle/index.js'
import {BUG_NAMES} from '../../sim/sim-config.js'

/** "TP 4", or with a layout "TP 2 DP 2 (attention) PP 1, 4 schedulers". */
function layoutText(c: SimUpResult['config'], role: 'prefill' | 'decode'): string {
  const l = c.layout?.[role]
  const n = role === 'prefill' ? c.prefillTp : c.decodeTp
  return l
    ? `TP ${l.tp} DP ${l.dp}${l.dpAttention ? ' (attention)' : ''} ` +
        `PP ${l.pp}${l.ep > 1 ? ` EP ${l.ep}` : ''}, ${n} schedulers`
    : `TP ${n}`
}

export default class SimUp extends BaseCommand<typeof SimUp> {
  static override summary = 'Start the twin: an SGLang-like PD deployment (prefill, decode, router) on this machine.'
  static override description =
    'Starts the services detached (they outlive this command), waits until they are healthy, prints the endpoints ' +
    'and writes a deployment file for pdchaos into the state dir.'

  static override examples = [
    '<%= config.bin %> <%= command.id %>',
    '<%= config.bin %> <%= command.id %> --deadline 30 --poll 1 --bug late-evict --state-dir /tmp/twin --json',
  ]

  static override flags = {
    'state-dir': stateDirFlag,
    host: Flags.string({summary: 'Address every twin socket binds to.', default: '127.0.0.1'}),
    only: Flags.string({
      summary:
        'Run only these services on this node (comma-separated: prefill, decode, router); the others run on other ' +
        'nodes at --prefill-host, --decode-host, --router-host.',
      delimiter: ',',
      multiple: true,
    }),
    'prefill-host': Flags.string({
      summary:
        'With --only: the address of the node prefill runs on (same ports); several, comma-separated, for one ' +
        "prefill instance per node. On the router's node, the other prefill instances it routes to.",
    }),
    'decode-host': Flags.string({
      summary:
        'With --only: the address of the node decode runs on (same ports); several, comma-separated, for one ' +
        "decode instance per node. On the router's node, the other decode instances it routes to.",
    }),
    'router-host': Flags.string({summary: 'With --only: the address of the node the router runs on (same ports).'}),
    nnodes: Flags.integer({
      summary:
        "SGLang's --nnodes: the --only server (prefill or decode) is one instance over N nodes; its " +
        '--prefill-tp/--decode-tp is the total, split evenly.',
      default: 1,
    }),
    'node-rank': Flags.integer({
      summary:
        "SGLang's --node-rank: this node's rank (0 runs the API, the scheduler and the bootstrap server; the " +
        'others only ranks).',
      default: 0,
    }),
    'dist-init-addr': Flags.string({
      summary: "SGLang's --dist-init-addr IP:PORT: node rank 0's address, where the other nodes join it.",
    }),
    gpus: Flags.integer({summary: 'GPUs of the simulated host.', default: 8}),
    'prefill-tp': Flags.integer({summary: 'Prefill TP size (ranks on GPUs 0..N-1).', default: 4}),
    'decode-tp': Flags.integer({summary: 'Decode TP size (ranks on the GPUs after prefill).', default: 4}),
    backend: Flags.option({
      options: ['nixl', 'mooncake'] as const,
      summary: 'KV transfer backend: nixl (no prefill bootstrap timeout) or mooncake.',
      default: 'nixl',
    })(),
    watchdog: Flags.option({
      options: ['all', 'inflight', 'off'] as const,
      summary: 'Scope of the prefill watchdog under test.',
      default: 'all',
    })(),
    deadline: Flags.string({summary: 'Watchdog deadline in seconds.', default: '60'}),
    poll: Flags.string({summary: 'Watchdog poll interval in seconds.', default: '1'}),
    'watchdog-late-ms': Flags.integer({
      min: 0,
      max: 3_600_000,
      summary:
        'Not SGLang: the watchdog evicts this many ms past its deadline (a watchdog drifting late; docs/twin.md).',
    }),
    bug: Flags.option({
      options: BUG_NAMES,
      multiple: true,
      summary:
        'Switch on a known defect, or a surface pdchaos must cope with (no-watchdog-counter, no-disagg-loads, ' +
        'no-loads); repeatable.',
    })(),
    'kv-pool-tokens': Flags.integer({
      summary:
        "KV pool per instance in tokens (SGLang's max_total_num_tokens): each request's share of sglang:token_usage.",
      default: 1_000_000,
      min: 1024,
    }),
    'base-port': Flags.integer({
      summary: 'Router port; prefill +100, decode +200, bootstrap +500, router metrics +900.',
      default: 30_000,
    }),
    'waiting-timeout': Flags.string({summary: 'SGLANG_DISAGGREGATION_WAITING_TIMEOUT in seconds.', default: '300'}),
    'decode-waiting-timeout': Flags.string({
      summary:
        "SGLANG_DISAGGREGATION_WAITING_TIMEOUT in decode's environment only, in seconds (default: --waiting-timeout).",
    }),
    'bootstrap-timeout': Flags.string({
      summary:
        "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT in seconds (prefill's sender: Mooncake, and NIXL with " +
        '--sglang-version after 0.5.15).',
      default: '300',
    }),
    'sglang-version': Flags.string({
      summary:
        'The SGLang version the twin states (server_info, /v1/loads). After 0.5.15 its NIXL sender has the ' +
        'bootstrap timeout (PR #34692).',
      default: '0.5.15',
    }),
    'heartbeat-interval': Flags.string({
      summary: 'SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL in seconds (>= 2).',
      default: '5',
    }),
    'heartbeat-max-failure': Flags.integer({summary: 'SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE.', default: 2}),
    heartbeat: Flags.option({
      options: ['on', 'off'] as const,
      summary: "Not SGLang: 'off' stops decode's heartbeat toward prefill (its environment still states the interval).",
      default: 'on',
    })(),
    'router-health-interval': Flags.string({
      summary: "The router's worker health-check interval in seconds.",
      default: '60',
    }),
    wait: Flags.string({summary: 'Deadline in seconds for the twin to become healthy.', default: '30'}),
    ...railFlags,
    ...lagFlags,
    ...layoutFlags,
    ...routerFlags,
    ...vllmUpFlags,
  }

  async run(): Promise<Omit<SimUpResult, 'config'>> {
    const f = this.flags
    if (f.engine === 'vllm') return (await vllmSimUp(f, l => this.log(l))) as unknown as Omit<SimUpResult, 'config'>
    const spinner = this.spinner('Starting the twin')
    let result: SimUpResult
    try {
      result = await simUp({
        stateDir: f['state-dir'],
        host: f.host,
        ...(f.only ? {only: f.only} : {}),
        peers: {prefill: f['prefill-host'], decode: f['decode-host'], router: f['router-host']},
        nnodes: f.nnodes,
        nodeRank: f['node-rank'],
        ...(f['dist-init-addr'] === undefined ? {} : {distInitAddr: f['dist-init-addr']}),
        gpus: f.gpus,
        prefillTp: f['prefill-tp'],
        decodeTp: f['decode-tp'],
        backend: f.backend,
        watchdog: f.watchdog,
        deadlineS: seconds('--deadline', f.deadline),
        pollS: seconds('--poll', f.poll),
        ...(f['watchdog-late-ms'] === undefined ? {} : {watchdogLateMs: f['watchdog-late-ms']}),
        bugs: f.bug ?? [],
        kvPoolTokens: f['kv-pool-tokens'],
        basePort: f['base-port'],
        waitingTimeoutS: seconds('--waiting-timeout', f['waiting-timeout']),
        decodeWaitingTimeoutS: seconds('--decode-waiting-timeout', f['decode-waiting-timeout']),
        bootstrapTimeoutS: seconds('--bootstrap-timeout', f['bootstrap-timeout']),
        version: f['sglang-version'],
        heartbeatIntervalS: seconds('--heartbeat-interval', f['heartbeat-interval']),
        heartbeatMaxFailure: f['heartbeat-max-failure'],
        heartbeat: f.heartbeat,
        routerHealthIntervalS: seconds('--router-health-interval', f['router-health-interval']),
        waitS: seconds('--wait', f.wait),
        ...railUpOptions(f),
        ...layoutUpOptions(f),
        ...lagUpOptions(f),
        router: routerUpOptions(f),
      })
    } finally {
      spinner?.stop()
    }
    const {config, ...out} = result
    const rows: Array<[string, string]> = [
      ['router', out.endpoints.router],
      ['prefill', out.endpoints.prefill],
      ['bootstrap', out.endpoints.bootstrap],
      ['decode', out.endpoints.decode],
      ['router metrics', out.endpoints.routerMetrics],
    ]
    const dist = config.dist
      ? ` (node rank ${config.dist.nodeRank} of ${config.dist.nnodes}, dist-init-addr ${config.dist.distInitAddr})`
      : ''
    const node = config.node
      ? `, this node runs ${config.node.services.join(', ')}${dist}; ${Object.entries(config.node.peers)
          .map(([s, a]) => `${s} at ${(a ?? []).join(' and ')}`)
          .join(', ')}`
      : ''
    this.log(
      `Twin healthy in ${(out.healthyMs / 1000).toFixed(1)} s (prefill ${layoutText(config, 'prefill')}, ` +
        `decode ${layoutText(config, 'decode')}, ${config.backend}, ` +
        `watchdog ${config.watchdog.scope} ${config.watchdog.deadlineS}s/${config.watchdog.pollS}s${config.watchdog.lateMs ? ` +${config.watchdog.lateMs}ms late` : ''}${config.bugs.length ? `, bugs: ${config.bugs.join(', ')}` : ''}${node})`,
    )
    for (const [name, url] of rows) this.log(`  ${name.padEnd(15)} ${url}`)
    this.log(`  deployment file ${out.deploymentFile}`)
    this.log(`Stop it with: pdchaos sim down --state-dir ${out.stateDir}`)
    return out
  }
}
