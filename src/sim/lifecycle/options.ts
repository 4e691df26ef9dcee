import {isIP} from 'node:net'
import {resolve} from 'node:path'

import {badInput} from './sim-error.js'
import {anyGiven, buildLayouts, type LayoutUpOptions} from './layout-options.js'
import {buildDist, type DistUpOptions} from './dist-options.js'
import {rankCount} from '../server/layout.js'
import {parseUcxTime, railPlan, type RailsConfig} from '../server/rail-plan.js'
import {gpuIndex} from '../server/protocol.js'
import {type Lag, parseLag} from '../server/lag.js'
import {CB_DEFAULTS} from '../router/circuit-breaker.js'
import {RETRY_DEFAULTS} from '../router/retry.js'
import {POLICY_NAMES} from '../router/policy.js'
import {
  type Backend,
  BUG_NAMES,
  type BugName,
  type SimConfig,
  type WatchdogScope,
  type RouterSettings,
} from '../sim-config.js'

/** What `pdchaos sim up` takes (flags map 1:1); every field optional, defaults below. */
export interface SimUpOptions extends DistUpOptions {
  stateDir: string
  host?: string
  /** `--only`: the services this node runs (a twin spanning nodes); absent: all three. */
  only?: string[]
  /**
   * `--prefill-host`, `--decode-host`, `--router-host`: where the services this node does not run listen (a
   * comma-separated list: one instance per node). On the router's node, further instances of a role it also runs.
   */
  peers?: Partial<Record<'prefill' | 'decode' | 'router', string>>
  gpus?: number
  prefillTp?: number
  decodeTp?: number
  backend?: Backend
  watchdog?: WatchdogScope
  deadlineS?: number
  pollS?: number
  /** Not SGLang: the watchdog evicts this many ms past its deadline (a watchdog drifting late, step by step). */
  watchdogLateMs?: number
  bugs?: string[]
  basePort?: number
  waitingTimeoutS?: number
  /**
   * SGLANG_DISAGGREGATION_WAITING_TIMEOUT in decode's environment only (the process that reads it); default
   * waitingTimeoutS.
   */
  decodeWaitingTimeoutS?: number
  bootstrapTimeoutS?: number
  heartbeatIntervalS?: number
  heartbeatMaxFailure?: number
  /** Not SGLang: 'off' stops decode's heartbeat (its environment still states the interval). */
  heartbeat?: 'on' | 'off'
  /** Deadline for the whole twin to become healthy. */
  waitS?: number
  /** The router's worker health-check interval (sgl-model-gateway --health-check-interval-secs, 60 by default). */
  routerHealthIntervalS?: number
  /**
   * The router's retry and circuit-breaker flags, by sgl-model-gateway's names (docs/twin.md, "Router"); upstream
   * defaults.
   */
  router?: RouterUpOptions
  model?: string
  version?: string
  /** Overrides of the cost model (tests, benchmark). */
  timing?: Partial<SimConfig['timing']>
  kvPoolTokens?: number
  /**
   * One NIC per GPU (rail<g>, needs root): KV as RDMA WRITEs over UDP 4791 on the GPU's rail (docs/twin.md, "Rail
   * NICs").
   */
  railNics?: boolean
  /** UCX_RC_TIMEOUT in the services' environment, in UCX's syntax (1s, 300ms, 0.5); absent: UCX's default 1.0s. */
  ucxRcTimeout?: string
  /** UCX_RC_RETRY_COUNT in the services' environment; absent: UCX's default 7. */
  ucxRcRetryCount?: number
  /** Not SGLang (docs/twin.md): "N[:JITTER]" ms, the scheduler receives new requests only every N ms. */
  entryLagMs?: string
  /** Not SGLang (docs/twin.md): "N[:JITTER]" ms, a released request's HTTP answer is held that long. */
  answerLagMs?: string
  /** Not SGLang's timing (docs/twin.md): "N[:JITTER]" ms, each request's tokenization, one at a time. */
  tokenizeMs?: string
  /**
   * Each server's SGLang layout (docs/twin.md, "Layouts"): DP, DP attention, PP, EP, base GPU id, CUDA_VISIBLE_DEVICES.
   */
  prefillLayout?: LayoutUpOptions
  decodeLayout?: LayoutUpOptions
  /** docker-proxy owns the servers' HTTP ports; the servers listen on container ports (router +150, +250). */
  dockerProxy?: boolean
  /** Launch the servers with `--config FILE` (SGLang's YAML) instead of flags. */
  serverConfigFile?: boolean
  /** nvidia-smi lists no compute processes, as inside a container. */
  hideGpuProcesses?: boolean
  /** Each scheduler also holds a small context on its first visible GPU, listed before its own. */
  strayCudaContext?: boolean
}

