import {existsSync} from 'node:fs'
import {join} from 'node:path'

import {badInput} from '../lifecycle/sim-error.js'
import {legacyAbortTimeoutDefaultS, leaseParams} from './lease.js'

/** The vLLM twin's defects (and the names for some of them), switched on with `--vllm-bug`. */
export const VLLM_BUG_NAMES = [
  'reaper-head-block',
  'reaper-stops-at-first',
  'no-renew',
  'read-stall-forever',
  'no-lease',
  'lease-never-expires',
  'expire-early',
] as const
export type VllmBug = (typeof VLLM_BUG_NAMES)[number]

export type VllmRole = 'prefill' | 'decode'

export interface VllmUpOptions {
  stateDir: string
  host?: string
  /** The proxy's port; prefill +100, decode +200 (the toy proxy's 8000/8100/8200), NIXL data +300/+301. */
  basePort?: number
  /** VLLM_NIXL_SIDE_CHANNEL_PORT of prefill (dp index 0); decode's is one more. */
  sideChannelPort?: number
  /** kv_connector_extra_config.kv_lease_duration, seconds. */
  leaseDurationS?: number
  /** VLLM_NIXL_ABORT_REQUEST_TIMEOUT (legacy mode), seconds; default by --vllm-release-date. */
  abortRequestTimeoutS?: number
  version?: string
  /** The release date the twin states (YYYY-MM-DD): picks the legacy timeout's default. */
  releaseDate?: string
  bugs?: string[]
  tp?: number
  /** One forward step when a batch runs, ms; also the loop's period while anything is pending. */
  stepMs?: number
  prefillMsPerKToken?: number
  decodeMsPerToken?: number
  kvBytesPerToken?: number
  /** NIXL xferStallTimeout (nixl PR #2047, opt-in): seconds a READ may make no progress; 0 = off (NIXL's default). */
  xferStallTimeoutS?: number
  /** Where D's heartbeats and read notifications travel: the side channel, or each rank's data connection. */
  notifPath?: string
  /** VLLM_LOGGING_LEVEL in P's and D's environment (DEBUG by default: P logs its lease renewals). */
  logLevel?: string
  waitS?: number
}

export const VLLM_NOTIF_PATHS = ['side', 'data'] as const
export const VLLM_LOG_LEVELS = ['DEBUG', 'INFO'] as const
export type VllmLogLevel = (typeof VLLM_LOG_LEVELS)[number]
export type VllmNotifPath = (typeof VLLM_NOTIF_PATHS)[number]

export interface VllmTwinConfig {
  engine: 'vllm'
  stateDir: string
  host: string
  model: string
  version: string
  releaseDate: string
  /** prefillData: P's rank 0 data listener (rank k: + k, owned by VLLM::Worker_TP<k>); D's are ephemeral. */
  ports: {proxy: number; prefill: number; decode: number; prefillData: number}
  sideChannel: {prefill: number; decode: number}
  lease: {mode: 'lease' | 'legacy'; durationS: number; intervalS: number; extensionS: number; abortTimeoutS: number}
  bugs: VllmBug[]
  tp: number
  stepMs: number
  prefillMsPerKToken: number
  decodeMsPerToken: number
  kvBytesPerToken: number
  blockSize: number
  numBlocks: number
  xferStallTimeoutS: number
  notifPath: VllmNotifPath
  logLevel: VllmLogLevel
}

export const VLLM_DEFAULTS = {
  host: '127.0.0.1',
  basePort: 8000,
  sideChannelPort: 5600,
  leaseDurationS: 30,
  version: '0.22.0',
  releaseDate: '2026-11-01',
  tp: 1,
  stepMs: 20,
  prefillMsPerKToken: 40,
  decodeMsPerToken: 5,
  kvBytesPerToken: 4096,
  blockSize: 16,
  numBlocks: 4096,
  xferStallTimeoutS: 0,
  notifPath: 'side' as VllmNotifPath,
  logLevel: 'DEBUG' as VllmLogLevel,
  waitS: 30,
} as const

const positive = (name: string, v: number | undefined, min = 0): void => {
  if (v !== undefined && !(Number.isFinite(v) && v > min))
    throw badInput(`${name} must be a number above ${min}, got ${v}`, `pass e.g. ${name} 30`)
}

