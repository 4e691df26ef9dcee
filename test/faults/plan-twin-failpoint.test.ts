import {describe, expect, it} from 'vitest'

import type {RankInfo} from '../../src/engines/sglang/discovery/discover.js'
import {PdError} from '../../src/errors.js'
import {dropDestInfo} from '../../src/faults/drop-dest-info.js'
import type {FaultDiscovery} from '../../src/faults/fault.js'
import {stallKv} from '../../src/faults/stall-kv.js'
import {parseFaultParams} from '../../src/faults/params.js'

/** The twin's own failure points: chosen only against the twin, only when asked or when no packet filter is usable. */

const rank = (service: 'prefill' | 'decode', tp: number): RankInfo => ({
  service,
  tpRank: tp,
  pid: (service === 'prefill' ? 1000 : 2000) + tp,
  startTicks: 5 + tp,
  state: 'S',
  title: `sglang::scheduler_TP${tp}`,
  gpu: service === 'prefill' ? tp : 4 + tp,
  ...(service === 'prefill' ? {zmqPort: 41_000 + tp} : {}),
})
const ranks = [0, 1, 2, 3].flatMap(k => [rank('prefill', k), rank('decode', k)])
const twin: FaultDiscovery = {
  ranks,
  transport: {backend: 'nixl', source: 'test', dataPath: 'tcp'},
  servicePorts: [30_100],
  twinFailpointUrl: 'http://10.231.1.2:30100/_pdchaos/twin/failpoint',
}
const realHost: FaultDiscovery = {...twin, twinFailpointUrl: undefined}
const noTool = {filterEvidence: 'nft: Operation not permitted (not root)'}

function refusal(fn: () => unknown): PdError {
  try {
    fn()
  } catch (error) {
    if (error instanceof PdError) return error
    throw error
  }
  throw new Error('expected a refusal')
}

describe('twin failure points in fault plans', () => {
  it('auto without a usable packet filter, against the twin: the twin failure point, with the reason recorded', () => {
    const plan = dropDestInfo.plan({
      discovery: twin,
      params: parseFaultParams(dropDestInfo, {}),
      leaseId: 'L1',
      facts: noTool,
    })
    expect(plan.mechanism).toBe('twin-failpoint')
    expect(plan.sudo).toBe(false)
    expect(plan.refusals?.[0]).toMatch(/packet filter not usable here \(nft: Operation not permitted/)
    expect(plan.inject[0]).toEqual([
      'node',
      '-e',
      expect.any(String),
      twin.twinFailpointUrl,
      JSON.stringify({name: 'drop-dest-info', enabled: true, tpRanks: [0, 1, 2, 3]}),
    ])
    expect(plan.revert[0]!.at(-1)).toBe(JSON.stringify({name: 'drop-dest-info', enabled: false, tpRanks: [0, 1, 2, 3]}))
  })

  it('auto with a packet filter keeps the real mechanism, even on the twin', () => {
    const plan = dropDestInfo.plan({
      discovery: twin,
      params: parseFaultParams(dropDestInfo, {}),
      leaseId: 'L1',
      facts: {filterTool: 'nft', filterEvidence: 'ok'},
    })
    expect(plan.mechanism).toBe('packet-filter')
  })

  it(
    'never against a real host: asked for, it is refused (exit 2); auto without a packet filter refuses for want ' +
      'of one',
    () => {
      const asked = refusal(() =>
        dropDestInfo.plan({
          discovery: realHost,
          params: parseFaultParams(dropDestInfo, {mechanism: 'twin-failpoint'}),
          leaseId: 'L1',
          facts: noTool,
        }),
      )
      expect(asked.exitCode).toBe(2)
      expect(asked.message).toMatch(/works only against pdchaos's twin/)
      const auto = refusal(() =>
        dropDestInfo.plan({
          discovery: realHost,
          params: parseFaultParams(dropDestInfo, {}),
          leaseId: 'L1',
          facts: noTool,
        }),
      )
      expect(auto.message).toMatch(/no usable packet filter/)
      const stall = refusal(() =>
        stallKv.plan({
          discovery: realHost,
          params: parseFaultParams(stallKv, {gpu: 1, mechanism: 'twin-failpoint'}),
          leaseId: 'L1',
          facts: {...noTool, connections: []},
        }),
      )
      expect(stall.message).toMatch(/works only against pdchaos's twin/)
    },
  )

  it('stall-kv holds one prefill rank, and refuses a decode GPU', () => {
    const plan = stallKv.plan({
      discovery: twin,
      params: parseFaultParams(stallKv, {gpu: 2}),
      leaseId: 'L1',
      facts: {...noTool, connections: []},
    })
    expect(plan).toMatchObject({mechanism: 'twin-failpoint', targets: [{service: 'prefill', tpRank: 2}]})
    expect(
      refusal(() =>
        stallKv.plan({
          discovery: twin,
          params: parseFaultParams(stallKv, {gpu: 5, mechanism: 'twin-failpoint'}),
          leaseId: 'L1',
          facts: noTool,
        }),
      ).suggestion,
    ).toMatch(/pick --gpu of a prefill rank/)
  })
})