/** sgl-model-gateway's --retry-* / --cb-* / --disable-* flags as `sim up` takes them (one field per flag; the router's
 * own settings, so the two cannot drift apart). retryMaxRetries: attempts per request in all (upstream runs max(N, 1)).
 * */
export type RouterUpOptions = Pick<
  RouterSettings,
  | 'retryMaxRetries'
  | 'retryInitialBackoffMs'
  | 'retryMaxBackoffMs'
  | 'retryBackoffMultiplier'
  | 'retryJitterFactor'
  | 'disableRetries'
  | 'cbFailureThreshold'
  | 'cbSuccessThreshold'
  | 'cbTimeoutDurationS'
  | 'cbWindowDurationS'
  | 'disableCircuitBreaker'
  | 'policy'
>

export const UP_DEFAULTS = {
  host: '127.0.0.1',
  gpus: 8,
  prefillTp: 4,
  decodeTp: 4,
  backend: 'nixl' as Backend,
  watchdog: 'all' as WatchdogScope,
  deadlineS: 60,
  pollS: 1,
  basePort: 30_000,
  // SGLang's defaults (environ.py).
  waitingTimeoutS: 300,
  bootstrapTimeoutS: 300,
  heartbeatIntervalS: 5,
  heartbeatMaxFailure: 2,
  waitS: 30,
  routerHealthIntervalS: 60,
  model: 'meta-llama/Llama-3.1-8B-Instruct',
  version: '0.5.15',
  timing: {
    forwardMsPerKToken: 20,
    kvBytesPerToken: 1024,
    healthTimeoutS: 20,
    idleGaugeRefreshS: 30,
    decodeMsPerToken: 1,
    requestStateWaitS: 4,
  },
  kvPoolTokens: 1_000_000,
}

/**
 * The port offsets of SGLang's PD test fixture: router N, prefill N+100, decode N+200, bootstrap N+500, router metrics
 * N+900.
 */
export function portsFor(base: number): SimConfig['ports'] {
  return {router: base, prefill: base + 100, decode: base + 200, bootstrap: base + 500, routerMetrics: base + 900}
}

const MAX_OFFSET = 900
// --docker-proxy's container ports (+150, +250) stay under MAX_OFFSET.

function positive(name: string, v: number | undefined, fallback: number, max = 86_400): number {
  const x = v ?? fallback
  if (!Number.isFinite(x) || x <= 0)
    throw badInput(`${name} must be a number of seconds greater than 0, got ${x}`, `pass ${name} ${fallback}`)
  if (x > max) throw badInput(`${name} must be at most ${max} seconds, got ${x}`, `pass a smaller ${name}`)
  return x
}

function integer(name: string, v: number | undefined, fallback: number, min: number, max: number): number {
  const x = v ?? fallback
  if (!Number.isInteger(x) || x < min || x > max)
    throw badInput(`${name} must be an integer from ${min} to ${max}, got ${x}`, `pass ${name} ${fallback}`)
  return x
}

/** --sglang-version: a version as SGLang spells it (0.5.16, 0.5.16rc1, 0.5.15.post2). */
function versionOf(v: string | undefined): string {
  const x = (v ?? UP_DEFAULTS.version).trim()
  if (!/^v?\d+\.\d+(\.\d+)?([.\w-]*)$/.test(x) || x.length > 40)
    throw badInput(
      `--sglang-version must be a version like 0.5.16, got "${x}"`,
      `pass --sglang-version ${UP_DEFAULTS.version}`,
    )
  return x.replace(/^v/, '')
}

