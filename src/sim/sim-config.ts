import {join} from 'node:path'

import type {Lag} from './server/lag.js'
import type {RailsConfig} from './server/rail-plan.js'
import type {PolicyName} from './router/policy.js'

/**
 * The twin's configuration and state-dir layout: the one contract between `sim up` (lifecycle),
 * the server processes, the router and the nvidia-smi stand-in. The twin imports nothing from the CLI.
 */

/**
 * Known defects, and surfaces pdchaos must cope with: `no-watchdog-counter` (a watchdog that evicts but counts
 * nothing in /metrics), `no-disagg-loads` (an SGLang whose /v1/loads has no disagg section, as before it had one) and
 * `no-loads` (no /v1/loads at all, as before entrypoints/v1_loads.py: only the per-batch /metrics gauges remain).
 */
export const BUG_NAMES = [
  'abort-race',
  'early-evict',
  'late-evict',
  'leak-on-evict',
  'stale-prefill-ports',
  'stale-peer',
  'no-watchdog-counter',
  'no-disagg-loads',
  'no-loads',
  'half-dispatch',
] as const
export type BugName = (typeof BUG_NAMES)[number]
export type WatchdogScope = 'all' | 'inflight' | 'off'
export type Backend = 'nixl' | 'mooncake'
export type Role = 'prefill' | 'decode'

export interface SimConfig {
  stateDir: string
  /** Address every twin socket binds to (127.0.0.1, or the namespace host's address). */
  host: string
  model: string
  version: string
  gpus: number
  prefillTp: number
  decodeTp: number
  backend: Backend
  /** lateMs: not SGLang (`sim up --watchdog-late-ms`): the watchdog evicts that much past its deadline (twin.md). */
  watchdog: {scope: WatchdogScope; deadlineS: number; pollS: number; lateMs?: number}
  bugs: BugName[]
  ports: {router: number; routerMetrics: number; prefill: number; decode: number; bootstrap: number}
  /** SGLang's timeouts (SGLANG_DISAGGREGATION_*): the env of the server processes carries them. */
  timeouts: {
    bootstrapS: number
    waitingS: number
    heartbeatIntervalS: number
    heartbeatMaxFailure: number
    /** Decode's own SGLANG_DISAGGREGATION_WAITING_TIMEOUT (`sim up --decode-waiting-timeout`); absent: waitingS. */
    decodeWaitingS?: number
  }
  /**
   * Not SGLang (`sim up --heartbeat off`): decode never probes its prefill peers, while its environment still states
   * the
   * interval. SGLang has no such switch; it shows what a deployment whose heartbeat never fires looks like.
   */
  heartbeat?: 'off'
  /** Simulated cost model. */
  timing: {
    forwardMsPerKToken: number
    kvBytesPerToken: number
    healthTimeoutS: number
    idleGaugeRefreshS: number
    /** Simulated decode time per generated token (default 1 ms). */
    decodeMsPerToken?: number
    /**
     * Delay before a request whose client disconnected is aborted (SGLANG_REQUEST_STATE_WAIT_TIMEOUT-like, default 4
     * s).
     */
    requestStateWaitS?: number
  }
  /** KV pool size per instance in tokens (sglang:token_usage = used / this; SGLang's max_total_num_tokens). */
  kvPoolTokens: number
  /** `sim up --rail-nics`: one NIC (a veth rail<g>) per GPU; the KV path is RDMA WRITEs as UDP 4791 over them. */
  rails?: RailsConfig
  /**
   * UCX_RC_TIMEOUT / UCX_RC_RETRY_COUNT for the services' environment, as given to `sim up` (absent: UCX's defaults).
   */
  ucx?: {rcTimeout?: string; rcRetryCount?: number}
  /** The PD router's settings (sgl-model-gateway flags); defaults as the real router when absent. */
  router?: RouterSettings
  /**
   * `sim up --prefill-dp …` (docs/twin.md, "Layouts"): a server's SGLang layout. prefillTp / decodeTp then count its
   * scheduler processes, not its --tp-size. Absent: TP only, prefill on GPUs 0.., decode after.
   */
  layout?: Partial<Record<Role, ServerLayout>>
  /** `sim up --docker-proxy`: the servers listen on these container ports, docker-proxy on the service ports. */
  dockerProxy?: Record<Role, number>
  /** `sim up --server-config-file`: the servers are launched with `--config DIR/config/<role>.yaml`. */
  serverConfigFile?: boolean
  /**
   * What the nvidia-smi stand-in shows: no processes (as in a container), or a stray context per rank on its first
   * visible GPU.
   */
  gpuView?: {hideProcesses?: boolean; strayContext?: boolean}
  /** Not SGLang (docs/twin.md): `--entry-lag-ms`, the scheduler receives new requests (and aborts) only every N ms, as
   * behind a long forward pass; `--answer-lag-ms`, a released request's HTTP answer is held that long;
   * `--tokenize-ms`, each request is tokenized that long, one at a time, and an abort of a rid not yet tokenized is
   * dropped (the TokenizerManager knows a rid only once it is tokenized). */
  lags?: {entry?: Lag; answer?: Lag; tokenize?: Lag}
  /**
   * `sim up --only …` (docs/twin.md, "Nodes"): this twin is one node of a deployment that spans several. It runs only
   * `services`; the others run on other nodes at `peers` (their addresses: same ports), as an operator starts
   * prefill on one node and decode on another. Absent: every service runs here.
   */
  node?: {services: Array<Role | 'router'>; peers: Partial<Record<Role | 'router', string[]>>}
  /**
   * `sim up --only prefill --nnodes N --node-rank K --dist-init-addr HOST:PORT` (docs/twin.md, "One instance over
   * several nodes"): this node runs node K's share of the TP ranks of one instance of `role` (prefillTp / decodeTp stay
   * the instance's total). Node 0 runs the HTTP API, the scheduler loop and the bootstrap server; the others only
   * ranks.
   */
  dist?: DistConfig
}

