import type {Engine} from '../engine.js'
import {isVllmMetricsText, vllmProcessTrees} from './detect.js'

/** vLLM with the NixlConnector (pull mode): the producer's deadline is the KV lease (lease-contract.ts). */
export const vllmEngine: Engine = {
  name: 'vllm',
  // A `vllm serve` line counts only with a VLLM::EngineCore under it (a shell naming the command is not a server).
  processesOf: rows =>
    vllmProcessTrees(rows)
      .filter(t => t.engineCores.length > 0)
      .flatMap(t => [t.server, ...t.engineCores, ...t.workers.map(w => w.process)]),
  metricsAreOurs: isVllmMetricsText,
  deadline: {
    kind: 'kv-lease',
    summary:
      'P pins a finished prefill for kv_lease_duration (default 30 s); each heartbeat from D extends it to ' +
      'now + duration*2//3; legacy: VLLM_NIXL_ABORT_REQUEST_TIMEOUT (480 s; 120 s before 2025-09-29)',
  },
  metrics: {
    names: [
      'vllm:num_requests_running',
      'vllm:num_requests_waiting',
      'vllm:kv_cache_usage_perc',
      'vllm:nixl_num_failed_transfers',
      'vllm:nixl_num_kv_expired_reqs',
    ],
    freshness: 'updated by the API server from the engine core each logging interval (not verified in source)',
  },
  releaseCauses: [
    {cause: 'read-notified', text: "D's READ notification (`<request id>:<consumers>`) frees P's blocks"},
    {cause: 'lease-expired', text: 'the reaper frees blocks whose lease expired (`_reap_expired_send_leases`)'},
  ],
}
