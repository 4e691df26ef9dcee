import {describe, expect, it} from 'vitest'

import {enginesIn} from '../../src/engines/registry.js'
import {isVllmMetricsText, kvTransferConfig, vllmProcessTrees} from '../../src/engines/vllm/detect.js'
import {leaseContract} from '../../src/engines/vllm/lease-contract.js'

const CFG = '{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_connector_extra_config":{"kv_lease_duration":12}}'
const PS = [
  {pid: 10, ppid: 1, args: `/usr/bin/python3 /usr/local/bin/vllm serve m --port 8100 --kv-transfer-config ${CFG}`},
  {pid: 11, ppid: 10, args: 'VLLM::EngineCore'},
  {pid: 13, ppid: 11, args: 'VLLM::Worker_TP1'},
  {pid: 12, ppid: 11, args: 'VLLM::Worker_TP0'},
  {pid: 20, ppid: 1, args: 'sglang::scheduler_TP1'},
  {pid: 30, ppid: 1, args: 'bash -c echo vllm serve'},
]

describe('vLLM detection', () => {
  it('finds the API server with its engine core and TP workers in rank order', () => {
    const [t, echo, ...rest] = vllmProcessTrees(PS)
    expect(rest).toHaveLength(0)
    // A shell that only names `vllm serve` has no engine core under it: not confirmed as vLLM.
    expect(echo!.server.pid).toBe(30)
    expect(echo!.engineCores).toEqual([])
    expect(t!.server.pid).toBe(10)
    expect(t!.engineCores.map(e => e.pid)).toEqual([11])
    expect(t!.workers.map(w => [w.tpRank, w.process.pid])).toEqual([
      [0, 12],
      [1, 13],
    ])
  })
  it('reads titles under another VLLM_PROCESS_NAME_PREFIX, but only under a vllm server', () => {
    const rows = [
      {pid: 10, ppid: 1, args: 'vllm serve m --port 9000'},
      {pid: 11, ppid: 10, args: 'ACME::EngineCore'},
      {pid: 12, ppid: 11, args: 'ACME::Worker_TP0'},
      {pid: 40, ppid: 1, args: 'OTHER::EngineCore'},
    ]
    const trees = vllmProcessTrees(rows)
    expect(trees.map(t => [t.server.pid, t.engineCores.map(e => e.pid), t.workers.map(w => w.process.pid)])).toEqual([
      [10, [11], [12]],
    ])
  })
  it('tells the engines apart from a process list', () => {
    expect(enginesIn(PS)).toEqual(['sglang', 'vllm'])
    expect(enginesIn(PS.filter(r => r.pid !== 20))).toEqual(['vllm'])
    expect(enginesIn([{pid: 1, ppid: 0, args: 'init'}])).toEqual([])
    expect(enginesIn(PS.filter(r => r.pid === 30))).toEqual([])
  })
  it('reads --kv-transfer-config in both spellings and reports a bad one', () => {
    expect(kvTransferConfig(['vllm', 'serve', '--kv-transfer-config', CFG])).toMatchObject({
      kv_connector: 'NixlConnector',
    })
    expect(kvTransferConfig(['vllm', 'serve', `--kv-transfer-config=${CFG}`])).toMatchObject({kv_role: 'kv_both'})
    expect(kvTransferConfig(['vllm', 'serve', '--kv-transfer-config', '{oops'])).toMatch(/^not JSON/)
    expect(kvTransferConfig(['vllm', 'serve'])).toBeUndefined()
  })
  it("recognises vLLM's metrics text and not SGLang's", () => {
    expect(isVllmMetricsText('# HELP x\nvllm:num_requests_running{engine="0"} 0\n')).toBe(true)
    expect(isVllmMetricsText('sglang:num_running_reqs 0\n')).toBe(false)
  })
})

describe('the lease contract', () => {
  it('takes kv_lease_duration from the command line and derives interval and extension by floor division', () => {
    const c = leaseContract(JSON.parse(CFG), {VLLM_NIXL_ABORT_REQUEST_TIMEOUT: '90'})
    expect(c.mode).toBe('lease')
    expect(c.leaseDurationS).toMatchObject({value: 12, source: 'cmdline'})
    expect(c.heartbeatIntervalS).toMatchObject({value: 2, source: 'derived'})
    expect(c.extensionS).toMatchObject({value: 8, source: 'derived'})
    expect(c.legacyAbortTimeoutS).toMatchObject({value: 90, source: 'env'})
    expect(c.connector).toMatchObject({value: 'NixlConnector', source: 'cmdline'})
  })
  it("falls back to vLLM's defaults and says so", () => {
    const c = leaseContract({kv_connector: 'NixlConnector'}, {})
    expect(c.mode).toBe('unknown')
    expect(c.leaseDurationS).toMatchObject({value: 30, source: 'default'})
    expect([c.heartbeatIntervalS.value, c.extensionS.value]).toEqual([5, 20])
    expect(c.legacyAbortTimeoutS).toMatchObject({value: 480, source: 'default'})
    // 31 // 6 = 5 and 31 * 2 // 3 = 20 (Python floor division)
    const odd = leaseContract({kv_connector_extra_config: {kv_lease_duration: 31}}, undefined)
    expect([odd.heartbeatIntervalS.value, odd.extensionS.value]).toEqual([5, 20])
    expect(odd.legacyAbortTimeoutS.detail).toMatch(/not readable/)
  })
})
