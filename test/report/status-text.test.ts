import {describe, expect, it} from 'vitest'

import type {StatusReport} from '../../src/engines/sglang/discovery/discover.js'
import type {DeploymentReport} from '../../src/engines/sglang/discovery/discover-hosts.js'
import {renderStatus} from '../../src/report/status-text.js'

// `pdchaos status` as a person reads it: these pin the whole screen for one host and for several, so that a change
// to its layout is a deliberate one.

const healthy = (ms: number) => ({ok: true, status: 200, ms})

const timeouts = {
  version: '0.5.4',
  versionSource: "prefill's server_info",
  backend: 'nixl',
  bootstrap: {seconds: 300, source: 'SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT unset: the default'},
  waiting: {seconds: null, source: 'SGLANG_DISAGGREGATION_WAITING_TIMEOUT unset: none'},
  heartbeat: {seconds: 10, intervalSeconds: 5, maxFailure: 2, source: "decode's environment"},
}

function oneHost(): StatusReport {
  return {
    deployment: {name: 'pd-a', host: 'gpu-1', labels: {}, backend: 'nixl'},
    transport: {backend: 'nixl', source: 'the deployment file'},
    services: {
      prefill: {
        url: 'http://10.0.0.1:30000',
        health: healthy(12.4),
        readiness: healthy(3),
        version: '0.5.4',
        tpSize: 2,
        pid: 4242,
      },
      decode: {url: 'http://10.0.0.1:30001', health: {ok: false, status: 503, ms: 4}, readiness: {ok: false, ms: 1}},
      router: {
        url: 'http://10.0.0.1:8000',
        health: {ok: false, error: 'connect ECONNREFUSED', ms: 0},
        routerSettings: {
          source: "the router's command line",
          retries: {enabled: true, attempts: 3},
          circuitBreaker: {enabled: true, failureThreshold: 5, openSeconds: 30},
          underFaults: ['a held request is sent again up to 2 times', 'five failures open the breaker'],
        },
      },
    },
    ranks: [
      {service: 'prefill', tpRank: 0, pid: 5001, gpu: 0, state: 'S', title: 'sglang::scheduler_TP0', zmqPort: 5757},
      {
        service: 'decode',
        tpRank: 1,
        pid: 6002,
        state: 'R',
        title: 'sglang::scheduler_TP1',
        zmqHost: '10.0.0.1',
        zmqPort: 5858,
      },
    ],
    watchdog: {
      contract: {scope: 'prefill', deadlineSeconds: 30, pollSeconds: 5},
      prefillEnv: {scope: 'prefill', deadlineSeconds: 30},
    },
    sglangTimeouts: timeouts,
    counters: {
      prefill: {'sglang:num_bootstrap_failed_reqs_total': 2, 'sglang:num_transfer_failed_reqs_total': 0},
      decode: {},
    },
    gauges: {prefill: {'sglang:num_prefill_inflight_queue_reqs': 1}, decode: {'sglang:token_usage': 0.25}},
    hostState: {
      leases: [
        {file: '/run/pdchaos/leases/a.json', id: 'lease-a', fault: 'stall-kv'},
        {file: '/run/pdchaos/leases/b.json'},
      ],
      lock: {file: '/run/pdchaos/lock.json', owner: 'alice', command: 'suite'},
    },
    warnings: ['decode is not ready', 'the router refuses connections'],
    ms: 120,
  } as unknown as StatusReport
}

function severalHosts(): DeploymentReport {
  const base = oneHost()
  return {
    ...base,
    services: {
      prefill: {...base.services.prefill, host: 'node-a'},
      decode: {...base.services.decode, host: 'node-b'},
      router: {url: 'http://10.0.0.1:8000', health: healthy(2), host: 'node-a'},
    },
    instances: [
      {path: 'services.prefill[0]', host: 'node-a', url: 'http://10.0.0.1:30000', health: healthy(5)},
      {path: 'services.decode[0]', host: 'node-b', url: 'http://10.0.0.2:30001', health: healthy(6), pid: 77},
    ],
    ranks: [
      {
        service: 'prefill',
        host: 'node-a',
        instance: 'services.prefill[0]',
        tpRank: 0,
        pid: 11,
        state: 'S',
        title: 't0',
      },
      {service: 'decode', host: 'node-long-name', nodeRank: 1, tpRank: 3, pid: 12, gpu: 3, state: 'D', title: 't3'},
    ],
    watchdog: {contract: {scope: 'prefill', deadlineSeconds: 60, pollSeconds: 10}},
    sglangTimeouts: {...timeouts, version: undefined, backend: undefined},
    counters: {prefill: {}, decode: {}},
    gauges: {prefill: {}, decode: {}},
    hosts: [
      {name: 'node-a', host: 'root@10.0.0.1', roles: ['prefill', 'router'], hostState: {leases: [], lock: null}},
      {
        name: 'node-long-name',
        host: 'root@10.0.0.2',
        roles: ['decode'],
        nodeRanks: [{path: 'services.decode[0]', nodeRank: 1}],
        hostState: {leases: [{file: 'x.json', id: 'lease-x', fault: 'wedge-rank'}], lock: null},
      },
    ],
    warnings: [],
  } as unknown as DeploymentReport
}

