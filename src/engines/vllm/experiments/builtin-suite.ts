import type {VllmFaultOptions} from './experiment.js'

/**
 * The built-in vLLM suite (`pdchaos suite --sim --engine vllm`, or `pdchaos suite -c <engine: vllm file>`): each
 * entry is a registered vLLM experiment (registry.ts) with the options a user would give `inject`, run in this order,
 * one at a time (every entry waits P's KV lease out, and two at once would share P's reaper and its log), then the
 * co-restart (prefill, decode, proxy; restart/vllm-co-restart.ts) as SGLang's built-in suite ends. Adding a fault to
 * the suite is one entry here, after its experiment is registered.
 */

export interface VllmSuiteEntry {
  /** A fault registered in registry.ts. */
  fault: string
  options: VllmFaultOptions
}

export interface VllmSuite {
  name: string
  entries: VllmSuiteEntry[]
  /** End with the co-restart (prefill, decode, proxy behind their gates, then canaries through the proxy). */
  coRestart: boolean
}

export const VLLM_BUILTIN_SUITE: VllmSuite = {
  name: 'builtin-vllm',
  entries: [
    // Two P-only requests: both must be freed at grant + kv_lease_duration (checks/kv-lease.ts).
    {fault: 'drop-dest-info', options: {requests: 2}},
    // D's READ held while D heartbeats: P's blocks must be freed once the READ fails (NIXL's stall timeout), never
    // pinned for good (checks/kv-pinned.ts).
    {fault: 'stall-kv', options: {requests: 2}},
    // A client abort during the READ: D stops renewing; P frees at lease expiry (checks/kv-lease-abort.ts).
    {fault: 'abort-mid-transfer', options: {requests: 2}},
    // D's engine stopped: heartbeats stop; P frees within the extension of the last renewal (checks/kv-wedge.ts).
    {fault: 'wedge-rank', options: {requests: 2, side: 'decode'}},
    // Last: it kills D, and its revert and the co-restart bring D back.
    {fault: 'kill-decode', options: {requests: 2}},
  ],
  coRestart: true,
}
