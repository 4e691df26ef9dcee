import {SIM_ENV, type Backend, type WatchdogScope} from '../sim-config.js'

/**
 * What the server reads from its environment, as SGLang does (so /proc/<pid>/environ tells the truth):
 * the disaggregation timeouts, the heartbeat, the transfer backend and the watchdog under test.
 */
export interface EnvSettings {
  bootstrapTimeoutS: number
  waitingTimeoutS: number
  heartbeatIntervalS: number
  heartbeatMaxFailure: number
  backend: Backend
  watchdog: {scope: WatchdogScope; deadlineS: number; pollS: number}
}

function num(env: NodeJS.ProcessEnv, name: string, fallback: number): number {
  const raw = env[name]
  if (raw === undefined || raw.trim() === '') return fallback
  const v = Number(raw)
  return Number.isFinite(v) ? v : fallback
}

export function readEnvSettings(env: NodeJS.ProcessEnv = process.env): EnvSettings {
  const scope = env[SIM_ENV.watchdogScope]
  const backend = env[SIM_ENV.backend]
  return {
    bootstrapTimeoutS: num(env, SIM_ENV.bootstrapTimeout, 300),
    waitingTimeoutS: num(env, SIM_ENV.waitingTimeout, 300),
    // SGLang clamps these (environ.py): interval >= 2 s, failures >= 1.
    heartbeatIntervalS: Math.max(2, num(env, SIM_ENV.heartbeatInterval, 5)),
    heartbeatMaxFailure: Math.max(1, Math.floor(num(env, SIM_ENV.heartbeatMaxFailure, 2))),
    backend: backend === 'mooncake' ? 'mooncake' : 'nixl',
    watchdog: {
      scope: scope === 'inflight' || scope === 'off' ? scope : 'all',
      deadlineS: num(env, SIM_ENV.watchdogTimeout, 300),
      // The twin's own copy of the shortest poll (it imports no CLI code); contract's: limits.ts MIN_POLL_SECONDS
      pollS: Math.max(0.01, num(env, SIM_ENV.watchdogPollInterval, 1)),
    },
  }
}
