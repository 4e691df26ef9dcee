import {describe, expect, it} from 'vitest'

import {DeploymentSchema} from '../../src/deployment/config.js'
import {discover} from '../../src/engines/sglang/discovery/discover.js'
import {answered, answeringHost} from '../hosts/answering-host.js'

/**
 * Node rank 1 of a real SGLang prefill over two nodes (TP 16), as `ps` shows it on that node: the launch command with
 * --nnodes 2 --node-rank 1, its eight schedulers titled with their global TP rank (TP8..TP15). An SGLang from before
 * the stand-in health endpoint listens on nothing there, and an unprivileged `ss` names no owner anyway; nvidia-smi is
 * absent (a container). Discovery must still find the schedulers (by the launch command's mode and port) and give
 * each its GPU on this node: tp_rank % 8.
 */
const PS = [
  '    1     0 Ss   /sbin/init',
  ' 4100     1 Sl   python3 -m sglang.launch_server --model-path /models/ds --disaggregation-mode prefill ' +
    '--tp-size 16 --nnodes 2 --node-rank 1 --dist-init-addr 10.0.0.1:5000 --host 0.0.0.0 --port 30000',
  ...Array.from({length: 8}, (_, i) => ` ${4101 + i}  4100 Sl   sglang::scheduler_TP${8 + i}`),
  // Another deployment's server on this node (another port): not this instance's.
  ' 5100     1 Sl   python3 -m sglang.launch_server --disaggregation-mode prefill --tp-size 1 --port 31000',
  ' 5101  5100 Sl   sglang::scheduler_TP0',
].join('\n')

/** Node rank 1's host: its process table; every other tool answers nothing, and anything else is not installed. */
const nodeRankOneHost = answeringHost('gpu-b', argv => {
  if (argv[0] === 'ps') return answered(PS)
  if (argv[0] === 'true' || argv[0] === 'ss' || argv[0] === 'cat' || argv[0] === 'sh') return answered()
  return {code: 127, stdout: '', stderr: `${argv[0]}: not found`, durationMs: 1}
})

describe('discovery on node rank 1 of a multi-node instance', () => {
  it(
    "finds its schedulers by the launch command, each on this node's GPU tp_rank % tp_per_node, and expects 8 of " +
      '16 here',
    async () => {
      // The HTTP answers do not matter here (the instance's URL is node rank 0's, elsewhere; discovery's probes are
      // soft):
      // the launch command alone places the ranks, and it wins over server_info where both speak.
      const deployment = DeploymentSchema.parse({
        host: {kind: 'local'},
        stateDir: '/tmp/pdchaos-multinode-discovery',
        services: {
          prefill: {url: 'http://127.0.0.1:30000'},
          decode: {url: 'http://127.0.0.1:1'},
          router: {url: 'http://127.0.0.1:1'},
        },
        watchdog: {deadlineSeconds: 2, pollSeconds: 0.5},
        probeTimeoutSeconds: 1,
      })
      const r = await discover(deployment, nodeRankOneHost, {timeoutMs: 1000, here: ['prefill']})
      expect(r.ranks.map(k => [k.service, k.tpRank, k.pid, k.gpu])).toEqual(
        Array.from({length: 8}, (_, i) => ['prefill', 8 + i, 4101 + i, i]),
      )
      expect(r.ranks[5]!.gpuSource).toBe('gpu_id 5 (base-gpu-id 0 + TP13)')
      expect(r.services.prefill.launch?.args).toMatchObject({
        nnodes: 2,
        nodeRank: 1,
        distInitAddr: '10.0.0.1:5000',
        tpSize: 16,
      })
      expect(r.warnings.filter(w => /scheduler processes/.test(w))).toEqual([])
    },
  )
})