export interface DistConfig {
  role: Role
  nnodes: number
  nodeRank: number
  distInitAddr: string
}

/** The dist-init-addr split into host and port (the host is an IP address: options.ts checks it). */
export function distEndpoint(d: DistConfig): {host: string; port: number} {
  const i = d.distInitAddr.lastIndexOf(':')
  return {host: d.distInitAddr.slice(0, i).replace(/^\[|\]$/g, ''), port: Number(d.distInitAddr.slice(i + 1))}
}

/** A node of rank >= 1 of a multi-node instance of `role`: ranks only, a stand-in health endpoint, no API. */
export function isFollower(config: Pick<SimConfig, 'dist'>, role: Role | 'router'): boolean {
  return config.dist !== undefined && config.dist.role === role && config.dist.nodeRank > 0
}

/** The global TP ranks this node runs of a role: SGLang's range(tp_per_node * K, tp_per_node * (K + 1)). */
export function nodeTpRanks(config: Pick<SimConfig, 'dist' | 'prefillTp' | 'decodeTp'>, role: Role): number[] {
  const total = role === 'prefill' ? config.prefillTp : config.decodeTp
  const d = config.dist?.role === role ? config.dist : undefined
  const per = d ? total / d.nnodes : total
  const first = d ? per * d.nodeRank : 0
  return Array.from({length: per}, (_, i) => first + i)
}

/** The services a twin runs on this node. */
export function servicesHere(config: Pick<SimConfig, 'node'>): Array<Role | 'router'> {
  return config.node?.services ?? ['prefill', 'decode', 'router']
}

/** The address a service listens on: this node's for its own services, the (first) peer's for the others. */
export function serviceHost(config: Pick<SimConfig, 'host' | 'node' | 'dist'>, service: Role | 'router'): string {
  return serviceHosts(config, service)[0] ?? config.host
}

/**
 * Every address an instance of the service listens on (same ports on each): this node's when it runs the service,
 * then the peers'. Several are several instances behind the router (`--prefill-host A,B`).
 */
export function serviceHosts(config: Pick<SimConfig, 'host' | 'node' | 'dist'>, service: Role | 'router'): string[] {
  // A follower node's share of an instance is served at node 0's address (the dist-init-addr's host).
  const own = isFollower(config, service) ? distEndpoint(config.dist!).host : config.host
  const here = servicesHere(config).includes(service) ? [own] : []
  return [...here, ...(config.node?.peers[service] ?? [])]
}

