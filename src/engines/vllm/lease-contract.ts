import type {Sourced} from '../engine.js'

/**
 * vLLM's deadline model on the prefill side (pure arithmetic and sources; no I/O). Checked against vLLM's source
 * (vllm-project/vllm, stored copies; docs/twin-vllm.md lists them):
 * - `kv_lease_duration` from `kv_transfer_config.kv_connector_extra_config`, default 30
 *   (nixl/base_worker.py `NixlBaseConnectorWorker.__init__`: `get_from_extra_config("kv_lease_duration", 30)`);
 * - each heartbeat extends by `kv_lease_duration * 2 // 3` (same place, `self._lease_extension`), heartbeats every
 *   `kv_lease_duration // 6` (nixl/base_scheduler.py `__init__`, `self._heartbeat_interval`;
 *   docs/design/nixl_kv_cache_lease.md). One stored copy of nixl/worker.py has `max(kv_lease_duration // 6, 1)`;
 *   the scheduler's plain `// 6` is used here (a 0 s interval means "every step");
 * - before the lease (PR #41383), one timeout: `VLLM_NIXL_ABORT_REQUEST_TIMEOUT` (vllm/envs.py), 480 s since PR #25897
 *   (merged 2025-09-29), 120 s before;
 * - expired entries are reaped in the worker's `get_finished` (`_reap_expired_send_leases`), once per engine step, so
 *   a release lands in [expiry, expiry + one engine step + the reaper's interval].
 */

export const DEFAULT_LEASE_S = 30
export const LEGACY_ABORT_DEFAULT_S = 480
export const LEGACY_ABORT_DEFAULT_BEFORE_2025_09_29_S = 120

export interface LeaseContract {
  connector: Sourced<string> | undefined
  /** 'lease' when kv_lease_duration is on the command line (only lease-era code reads it); else not decidable here. */
  mode: 'lease' | 'unknown'
  leaseDurationS: Sourced<number>
  heartbeatIntervalS: Sourced<number>
  extensionS: Sourced<number>
  legacyAbortTimeoutS: Sourced<number>
  /** The release window after the last grant or heartbeat, in words (an engine step is not readable from outside). */
  window: string
}

const floorDiv = (a: number, b: number): number => Math.floor(a / b)

/** A positive finite number from a JSON value or an environment string. */
function positive(v: unknown): number | undefined {
  const n = typeof v === 'number' ? v : typeof v === 'string' && v.trim() !== '' ? Number(v) : Number.NaN
  return Number.isFinite(n) && n > 0 ? n : undefined
}

/** The lease contract of a vLLM server from its `--kv-transfer-config` (parsed) and its environment. */
export function leaseContract(
  config: Record<string, unknown> | undefined,
  env: Record<string, string> | undefined,
): LeaseContract {
  const extra = config?.kv_connector_extra_config
  const fromCmdline = positive((extra as Record<string, unknown> | undefined)?.kv_lease_duration)
  const d = fromCmdline ?? DEFAULT_LEASE_S
  const leaseDurationS: Sourced<number> =
    fromCmdline === undefined
      ? {value: d, source: 'default', detail: 'kv_lease_duration not in --kv-transfer-config; vLLM default 30'}
      : {value: d, source: 'cmdline', detail: '--kv-transfer-config kv_connector_extra_config.kv_lease_duration'}
  const abortEnv = positive(env?.VLLM_NIXL_ABORT_REQUEST_TIMEOUT)
  const connector = typeof config?.kv_connector === 'string' ? config.kv_connector : undefined
  return {
    connector:
      connector === undefined
        ? undefined
        : {value: connector, source: 'cmdline', detail: '--kv-transfer-config kv_connector'},
    mode: fromCmdline === undefined ? 'unknown' : 'lease',
    leaseDurationS,
    heartbeatIntervalS: {value: floorDiv(d, 6), source: 'derived', detail: 'kv_lease_duration // 6'},
    extensionS: {value: floorDiv(d * 2, 3), source: 'derived', detail: 'kv_lease_duration * 2 // 3'},
    legacyAbortTimeoutS:
      abortEnv === undefined
        ? {
            value: LEGACY_ABORT_DEFAULT_S,
            source: 'default',
            detail:
              env === undefined
                ? 'environment not readable; vLLM default 480 (120 before 2025-09-29)'
                : 'VLLM_NIXL_ABORT_REQUEST_TIMEOUT unset; vLLM default 480 (120 before 2025-09-29)',
          }
        : {value: abortEnv, source: 'env', detail: 'VLLM_NIXL_ABORT_REQUEST_TIMEOUT'},
    window: releaseWindow(d, floorDiv(d * 2, 3)),
  }
}

/** When P frees an unread request's blocks: without heartbeats, and after D's last heartbeat. */
export function releaseWindow(durationS: number, extensionS: number): string {
  return (
    `[grant + ${durationS} s, + one engine step + reaper interval] without heartbeats; ` +
    `[last heartbeat + ${extensionS} s, + one engine step + reaper interval] after one`
  )
}