/** --entry-lag-ms / --answer-lag-ms / --tokenize-ms ("N[:JITTER]" ms), the twin's own lag options. */
function lagOptions(o: SimUpOptions): SimConfig['lags'] | undefined {
  const one = (flag: string, raw: string | undefined): Lag | undefined => {
    if (raw === undefined) return undefined
    const l = parseLag(raw)
    if (typeof l === 'string') throw badInput(`${flag}: ${l}`, `pass for example ${flag} 150:100 (150 ms ± 100 ms)`)
    return l.ms > 0 ? l : undefined
  }
  const entry = one('--entry-lag-ms', o.entryLagMs)
  const answer = one('--answer-lag-ms', o.answerLagMs)
  const tokenize = one('--tokenize-ms', o.tokenizeMs)
  if (!entry && !answer && !tokenize) return undefined
  return {...(entry ? {entry} : {}), ...(answer ? {answer} : {}), ...(tokenize ? {tokenize} : {})}
}

/**
 * --ucx-rc-timeout (UCX's time syntax, ucs_config_sscanf_time) and --ucx-rc-retry-count, checked as UCX parses them.
 */
function ucxOptions(o: SimUpOptions): SimConfig['ucx'] | undefined {
  if (o.ucxRcTimeout === undefined && o.ucxRcRetryCount === undefined) return undefined
  const out: NonNullable<SimConfig['ucx']> = {}
  if (o.ucxRcTimeout !== undefined) {
    const s = parseUcxTime(o.ucxRcTimeout)
    if (s === undefined || s <= 0 || s > 3600) {
      throw badInput(
        `--ucx-rc-timeout must be a UCX time value above 0 and at most an hour (a number and s, ms, us or ns; no ` +
          `unit is seconds), got "${o.ucxRcTimeout}"`,
        'pass for example --ucx-rc-timeout 300ms',
      )
    }
    out.rcTimeout = o.ucxRcTimeout.trim()
  }
  if (o.ucxRcRetryCount !== undefined) out.rcRetryCount = integer('--ucx-rc-retry-count', o.ucxRcRetryCount, 7, 0, 255)
  return out
}

/** The placement phase of buildSimConfig: the state dir, the bind address, the GPUs and both TP sizes. */
function placementOf(o: SimUpOptions): {
  host: string
  gpus: number
  prefillTp: number
  decodeTp: number
  distGiven: boolean
} {
  if (!o.stateDir) throw badInput('--state-dir must not be empty', 'pass --state-dir DIR or set PDCHAOS_SIM_DIR')
  const host = o.host ?? UP_DEFAULTS.host
  if (isIP(host) === 0)
    throw badInput(
      `--host must be an IP address to bind to, got "${host}"`,
      'pass --host 127.0.0.1 or an address of this host',
    )
  const gpus = integer('--gpus', o.gpus, UP_DEFAULTS.gpus, 2, 64)
  const prefillTp = integer('--prefill-tp', o.prefillTp, UP_DEFAULTS.prefillTp, 1, 64)
  const decodeTp = integer('--decode-tp', o.decodeTp, UP_DEFAULTS.decodeTp, 1, 64)
  // One instance over several nodes: this node holds only its share of one server's ranks (from GPU 0).
  const distGiven = (o.nnodes ?? 1) > 1
  const roleTp = o.only?.[0] === 'decode' ? decodeTp : prefillTp
  if (distGiven && Number.isInteger(o.nnodes) && roleTp / o.nnodes! > gpus) {
    throw badInput(
      `--${o.only?.[0] === 'decode' ? 'decode' : 'prefill'}-tp ${roleTp} over --nnodes ${o.nnodes} ` +
        `needs ${Math.ceil(roleTp / o.nnodes!)} GPUs per node but --gpus is ${gpus}`,
      'pass a larger --gpus or --nnodes',
    )
  }
  if (!distGiven && prefillTp + decodeTp > gpus) {
    throw badInput(
      `--prefill-tp ${prefillTp} + --decode-tp ${decodeTp} needs ${prefillTp + decodeTp} GPUs but --gpus is ${gpus}`,
      `pass --gpus ${prefillTp + decodeTp} or smaller TP sizes`,
    )
  }
  return {host, gpus, prefillTp, decodeTp, distGiven}
}