/**
 * sgl-model-gateway: --health-check-interval-secs/-timeout-secs, failure/success thresholds, --request-timeout-secs,
 * the retry flags (--retry-max-retries, --retry-initial-backoff-ms, --retry-max-backoff-ms, --retry-backoff-multiplier,
 * --retry-jitter-factor, --disable-retries) and the circuit breaker's (--cb-failure-threshold, --cb-success-threshold,
 * --cb-timeout-duration-secs, --cb-window-duration-secs, --disable-circuit-breaker). Absent: upstream's default.
 */
export interface RouterSettings {
  /**
   * --policy, --prefill-policy, --decode-policy (cache_aware upstream): how the router picks among several instances.
   */
  policy?: PolicyName
  prefillPolicy?: PolicyName
  decodePolicy?: PolicyName
  healthIntervalS?: number
  healthTimeoutS?: number
  healthFailureThreshold?: number
  healthSuccessThreshold?: number
  requestTimeoutS?: number
  retryMaxRetries?: number
  retryInitialBackoffMs?: number
  retryMaxBackoffMs?: number
  retryBackoffMultiplier?: number
  retryJitterFactor?: number
  disableRetries?: boolean
  cbFailureThreshold?: number
  cbSuccessThreshold?: number
  cbTimeoutDurationS?: number
  cbWindowDurationS?: number
  disableCircuitBreaker?: boolean
}

/** Where each artefact of a running twin lives inside its state dir. */
export const simPaths = (stateDir: string) => ({
  config: join(stateDir, 'sim.json'),
  deploymentFile: join(stateDir, 'pdchaos.yaml'),
  lock: join(stateDir, 'sim.lock'),
  logs: join(stateDir, 'logs'),
  log: (service: Role | 'router') => join(stateDir, 'logs', `${service}.log`),
  /** Written by each service once it is healthy: pid, ports, rank pids. */
  service: (service: Role | 'router') => join(stateDir, 'services', `${service}.json`),
  services: join(stateDir, 'services'),
  /** Ground truth, one JSON object per line, one file per service. */
  truth: (service: Role | 'router') => join(stateDir, 'truth', `${service}.jsonl`),
  truthDir: join(stateDir, 'truth'),
  /** One file per GPU index held by a rank: {pid, role, tpRank}. The nvidia-smi stand-in reads these. */
  gpu: (index: number) => join(stateDir, 'gpus', `${index}.json`),
  gpus: join(stateDir, 'gpus'),
  bin: join(stateDir, 'bin'),
  /** `--server-config-file`: each server's SGLang YAML config. */
  serverConfig: (role: Role) => join(stateDir, 'config', `${role}.yaml`),
})

/** Environment names the server processes read (and discovery finds in /proc/<pid>/environ). */
export const SIM_ENV = {
  bootstrapTimeout: 'SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT',
  waitingTimeout: 'SGLANG_DISAGGREGATION_WAITING_TIMEOUT',
  heartbeatInterval: 'SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL',
  heartbeatMaxFailure: 'SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE',
  watchdogScope: 'SGLANG_DISAGGREGATION_WATCHDOG_SCOPE',
  watchdogTimeout: 'SGLANG_DISAGGREGATION_WATCHDOG_TIMEOUT',
  watchdogPollInterval: 'SGLANG_DISAGGREGATION_WATCHDOG_POLL_INTERVAL',
  backend: 'SGLANG_DISAGGREGATION_TRANSFER_BACKEND',
} as const

/**
 * One server's parallel layout, as SGLang's flags state it (`sim up --prefill-dp 2 --prefill-dp-attention …`), and
 * what follows from it for each of its scheduler processes: title, GPU and bootstrap route key. The twin's data path
 * still runs the server's schedulers as one group numbered 0..N-1 (the flat rank k); only these surfaces change.
 */
export interface ServerLayout {
  /** --tp-size: with DP attention the TP group spans every DP rank; with plain DP it is one replica's. */
  tp: number
  dp: number
  pp: number
  dpAttention: boolean
  ep: number
  baseGpuId: number
  /** CUDA_VISIBLE_DEVICES of the server (GPU indices), when set. */
  cudaVisibleDevices?: number[]
  /** --nnodes > 1: the TP ranks each node runs (tp_size // nnodes); a rank's GPU counts from its node's base. */
  tpPerNode?: number
}
