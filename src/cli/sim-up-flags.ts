import {Flags, type Interfaces} from '@oclif/core'

import type {SimUpOptions} from '../sim/lifecycle/index.js'
import {BUG_NAMES} from '../sim/sim-config.js'
import {layoutFlags, layoutUpOptions} from './layout-flags.js'
import {
  lagFlags,
  lagUpOptions,
  railFlags,
  railUpOptions,
  routerFlags,
  routerUpOptions,
  seconds,
  stateDirFlag,
} from './sim-flags.js'
import {vllmUpFlags} from './vllm-twin.js'

/** `pdchaos sim up`'s flags, each one of the twin's options (SimUpOptions). */
export const simUpFlags = {
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
    summary: 'Not SGLang: the watchdog evicts this many ms past its deadline (a watchdog drifting late; docs/twin.md).',
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

export type SimUpFlagValues = Interfaces.InferredFlags<typeof simUpFlags>

/** `sim up`'s flags as the twin's options: seconds parsed, absent flags left out. */
export function simUpOptions(f: SimUpFlagValues): SimUpOptions {
  return {
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
  }
}
