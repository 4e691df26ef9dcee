/**
 * The built-in suite (`pdchaos suite` without a file; suite/suite-file.ts defaultSuite validates it): stated here, next
 * to the faults it runs, so that no code in src/suite/ names a fault. A fault that belongs in it adds its scenarios
 * here.
 *
 * The built-in suite: the three faults on several GPUs, the gateway's breaker tripped, prefill restarted alone, then a
 * co-restart.
 */
export const BUILTIN_SUITE = {
  name: 'default',
  scenarios: [
    // Batch 1: one fault per prefill GPU, all in one window (the abort window is widened on GPU 0's KV connections).
    // `auto` mechanisms: the host's packet filter where one is usable, else (on the twin only) its own failure points.
    {name: 'stall-kv gpu1', fault: 'stall-kv', params: {gpu: 1}, pins: 2},
    {name: 'stall-kv gpu2', fault: 'stall-kv', params: {gpu: 2}, pins: 2},
    {name: 'stall-kv gpu3', fault: 'stall-kv', params: {gpu: 3}, pins: 2},
    {name: 'abort-mid-transfer gpu0', fault: 'abort-mid-transfer', params: {gpu: 0, trials: 6}},
    // Aborts on prefill alone: its own abort path, with no ABORT from decode to rescue a Transferring request (a
    // decode restarted, a backend or release without it). Same GPU as the set above: a batch of its own.
    {
      name: 'abort-mid-transfer gpu0 prefill',
      fault: 'abort-mid-transfer',
      params: {gpu: 0, trials: 6, side: 'prefill'},
    },
    // Batch 2: decode's destination info lost to one prefill rank at a time, each rank its own scenario.
    {name: 'drop-dest-info rank0', fault: 'drop-dest-info', params: {rank: 0}, pins: 2},
    {name: 'drop-dest-info rank1', fault: 'drop-dest-info', params: {rank: 1}, pins: 2},
    {name: 'drop-dest-info rank2', fault: 'drop-dest-info', params: {rank: 2}, pins: 2},
    {name: 'drop-dest-info rank3', fault: 'drop-dest-info', params: {rank: 3}, pins: 2},
    // Batch 3, alone: prefill refuses the gateway until its breaker opens; requests must then get 503 at once (SGLang
    // #31206).
    {name: 'trip-breaker prefill', fault: 'trip-breaker', params: {role: 'prefill'}},
    // Alone: prefill killed while decode holds halves of requests in its transfer queue (SGLang issue 30, item 2):
    // decode must release them within its heartbeat bound.
    {name: 'kill-prefill', fault: 'kill-prefill', params: {instance: true}},
    // Prefill replaced alone behind its address (SGLang #34289): decode must drop the old endpoints within its
    // heartbeat bound.
    {name: 'restart prefill alone', restart: {only: 'prefill'}},
    {name: 'co-restart', restart: {services: ['prefill', 'decode', 'router'], watchSeconds: 3, canaries: 2}},
  ],
  stop: {routerUnhealthySeconds: 30, kernelXid: true},
}