describe('status for a person', () => {
  it('one host: services, router settings, ranks, watchdog, SGLang timeouts, counters, leases, lock, warnings', () => {
    expect(renderStatus(oneHost()).split('\n')).toEqual(ONE_HOST)
  })

  it('several hosts: each service, rank and host named, instances listed, no ranks found', () => {
    expect(renderStatus(severalHosts()).split('\n')).toEqual(SEVERAL_HOSTS)
    const none = {...severalHosts(), ranks: []}
    expect(renderStatus(none)).toContain('\nranks\n  (none found)\n')
    const off = oneHost()
    off.services.router.routerSettings = {
      source: "the gateway's defaults",
      retries: {enabled: false, attempts: 1},
      circuitBreaker: {enabled: false, failureThreshold: 5, openSeconds: 30},
      underFaults: [],
    }
    expect(renderStatus(off)).toContain(
      "\n  router   retries: off; circuit breaker: off  (the gateway's defaults)\n           (pdchaos sends",
    )
  })
})

const ONE_HOST: string[] = [
  'deployment pd-a on gpu-1  (backend nixl, from the deployment file)',
  '',
  'services',
  '  prefill  http://10.0.0.1:30000        healthy (12 ms), ready  [SGLang 0.5.4, tp 2, pid 4242]',
  '  decode   http://10.0.0.1:30001        UNHEALTHY: 503, NOT READY',
  '  router   http://10.0.0.1:8000         UNHEALTHY: connect ECONNREFUSED',
  "  router   retries: 3 attempts in all; circuit breaker: opens after 5 failures, for 30 s  (the router's command line)",
  '           under a fault: a held request is sent again up to 2 times',
  '           under a fault: five failures open the breaker',
  '           (pdchaos sends its pins to prefill and decode directly, once each; load and canaries go through the router)',
  '',
  'ranks',
  '  prefill  TP0  pid 5001    gpu 0  state S  sglang::scheduler_TP0  zmq :5757',
  '  decode   TP1  pid 6002    gpu ?  state R  sglang::scheduler_TP1  zmq 10.0.0.1:5858',
  '',
  'watchdog  contract: scope prefill, deadline 30s, poll 5s;  prefill env: scope prefill, deadline 30s, poll -s',
  "sglang    version 0.5.4 (prefill's server_info), backend nixl; its own timeouts:",
  "          prefill's bootstrap timeout 300 s: SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT unset: the default",
  "          decode's waiting timeout none: SGLANG_DISAGGREGATION_WAITING_TIMEOUT unset: none",
  "          decode's heartbeat bound 10 s (5 s x 2): decode's environment",
  'prefill   counters: bootstrap_failed=2 transfer_failed=0',
  '          gauges (may be stale): prefill_inflight_queue=1',
  'decode    counters: -',
  '          gauges (may be stale): token_usage=0.25',
  '',
  'leases    lease-a (stall-kv), /run/pdchaos/leases/b.json (?)',
  'lock      held by alice for suite',
  '',
  'warnings',
  '  ! decode is not ready',
  '  ! the router refuses connections',
]
const SEVERAL_HOSTS: string[] = [
  'deployment pd-a on gpu-1  (backend nixl, from the deployment file)',
  '',
  'hosts',
  '  node-a         root@10.0.0.1                runs prefill, router',
  '  node-long-name root@10.0.0.2                runs decode, decode[0] node rank 1',
  '',
  'services',
  '  prefill[0] node-a         http://10.0.0.1:30000        healthy (5 ms)',
  '  decode[0]  node-b         http://10.0.0.2:30001        healthy (6 ms)  [pid 77]',
  '  router     node-a         http://10.0.0.1:8000         healthy (2 ms)',
  '',
  'ranks',
  '  prefill[0] node-a         TP0  pid 11      gpu ?  state S  t0',
  '  decode node 1 node-long-name TP3  pid 12      gpu 3  state D  t3',
  '',
  'watchdog  contract: scope prefill, deadline 60s, poll 10s',
  "sglang    version unknown (prefill's server_info); its own timeouts:",
  "          prefill's bootstrap timeout 300 s: SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT unset: the default",
  "          decode's waiting timeout none: SGLANG_DISAGGREGATION_WAITING_TIMEOUT unset: none",
  "          decode's heartbeat bound 10 s (5 s x 2): decode's environment",
  'prefill   counters: -',
  '          gauges (may be stale): -',
  'decode    counters: -',
  '          gauges (may be stale): -',
  '',
  'leases on node-a            none',
  'lock on node-a              free',
  'leases on node-long-name    lease-x (wedge-rank)',
  'lock on node-long-name      free',
]
