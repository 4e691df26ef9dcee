import type {Engine} from '../engine.js'
import {ENGINE_CORE_TITLE, isVllmMetricsText, isVllmServer, WORKER_TITLE} from './detect.js'

/** vLLM with the NixlConnector (pull mode): the producer's deadline is the KV lease (lease-contract.ts). */
export const vllmEngine: Engine = {
  name: 'vllm',
  processesOf: rows =>
    rows.filter(r => isVllmServer(r.args) || ENGINE_CORE_TITLE.test(r.args) || WORKER_TITLE.test(r.args)),
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
