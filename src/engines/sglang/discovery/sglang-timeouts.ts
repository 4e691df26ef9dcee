import {heartbeatBound, type HeartbeatSettings} from './heartbeat-bound.js'
import {TIMEOUT_DEFAULTS, TIMEOUT_ENV} from './watchdog-env.js'

/**
 * SGLang's own PD timeouts as the servers run them: the one typed place every part of pdchaos reads them from
 * (status, the plan-time refusal, the eviction check's candidates, the heartbeat judgement of a restart).
 *
 * Each is read from the process that reads it upstream (common/conn.py CommonKVManager.__init__: the prefill branch
 * reads only the bootstrap timeout, the decode branch the waiting timeout and the heartbeat): its environment
 * (/proc/PID/environ, a scheduler's first, since the scheduler process is the reader, else its server's), else a
 * `NAME=value` word on its launch command (a wrapper that sets it inline), else SGLang's default for the version
 * found (python/sglang/srt/environ.py, class Envs, "PD disaggregation runtime": BOOTSTRAP_TIMEOUT EnvInt(300),
 * HEARTBEAT_INTERVAL EnvFloat(5.0), HEARTBEAT_MAX_FAILURE EnvInt(2), WAITING_TIMEOUT EnvInt(300); the same in every
 * stored version read, ~372-412 at 8905cbd4).
 *
 * The NIXL sender had no bootstrap timeout until PR #34692 (merged 2026-08-13): NixlKVSender.poll (nixl/conn.py
 * ~2512 at 8905cbd4, between v0.5.15 and v0.5.16) only returns check_status. Which release first carries the PR is
 * not confirmed here, so only a version at or below 0.5.15 counts as without it; a later or unknown one is taken to
 * have it (a timeout that may fire is a candidate; assuming one away could pass a release it made).
 */

export type TimeoutFrom = 'env' | 'launch-command' | 'default' | 'not-in-force'

export interface TimeoutSetting {
  /** The seconds after which SGLang releases the request; null: not in force (this backend and version have none). */
  seconds: number | null
  /** The variable SGLang reads (for the heartbeat: interval × max failures). */
  setting: string
  /** The role whose processes read it. */
  role: 'prefill' | 'decode'
  from: TimeoutFrom
  /** Where it was read, for people: "the environment of pid 4242, decode scheduler TP0", "SGLang's default …". */
  source: string
  pid?: number
  /** The reader's environment was read (a default then means: unset there, so SGLang uses its default). */
  envRead?: boolean
}

export interface HeartbeatSetting extends TimeoutSetting {
  intervalSeconds: number
  maxFailure: number
}

export interface SglangTimeouts {
  /** SGLang's version (prefill's server_info), when it states one. */
  version?: string
  versionSource: string
  /** The KV transfer backend the prefill server states (nixl, mooncake, …), else the deployment file's. */
  backend?: string
  /** Prefill's sender, while a room is still Bootstrapping (common/conn.py CommonKVSender._check_bootstrap_timeout). */
  bootstrap: TimeoutSetting
  /** Decode's receiver, from send_metadata on (common/conn.py CommonKVReceiver._check_waiting_timeout); then ABORT. */
  waiting: TimeoutSetting
  /** Decode's heartbeat to prefill's bootstrap server: the earliest a node failure is declared (interval × misses). */
  heartbeat: HeartbeatSetting
}

/** One role's environment, where it was read (a scheduler's or its server's). */
export interface EnvRead {
  pid: number
  what: string
  env: Record<string, string>
}

/** What discovery read of one role: its environment, and `NAME=value` words on its launch command (or parents'). */
export interface RoleReads {
  env?: EnvRead
  launch?: {pid: number; vars: Record<string, string>}
}

const num = (v: string | undefined): number | undefined => {
  if (v === undefined || v.trim() === '') return undefined
  const n = Number(v)
  return Number.isFinite(n) ? n : undefined
}

