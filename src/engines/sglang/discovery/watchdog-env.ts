import type {Watchdog} from '../../../deployment/config.js'

/**
 * The watchdog and SGLang PD timeouts as a scheduler process's environment sets them, compared with the
 * deployment file's contract: a disagreement means pdchaos would judge the watchdog by the wrong deadline.
 */

export const WATCHDOG_ENV = {
  scope: 'SGLANG_DISAGGREGATION_WATCHDOG_SCOPE',
  deadline: 'SGLANG_DISAGGREGATION_WATCHDOG_TIMEOUT',
  poll: 'SGLANG_DISAGGREGATION_WATCHDOG_POLL_INTERVAL',
} as const

export const TIMEOUT_ENV = {
  bootstrapTimeout: 'SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT',
  waitingTimeout: 'SGLANG_DISAGGREGATION_WAITING_TIMEOUT',
  heartbeatInterval: 'SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL',
  heartbeatMaxFailure: 'SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE',
} as const

/** SGLang's defaults (python/sglang/srt/environ.py) for variables a process leaves unset. */
export const TIMEOUT_DEFAULTS = {
  bootstrapTimeout: 300,
  waitingTimeout: 300,
  heartbeatInterval: 5,
  heartbeatMaxFailure: 2,
}

export interface EnvWatchdog {
  scope?: string
  deadlineSeconds?: number
  pollSeconds?: number
}

export interface EnvTimeouts {
  bootstrapTimeout: number
  waitingTimeout: number
  heartbeatInterval: number
  heartbeatMaxFailure: number
}

const num = (v: string | undefined): number | undefined => {
  if (v === undefined || v.trim() === '') return undefined
  const n = Number(v)
  return Number.isFinite(n) ? n : undefined
}

export function watchdogFromEnv(env: Record<string, string>): EnvWatchdog {
  return {
    scope: env[WATCHDOG_ENV.scope],
    deadlineSeconds: num(env[WATCHDOG_ENV.deadline]),
    pollSeconds: num(env[WATCHDOG_ENV.poll]),
  }
}

export function timeoutsFromEnv(env: Record<string, string>): EnvTimeouts {
  return {
    bootstrapTimeout: num(env[TIMEOUT_ENV.bootstrapTimeout]) ?? TIMEOUT_DEFAULTS.bootstrapTimeout,
    waitingTimeout: num(env[TIMEOUT_ENV.waitingTimeout]) ?? TIMEOUT_DEFAULTS.waitingTimeout,
    heartbeatInterval: num(env[TIMEOUT_ENV.heartbeatInterval]) ?? TIMEOUT_DEFAULTS.heartbeatInterval,
    heartbeatMaxFailure: num(env[TIMEOUT_ENV.heartbeatMaxFailure]) ?? TIMEOUT_DEFAULTS.heartbeatMaxFailure,
  }
}

/**
 * Each SGLang timeout from the process that owns it (SGLang reads each in one role only, common/conn.py
 * CommonKVManager.__init__): the bootstrap timeout from prefill's environment (the sender's), the waiting timeout and
 * the heartbeat from decode's (the receiver's). A role whose environment could not be read gives SGLang's defaults,
 * and `sources` says so.
 */
export function timeoutsFromServices(env: {
  prefill?: Record<string, string>
  decode?: Record<string, string>
}): EnvTimeouts & {sources: Record<keyof EnvTimeouts, string>} {
  const from = (role: 'prefill' | 'decode', key: keyof EnvTimeouts) => {
    const e = env[role]
    const v = e === undefined ? undefined : num(e[TIMEOUT_ENV[key]])
    const source =
      e === undefined
        ? `SGLang's default (${role}'s environment not read)`
        : v === undefined
          ? `SGLang's default (unset in ${role}'s environment)`
          : `${role}'s environment (${TIMEOUT_ENV[key]})`
    return {value: v ?? TIMEOUT_DEFAULTS[key], source}
  }
  const b = from('prefill', 'bootstrapTimeout')
  const w = from('decode', 'waitingTimeout')
  const i = from('decode', 'heartbeatInterval')
  const f = from('decode', 'heartbeatMaxFailure')
  return {
    bootstrapTimeout: b.value,
    waitingTimeout: w.value,
    heartbeatInterval: i.value,
    heartbeatMaxFailure: f.value,
    sources: {
      bootstrapTimeout: b.source,
      waitingTimeout: w.source,
      heartbeatInterval: i.source,
      heartbeatMaxFailure: f.source,
    },
  }
}

/** Human warnings where the process environment and the deployment file's watchdog contract disagree. */
export function watchdogWarnings(
  fromEnv: EnvWatchdog,
  contract: Watchdog,
  timeouts: EnvTimeouts,
  where: string,
): string[] {
  const w: string[] = []
  if (fromEnv.scope !== undefined && fromEnv.scope !== contract.scope) {
    w.push(
      `${where}: watchdog scope is ${fromEnv.scope} (${WATCHDOG_ENV.scope}) but the deployment file ` +
        `says ${contract.scope}`,
    )
  }
  if (fromEnv.deadlineSeconds !== undefined && fromEnv.deadlineSeconds !== contract.deadlineSeconds) {
    w.push(
      `${where}: watchdog deadline is ${fromEnv.deadlineSeconds}s (${WATCHDOG_ENV.deadline}) but the deployment ` +
        `file says ${contract.deadlineSeconds}s`,
    )
  }
  if (fromEnv.pollSeconds !== undefined && fromEnv.pollSeconds !== contract.pollSeconds) {
    w.push(
      `${where}: watchdog poll interval is ${fromEnv.pollSeconds}s (${WATCHDOG_ENV.poll}) but the deployment file ` +
        `says ${contract.pollSeconds}s`,
    )
  }
  if (fromEnv.scope === undefined && fromEnv.deadlineSeconds === undefined && contract.scope !== 'off') {
    w.push(`${where}: no watchdog settings in the scheduler environment; judging by the deployment file alone`)
  }
  // SGLang's own timeouts release pins too; a watchdog deadline above them is never the thing that evicts. Each is
  // named with the service whose environment sets it.
  const releaseBy = Math.min(timeouts.waitingTimeout, timeouts.bootstrapTimeout)
  if (contract.scope !== 'off' && contract.deadlineSeconds + contract.pollSeconds >= releaseBy) {
    const which = [
      ...(timeouts.waitingTimeout <= contract.deadlineSeconds + contract.pollSeconds
        ? [`decode's SGLANG_DISAGGREGATION_WAITING_TIMEOUT ${timeouts.waitingTimeout}s`]
        : []),
      ...(timeouts.bootstrapTimeout <= contract.deadlineSeconds + contract.pollSeconds
        ? [`prefill's SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT ${timeouts.bootstrapTimeout}s`]
        : []),
    ]
    w.push(
      `${where}: watchdog deadline + poll ${contract.deadlineSeconds + contract.pollSeconds}s is not below ` +
        `SGLang's own timeouts (${which.join(', ')}): it would release pins before the watchdog could, so an ` +
        `experiment whose pins it can release is refused (exit 2) unless --allow-competing-timeout; raise them ` +
        `above it`,
    )
  }
  return w
}
