import {describe, expect, it} from 'vitest'

import {leaseContract} from '../../../src/engines/vllm/lease-contract.js'
import {
  heartbeatsSeen,
  renderVllmStallPlan,
  sideChannelBytesIn,
  vllmStallPlan,
  vllmStallScenario,
} from '../../../src/engines/vllm/faults/stall-kv.js'
import {runExitCode} from '../../../src/model/run.js'

const config = (extra?: Record<string, unknown>) => ({
  kv_connector: 'NixlConnector',
  kv_role: 'kv_both',
  ...(extra ? {kv_connector_extra_config: extra} : {}),
})

describe('stall-kv on vLLM: the plan', () => {
  it("observes until answered + 2 x duration + extension + slack, from P's lease settings with their sources", () => {
    const p = vllmStallPlan(leaseContract(config({kv_lease_duration: 30}), {}), {
      requests: 2,
      logFile: '/var/log/p.log',
      problems: [],
    })
    if ('refusal' in p) throw new Error(p.refusal)
    // 2 x 30 s + extension 20 s + step 500 ms + reaper 500 ms + the log's 1 s + 0.5 s of reading
    expect(p.observeAfterLastAnswerMs).toBe(80_000 + 2500)
    expect(p.afterRevertMs).toBe(60_000)
    const text = renderVllmStallPlan(p, ['READ stall: nft ...']).join('\n')
    expect(text).toContain('kv_lease_duration 30 s (cmdline')
    expect(text).toContain('heartbeat interval 5 s')
    expect(text).toContain('1 bystander')
    expect(text).toContain('READ stall: nft ...')
  })

  it('refuses a P without kv_lease_duration on its command line (lease or legacy cannot be told)', () => {
    const p = vllmStallPlan(leaseContract(config(), {}), {requests: 2, logFile: undefined, problems: []})
    expect('refusal' in p && p.refusal).toMatch(/no kv_connector_extra_config\.kv_lease_duration/)
  })

  it('records the stalled requests under kv-pinned and the bystander under kv-lease; a pinned FAIL exits 1', () => {
    const p = vllmStallPlan(leaseContract(config({kv_lease_duration: 4}), {}), {
      requests: 1,
      logFile: undefined,
      problems: [],
    })
    if ('refusal' in p) throw new Error(p.refusal)
    const s = vllmStallScenario(p, {
      startedAt: 0,
      finishedAt: 1,
      pinned: [{subject: 'a', verdict: 'fail', summary: 'pinned', evidence: {failure: 'pinned'}}],
      bystanders: [{subject: 'b', verdict: 'pass', summary: 'ok', evidence: {}}],
    })
    expect(s.verdicts.map(v => [v.check, v.subject, v.verdict])).toEqual([
      ['kv-pinned', 'a', 'fail'],
      ['kv-lease', 'b', 'pass'],
    ])
    expect(s.notes![0]).toBe('engine: vllm')
    expect(runExitCode({name: 'x', startedAt: 0, finishedAt: 1, deployment: 'd', scenarios: [s]})).toBe(1)
  })
})

describe("stall-kv on vLLM: D's heartbeats seen on P's side channel", () => {
  const SS = [
    '0      0      127.0.0.1:56238 127.0.0.1:44234',
    '\t bbr wscale:10,10 rto:204 bytes_sent:93 bytes_acked:93 bytes_received:20018 segs_out:179 segs_in:181',
  ].join('\n')

  it('sums bytes_received of the side-channel connections (ss -tinH); none: undefined', () => {
    expect(sideChannelBytesIn(SS)).toBe(20_018)
    expect(sideChannelBytesIn(`${SS}\n${SS.replace('20018', '5')}`)).toBe(20_023)
    expect(sideChannelBytesIn('')).toBeUndefined()
  })

  it('reached P only when bytes flowed in during the stall', () => {
    expect(heartbeatsSeen(5600, 100, 900).reachedP).toBe(true)
    expect(heartbeatsSeen(5600, 900, 900)).toMatchObject({reachedP: false})
    expect(heartbeatsSeen(5600, undefined, undefined).evidence).toMatch(/ride NIXL notifications/)
    expect(heartbeatsSeen(undefined, 1, 2).reachedP).toBe(false)
  })
})