/** The watchdog and defects phase of buildSimConfig: backend, watchdog scope and timing, --bug, --base-port. */
function watchdogOf(o: SimUpOptions): {
  backend: Backend
  watchdog: SimConfig['watchdog']
  bugs: BugName[]
  basePort: number
} {
  const backend = o.backend ?? UP_DEFAULTS.backend
  if (backend !== 'nixl' && backend !== 'mooncake')
    throw badInput(`--backend must be nixl or mooncake, got "${backend}"`, 'pass --backend nixl')
  const scope = o.watchdog ?? UP_DEFAULTS.watchdog
  if (!['all', 'inflight', 'off'].includes(scope))
    throw badInput(`--watchdog must be all, inflight or off, got "${scope}"`, 'pass --watchdog all')
  // The twin's own bounds on its watchdog, behind its wall (it imports no CLI code); the contract's rules, poll <=
  // deadline among them, have their one home in src/engines/sglang/deployment/watchdog-rules.ts, asked by the CLI
  // (cli/twin.ts).
  const deadlineS = positive('--deadline', o.deadlineS, UP_DEFAULTS.deadlineS)
  const pollS = positive('--poll', o.pollS, UP_DEFAULTS.pollS, 3600)
  const lateMs = o.watchdogLateMs ?? 0
  if (!Number.isInteger(lateMs) || lateMs < 0 || lateMs > 3_600_000) {
    throw badInput(
      `--watchdog-late-ms must be a whole number of ms from 0 to 3600000, got ${lateMs}`,
      'pass --watchdog-late-ms 200',
    )
  }
  const bugs: BugName[] = []
  for (const b of o.bugs ?? []) {
    if (!(BUG_NAMES as readonly string[]).includes(b))
      throw badInput(`--bug "${b}" is not a known defect`, `use one of: ${BUG_NAMES.join(', ')}`)
    if (!bugs.includes(b as BugName)) bugs.push(b as BugName)
  }
  const basePort = integer('--base-port', o.basePort, UP_DEFAULTS.basePort, 1, 65_535 - MAX_OFFSET)
  return {backend, watchdog: {scope, deadlineS, pollS, ...(lateMs > 0 ? {lateMs} : {})}, bugs, basePort}
}

/** The timeouts phase of buildSimConfig: heartbeat, UCX, waiting and bootstrap timeouts, --wait, the router's probe. */
function timeoutsOf(o: SimUpOptions): {
  timeouts: SimConfig['timeouts']
  ucx: SimConfig['ucx'] | undefined
  routerHealthIntervalS: number
} {
  const heartbeatIntervalS = positive('--heartbeat-interval', o.heartbeatIntervalS, UP_DEFAULTS.heartbeatIntervalS)
  // SGLang clamps the interval to >= 2 s; a smaller value would be silently changed, so refuse it.
  if (heartbeatIntervalS < 2)
    throw badInput(
      `--heartbeat-interval must be at least 2 seconds (SGLang's minimum), got ${heartbeatIntervalS}`,
      'pass --heartbeat-interval 2',
    )
  const heartbeatMaxFailure = integer(
    '--heartbeat-max-failure',
    o.heartbeatMaxFailure,
    UP_DEFAULTS.heartbeatMaxFailure,
    1,
    1000,
  )
  const ucx = ucxOptions(o)
  const waitingS = positive('--waiting-timeout', o.waitingTimeoutS, UP_DEFAULTS.waitingTimeoutS)
  const decodeWaitingS =
    o.decodeWaitingTimeoutS === undefined
      ? undefined
      : positive('--decode-waiting-timeout', o.decodeWaitingTimeoutS, waitingS)
  const bootstrapS = positive('--bootstrap-timeout', o.bootstrapTimeoutS, UP_DEFAULTS.bootstrapTimeoutS)
  positive('--wait', o.waitS, UP_DEFAULTS.waitS, 3600)
  const routerHealthIntervalS = positive(
    '--router-health-interval',
    o.routerHealthIntervalS,
    UP_DEFAULTS.routerHealthIntervalS,
    3600,
  )
  const timeouts = {
    bootstrapS,
    waitingS,
    heartbeatIntervalS,
    heartbeatMaxFailure,
    ...(decodeWaitingS === undefined ? {} : {decodeWaitingS}),
  }
  return {timeouts, ucx, routerHealthIntervalS}
}