/** `NAME=value` words of SGLang's PD variables on a command line (`env SGLANG_…=3 python -m sglang.launch_server`) */
export function launchVarsOf(args: string): Record<string, string> {
  const out: Record<string, string> = {}
  for (const w of args.trim().split(/\s+/)) {
    const m = /^(SGLANG_DISAGGREGATION_[A-Z_]+)=(\S+)$/.exec(w.replace(/^['"]|['"]$/g, ''))
    if (m) out[m[1]!] = m[2]!
  }
  return out
}

/** Numeric parts of a version string ("0.5.16rc1" → [0, 5, 16]); undefined when it has none. */
function versionParts(v: string): number[] | undefined {
  const m = /^v?(\d+)(?:\.(\d+))?(?:\.(\d+))?/.exec(v.trim())
  return m ? [Number(m[1]), Number(m[2] ?? 0), Number(m[3] ?? 0)] : undefined
}

/** a <= b, by their first three numeric parts (undefined: a is not a version). */
export function versionAtMost(a: string, b: string): boolean | undefined {
  const x = versionParts(a)
  const y = versionParts(b)
  if (!x || !y) return undefined
  for (let i = 0; i < 3; i++) if (x[i] !== y[i]) return x[i]! < y[i]!
  return true
}

/** The last release known to ship the NIXL sender without a bootstrap timeout (the July 2026 snapshot is after it). */
export const NIXL_WITHOUT_BOOTSTRAP_TIMEOUT_UP_TO = '0.5.15'

type Role = 'prefill' | 'decode'

interface Read {
  value: number
  from: TimeoutFrom
  source: string
  pid?: number
  envRead: boolean
}

function read(role: Role, r: RoleReads | undefined, name: string, version: string | undefined, fallback: number): Read {
  const envRead = r?.env !== undefined
  const fromEnv = num(r?.env?.env[name])
  if (fromEnv !== undefined) {
    const source = `the environment of pid ${r!.env!.pid}, ${r!.env!.what}`
    return {value: fromEnv, from: 'env', source, pid: r!.env!.pid, envRead}
  }
  const fromLaunch = num(r?.launch?.vars[name])
  if (fromLaunch !== undefined) {
    const source = `the launch command of pid ${r!.launch!.pid}`
    return {value: fromLaunch, from: 'launch-command', source, pid: r!.launch!.pid, envRead}
  }
  const unread = r?.env
    ? `unset in the environment of pid ${r.env.pid}, ${r.env.what}`
    : `${role}'s environment not read`
  const which = version ? `version ${version}` : 'an unknown version'
  return {value: fallback, from: 'default', envRead, source: `SGLang's default for ${which} (environ.py; ${unread})`}
}

/** Each SGLang timeout from the role that reads it, with where it was read. */
export function sglangTimeoutsOf(o: {
  prefill?: RoleReads
  decode?: RoleReads
  version?: string
  versionSource?: string
  backend?: string
}): SglangTimeouts {
  const v = o.version
  const b = read('prefill', o.prefill, TIMEOUT_ENV.bootstrapTimeout, v, TIMEOUT_DEFAULTS.bootstrapTimeout)
  const nixlWithout =
    o.backend === 'nixl' && v !== undefined && versionAtMost(v, NIXL_WITHOUT_BOOTSTRAP_TIMEOUT_UP_TO) === true
  const unknownNixl =
    o.backend === 'nixl' && v === undefined
      ? '; the version is unknown, so the NIXL sender is taken to have it (PR #34692)'
      : ''
  const bootstrap: TimeoutSetting = nixlWithout
    ? {
        seconds: null,
        setting: TIMEOUT_ENV.bootstrapTimeout,
        role: 'prefill',
        from: 'not-in-force',
        source:
          `not in force: SGLang ${v}'s NIXL sender has no bootstrap timeout (NixlKVSender.poll, nixl/conn.py; ` +
          `added by PR #34692, ` +
          `2026-08-13)${b.from === 'default' ? '' : `; ${b.value} s set in ${b.source} is not read`}`,
      }
    : {
        seconds: b.value,
        setting: TIMEOUT_ENV.bootstrapTimeout,
        role: 'prefill',
        from: b.from,
        source: b.source + unknownNixl,
        ...(b.pid === undefined ? {} : {pid: b.pid}),
        envRead: b.envRead,
      }
  const w = read('decode', o.decode, TIMEOUT_ENV.waitingTimeout, v, TIMEOUT_DEFAULTS.waitingTimeout)
  const i = read('decode', o.decode, TIMEOUT_ENV.heartbeatInterval, v, TIMEOUT_DEFAULTS.heartbeatInterval)
  const f = read('decode', o.decode, TIMEOUT_ENV.heartbeatMaxFailure, v, TIMEOUT_DEFAULTS.heartbeatMaxFailure)
  // SGLang clamps both (common/conn.py: max(interval, 2.0), max(failures, 1)): heartbeat-bound.ts.
  const {intervalSeconds, maxFailure} = heartbeatBound(i.value, f.value)
  const either = (x: TimeoutFrom) => i.from === x || f.from === x
  const hbFrom: TimeoutFrom = either('env') ? 'env' : either('launch-command') ? 'launch-command' : 'default'
  return {
    ...(v === undefined ? {} : {version: v}),
    versionSource: o.versionSource ?? (v === undefined ? 'not stated by the servers' : "prefill's server_info"),
    ...(o.backend === undefined ? {} : {backend: o.backend}),
    bootstrap,
    waiting: {
      seconds: w.value,
      setting: TIMEOUT_ENV.waitingTimeout,
      role: 'decode',
      from: w.from,
      source: w.source,
      ...(w.pid === undefined ? {} : {pid: w.pid}),
      envRead: w.envRead,
    },
    heartbeat: {
      seconds: intervalSeconds * maxFailure,
      role: 'decode',
      from: hbFrom,
      setting: `${TIMEOUT_ENV.heartbeatInterval} × ${TIMEOUT_ENV.heartbeatMaxFailure}`,
      source: `interval ${intervalSeconds} s from ${i.source}; ${maxFailure} misses from ${f.source}`,
      intervalSeconds,
      maxFailure,
      envRead: i.envRead && f.envRead,
      ...((i.pid ?? f.pid) === undefined ? {} : {pid: (i.pid ?? f.pid)!}),
    },
  }
}

/**
 * Decode's heartbeat bound as a restart is judged against it (watchdog.heartbeat, FaultDiscovery.heartbeat), from
 * the same reading as sglangTimeouts.heartbeat: known only where decode's environment was read (else unknown, not
 * SGLang's default).
 */
export function heartbeatSettingsOf(h: HeartbeatSetting): HeartbeatSettings | undefined {
  if (!h.envRead) return undefined
  return {...heartbeatBound(h.intervalSeconds, h.maxFailure), source: h.source}
}