export function buildVllmConfig(o: VllmUpOptions): VllmTwinConfig {
  const bugs = [...new Set(o.bugs ?? [])]
  for (const b of bugs)
    if (!(VLLM_BUG_NAMES as readonly string[]).includes(b))
      throw badInput(`unknown --vllm-bug ${b}`, `use one of ${VLLM_BUG_NAMES.join(', ')}`)
  positive('--kv-lease-duration', o.leaseDurationS)
  positive('--abort-request-timeout', o.abortRequestTimeoutS)
  positive('--step-ms', o.stepMs)
  if (o.xferStallTimeoutS !== undefined && !(o.xferStallTimeoutS >= 0))
    throw badInput(`--xfer-stall-timeout must be 0 (off) or more seconds`, 'pass e.g. --xfer-stall-timeout 5')
  const notifPath = o.notifPath ?? VLLM_DEFAULTS.notifPath
  if (!(VLLM_NOTIF_PATHS as readonly string[]).includes(notifPath))
    throw badInput(`unknown --vllm-notif-path ${notifPath}`, `use one of ${VLLM_NOTIF_PATHS.join(', ')}`)
  const logLevel = (o.logLevel ?? VLLM_DEFAULTS.logLevel).toUpperCase()
  if (!(VLLM_LOG_LEVELS as readonly string[]).includes(logLevel))
    throw badInput(`unknown --vllm-log-level ${o.logLevel}`, `use one of ${VLLM_LOG_LEVELS.join(', ')}`)
  const tp = o.tp ?? VLLM_DEFAULTS.tp
  if (!(Number.isInteger(tp) && tp >= 1 && tp <= 64))
    throw badInput(`--vllm-tp must be a whole number from 1 to 64, got ${tp}`, 'pass e.g. --vllm-tp 2')
  const base = o.basePort ?? VLLM_DEFAULTS.basePort
  const side = o.sideChannelPort ?? VLLM_DEFAULTS.sideChannelPort
  if (!(base > 0 && base + 300 + tp < 65536) || !(side > 0 && side + 1 < 65536))
    throw badInput(`ports out of range (base ${base}, side channel ${side})`, 'pass --base-port 8000')
  const releaseDate = o.releaseDate ?? VLLM_DEFAULTS.releaseDate
  const lp = leaseParams(o.leaseDurationS ?? VLLM_DEFAULTS.leaseDurationS)
  const legacy = (bugs as string[]).includes('no-lease')
  return {
    engine: 'vllm',
    stateDir: o.stateDir,
    host: o.host ?? VLLM_DEFAULTS.host,
    model: 'pdchaos/twin-model',
    version: o.version ?? VLLM_DEFAULTS.version,
    releaseDate,
    ports: {proxy: base, prefill: base + 100, decode: base + 200, prefillData: base + 300},
    sideChannel: {prefill: side, decode: side + 1},
    lease: {
      mode: legacy ? 'legacy' : 'lease',
      ...lp,
      abortTimeoutS: o.abortRequestTimeoutS ?? legacyAbortTimeoutDefaultS(releaseDate),
    },
    bugs: bugs as VllmBug[],
    tp,
    stepMs: o.stepMs ?? VLLM_DEFAULTS.stepMs,
    prefillMsPerKToken: o.prefillMsPerKToken ?? VLLM_DEFAULTS.prefillMsPerKToken,
    decodeMsPerToken: o.decodeMsPerToken ?? VLLM_DEFAULTS.decodeMsPerToken,
    kvBytesPerToken: o.kvBytesPerToken ?? VLLM_DEFAULTS.kvBytesPerToken,
    blockSize: VLLM_DEFAULTS.blockSize,
    numBlocks: VLLM_DEFAULTS.numBlocks,
    xferStallTimeoutS: o.xferStallTimeoutS ?? VLLM_DEFAULTS.xferStallTimeoutS,
    notifPath: notifPath as VllmNotifPath,
    logLevel: logLevel as VllmLogLevel,
  }
}

/**
 * The data listener ports of a server's TP ranks: P's rank k at base + 300 + k (owned by its VLLM::Worker_TP<k>, or
 * the engine core at TP 1), D's ephemeral (0: never READ from in pull mode), as UCX's listeners are on a real host.
 */
export const dataPorts = (c: VllmTwinConfig, role: VllmRole): number[] =>
  Array.from({length: c.tp}, (_, k) => (role === 'prefill' ? c.ports.prefillData + k : 0))

/** Rank k's share of a request's KV bytes (each TP rank holds its heads' part of every block). */
export const rankShare = (bytes: number, tp: number, k: number): number =>
  Math.floor(bytes / tp) + (k < bytes % tp ? 1 : 0)

export const hasBug = (c: VllmTwinConfig, ...names: VllmBug[]): boolean => names.some(n => c.bugs.includes(n))

export const vllmPaths = (stateDir: string) => ({
  config: join(stateDir, 'vllm.json'),
  log: (s: VllmRole | 'router') => join(stateDir, 'logs', `${s}.log`),
  truth: (s: VllmRole | 'router') => join(stateDir, 'truth', `${s}.jsonl`),
  service: (s: VllmRole | 'router') => join(stateDir, 'services', `${s}.json`),
})

/** A state dir whose twin is the vLLM one (`sim status` dispatches on it); an SGLang `sim up` since wins. */
export const isVllmTwin = (stateDir: string): boolean =>
  existsSync(vllmPaths(stateDir).config) && !existsSync(join(stateDir, 'sim.json'))

/**
 * `--kv-transfer-config` exactly as the servers are launched with it (no spaces: one argv word). A build before the
 * lease (legacy, `no-lease`) is launched without kv_lease_duration: that key did not exist yet.
 */
export function kvTransferConfig(c: VllmTwinConfig): string {
  const extra: Record<string, unknown> = c.lease.mode === 'legacy' ? {} : {kv_lease_duration: c.lease.durationS}
  return JSON.stringify({kv_connector: 'NixlConnector', kv_role: 'kv_both', kv_connector_extra_config: extra})
}

/** The environment a server states in /proc/<pid>/environ, as a real vLLM server's. */
export function serverEnv(c: VllmTwinConfig, role: VllmRole): Record<string, string> {
  return {
    VLLM_NIXL_SIDE_CHANNEL_HOST: c.host,
    VLLM_NIXL_SIDE_CHANNEL_PORT: String(c.sideChannel[role]),
    VLLM_NIXL_ABORT_REQUEST_TIMEOUT: String(c.lease.abortTimeoutS),
    UCX_TLS: 'tcp',
    VLLM_LOGGING_LEVEL: c.logLevel ?? VLLM_DEFAULTS.logLevel,
  }
}

/** The `vllm serve` command line of a server (its process title). */
export function serveArgv(c: VllmTwinConfig, role: VllmRole): string[] {
  return [
    'vllm',
    'serve',
    c.model,
    '--host',
    c.host,
    '--port',
    String(c.ports[role]),
    '--tensor-parallel-size',
    String(c.tp),
    '--kv-transfer-config',
    kvTransferConfig(c),
  ]
}