/** The topology phase of buildSimConfig: layouts, this node's services and peers, rail NICs, a multi-node instance. */
function topologyOf(
  o: SimUpOptions,
  p: ReturnType<typeof placementOf>,
): {
  layout: SimConfig['layout']
  node: SimConfig['node']
  rails: RailsConfig | undefined
  dist: SimConfig['dist']
} {
  const {host, gpus, prefillTp, decodeTp, distGiven} = p
  if (distGiven && (anyGiven(o.prefillLayout) || anyGiven(o.decodeLayout))) {
    throw badInput(
      '--nnodes cannot be combined with the layout flags yet (DP, PP, EP, base GPU id, CUDA_VISIBLE_DEVICES)',
      'drop the --prefill-*/--decode-* layout flags, or run the instance on one node',
    )
  }
  const layout = buildLayouts(o, prefillTp, decodeTp, gpus)
  // Rails follow the plain placement (GPU g's NIC serves prefill rank g / decode rank g - prefillTp).
  if (layout && o.railNics)
    throw badInput(
      '--rail-nics cannot be combined with the layout flags',
      'drop --rail-nics or the --prefill-*/--decode-* layout flags',
    )
  const node = nodeOptions(o, host)
  const rails = o.railNics ? railsOf(node, distGiven, gpus, prefillTp, decodeTp) : undefined
  const dist = buildDist({...o, prefillTp, decodeTp, host}, node)
  if (dist && o.dockerProxy)
    throw badInput('--nnodes cannot be combined with --docker-proxy yet', 'drop --docker-proxy')
  return {layout, node, rails, dist}
}

/** Validate the options and build the twin's sim.json; bad input throws badInput (exit 2) naming the flag. */
export function buildSimConfig(o: SimUpOptions): SimConfig {
  const placement = placementOf(o)
  const {host, gpus, prefillTp, decodeTp} = placement
  const {backend, watchdog, bugs, basePort} = watchdogOf(o)
  const {timeouts, ucx, routerHealthIntervalS} = timeoutsOf(o)
  const resilience = routerResilience(o.router ?? {})
  const lags = lagOptions(o)
  const {layout, node, rails, dist} = topologyOf(o, placement)

  return {
    stateDir: resolve(o.stateDir),
    host,
    ...(node ? {node} : {}),
    ...(dist ? {dist} : {}),
    model: o.model ?? UP_DEFAULTS.model,
    version: versionOf(o.version),
    gpus,
    // With a layout these count scheduler processes (the twin's flat ranks); the layout keeps SGLang's --tp-size.
    prefillTp: layout?.prefill ? rankCount(layout.prefill) : prefillTp,
    decodeTp: layout?.decode ? rankCount(layout.decode) : decodeTp,
    backend,
    ...(layout ? {layout} : {}),
    ...(o.dockerProxy ? {dockerProxy: {prefill: basePort + 150, decode: basePort + 250}} : {}),
    ...(o.serverConfigFile ? {serverConfigFile: true} : {}),
    ...gpuViewOf(o),
    ...(rails ? {rails} : {}),
    ...(ucx ? {ucx} : {}),
    ...(lags ? {lags} : {}),
    watchdog,
    bugs,
    ...(o.heartbeat === 'off' ? {heartbeat: 'off' as const} : {}),
    ports: portsFor(basePort),
    timeouts,
    timing: {...UP_DEFAULTS.timing, ...o.timing},
    kvPoolTokens: o.kvPoolTokens ?? UP_DEFAULTS.kvPoolTokens,
    router: {
      healthIntervalS: routerHealthIntervalS,
      healthTimeoutS: 5,
      healthFailureThreshold: 3,
      healthSuccessThreshold: 2,
      requestTimeoutS: 1800,
      ...resilience,
    },
  }
}

/** --hide-gpu-processes and --stray-cuda-context: what nvidia-smi shows (absent when neither is given). */
function gpuViewOf(o: SimUpOptions): Pick<SimConfig, 'gpuView'> {
  if (!(o.hideGpuProcesses || o.strayCudaContext)) return {}
  return {
    gpuView: {
      ...(o.hideGpuProcesses ? {hideProcesses: true} : {}),
      ...(o.strayCudaContext ? {strayContext: true} : {}),
    },
  }
}

/**
 * --rail-nics: one rail per GPU of the host; on a node of a twin that spans nodes (--only), the rails of this node's
 * GPUs only (prefill's 0..prefillTp-1, decode's after them: the numbering stays global, as the ranks' GPUs do).
 */
function railsOf(
  node: SimConfig['node'],
  distGiven: boolean,
  gpus: number,
  prefillTp: number,
  decodeTp: number,
): RailsConfig {
  if (distGiven) {
    throw badInput(
      '--rail-nics cannot be combined with --nnodes above 1 yet: the rails of an instance whose TP ranks span ' +
        'nodes are not modelled',
      'drop --rail-nics, or run each instance on one node (--nnodes 1, one --only prefill or decode node each)',
    )
  }
  if (!node) return railPlan(gpus)
  const here: number[] = []
  if (node.services.includes('prefill'))
    for (let k = 0; k < prefillTp; k++) here.push(gpuIndex('prefill', k, prefillTp))
  if (node.services.includes('decode')) for (let k = 0; k < decodeTp; k++) here.push(gpuIndex('decode', k, prefillTp))
  if (here.length === 0) {
    throw badInput(
      `--rail-nics: this node runs ${node.services.join(', ')} only, which has no GPU and so no rail NIC`,
      'pass --rail-nics on the prefill and decode nodes only',
    )
  }
  return railPlan(gpus, here)
}

const ALL_SERVICES = ['prefill', 'decode', 'router'] as const

/** `--only` and the peers' addresses: every service this node does not run needs its node's address, and only those. */
function nodeOptions(o: SimUpOptions, host: string): SimConfig['node'] {
  const peers = Object.entries(o.peers ?? {}).filter(([, v]) => v !== undefined) as Array<
    [(typeof ALL_SERVICES)[number], string]
  >
  if (o.only === undefined || o.only.length === 0) {
    if (peers.length > 0)
      throw badInput(
        `--${peers[0]![0]}-host says where ${peers[0]![0]} runs, but this twin runs every service (no --only)`,
        `pass --only with the services this node runs, or drop --${peers[0]![0]}-host`,
      )
    return undefined
  }
  const services: Array<(typeof ALL_SERVICES)[number]> = []
  for (const s of o.only) {
    if (!(ALL_SERVICES as readonly string[]).includes(s))
      throw badInput(`--only "${s}" is not a service of the twin`, `use one or more of: ${ALL_SERVICES.join(', ')}`)
    if (!services.includes(s as (typeof ALL_SERVICES)[number])) services.push(s as (typeof ALL_SERVICES)[number])
  }
  const out: NonNullable<SimConfig['node']>['peers'] = {}
  for (const [service, list] of peers) {
    const addrs = list.split(',').map(a => a.trim())
    // A role this node runs takes further instances on other nodes only where the router runs: it routes to them all.
    if (services.includes(service) && (service === 'router' || !services.includes('router'))) {
      throw badInput(
        `--${service}-host: ${service} runs on this node (--only ${services.join(',')}), at --host ${host}`,
        `drop --${service}-host`,
      )
    }
    if (service === 'router' && addrs.length > 1)
      throw badInput(`--router-host names one node (the router's), got ${addrs.length}`, 'pass --router-host ADDR')
    for (const addr of addrs) {
      if (isIP(addr) === 0)
        throw badInput(
          `--${service}-host must be the IP address of the node ${service} runs on (or a comma-separated list, one ` +
            `per instance), got "${addr}"`,
          `pass --${service}-host 10.0.0.2`,
        )
      if (addr === host && services.includes(service))
        throw badInput(
          `--${service}-host ${addr} is this node, which already runs ${service}`,
          `list only the other nodes' addresses in --${service}-host`,
        )
    }
    if (new Set(addrs).size !== addrs.length)
      throw badInput(`--${service}-host lists an address twice: ${list}`, "list each instance's node once")
    out[service] = addrs
  }
  const missing = ALL_SERVICES.filter(s => !services.includes(s) && out[s] === undefined)
  if (missing.length > 0)
    throw badInput(
      `this node runs ${services.join(', ')} only: say where ${missing.join(' and ')} ` +
        `run${missing.length === 1 ? 's' : ''}`,
      missing.map(m => `--${m}-host ADDR`).join(' '),
    )
  return {services: ALL_SERVICES.filter(s => services.includes(s)), peers: out}
}

function policyOf(p: string | undefined): NonNullable<RouterUpOptions['policy']> {
  if (p === undefined) return 'cache_aware'
  if (!(POLICY_NAMES as readonly string[]).includes(p))
    throw badInput(`--policy must be one of ${POLICY_NAMES.join(', ')}, got "${p}"`, 'pass --policy cache_aware')
  return p as NonNullable<RouterUpOptions['policy']>
}

/**
 * The router's retry and breaker flags, checked and filled with upstream's defaults (RetryConfig and
 * CircuitBreakerConfig, sgl-model-gateway/src/config/types.rs): every value is written to sim.json and so shows on the
 * router's command line.
 */
function routerResilience(r: RouterUpOptions): Required<RouterUpOptions> {
  return {...retryOptions(r), ...breakerOptions(r), policy: policyOf(r.policy)}
}

/** One numeric router flag: its value or upstream's default, within [min, max] (whole: an integer). */
function bounded(name: string, v: number | undefined, fallback: number, min: number, max: number, whole: boolean) {
  const x = v ?? fallback
  if (!Number.isFinite(x) || x < min || x > max || (whole && !Number.isInteger(x))) {
    throw badInput(
      `${name} must be ${whole ? 'an integer' : 'a number'} from ${min} to ${max}, got ${x}`,
      `pass ${name} ${fallback}`,
    )
  }
  return x
}

/** --retry-* and --disable-retries (RetryConfig). */
function retryOptions(r: RouterUpOptions) {
  const d = RETRY_DEFAULTS
  return {
    retryMaxRetries: bounded('--retry-max-retries', r.retryMaxRetries, d.maxRetries, 0, 1000, true),
    retryInitialBackoffMs: bounded(
      '--retry-initial-backoff-ms',
      r.retryInitialBackoffMs,
      d.initialBackoffMs,
      0,
      3_600_000,
      true,
    ),
    retryMaxBackoffMs: bounded('--retry-max-backoff-ms', r.retryMaxBackoffMs, d.maxBackoffMs, 0, 3_600_000, true),
    retryBackoffMultiplier: bounded(
      '--retry-backoff-multiplier',
      r.retryBackoffMultiplier,
      d.backoffMultiplier,
      0,
      100,
      false,
    ),
    retryJitterFactor: bounded('--retry-jitter-factor', r.retryJitterFactor, d.jitterFactor, 0, 1, false),
    disableRetries: r.disableRetries ?? d.disabled,
  }
}

/** --cb-* and --disable-circuit-breaker (CircuitBreakerConfig). */
function breakerOptions(r: RouterUpOptions) {
  const d = CB_DEFAULTS
  return {
    cbFailureThreshold: bounded('--cb-failure-threshold', r.cbFailureThreshold, d.failureThreshold, 1, 1_000_000, true),
    cbSuccessThreshold: bounded('--cb-success-threshold', r.cbSuccessThreshold, d.successThreshold, 1, 1_000_000, true),
    cbTimeoutDurationS: bounded(
      '--cb-timeout-duration-secs',
      r.cbTimeoutDurationS,
      d.timeoutDurationS,
      0,
      86_400,
      true,
    ),
    cbWindowDurationS: bounded('--cb-window-duration-secs', r.cbWindowDurationS, d.windowDurationS, 0, 86_400, true),
    disableCircuitBreaker: r.disableCircuitBreaker ?? d.disabled,
  }
}
