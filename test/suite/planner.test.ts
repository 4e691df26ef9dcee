import {describe, expect, it} from 'vitest'

import {conflict, expand, planBatches, planConflicts, type PlannedScenario, renderPlanText} from '../../src/suite/planner.js'
import {defaultSuite, type ScenarioSpec, ScenarioSchema} from '../../src/suite/suite-file.js'

const spec = (s: Record<string, unknown>): ScenarioSpec => ScenarioSchema.parse(s)
const one = (s: Record<string, unknown>): PlannedScenario => ({name: String(s.name), spec: spec(s), repetition: 1})
const names = (batches: ReturnType<typeof planBatches>) => batches.map((b) => b.scenarios.map((s) => s.name))

describe('batch planner', () => {
  it('batches the default suite: the stall-kv GPUs with the abort scenario, the per-rank drop-dest-info together apart, the restart alone', () => {
    // On the twin (a TCP data path) stall-kv's auto mechanism is the packet filter (or the twin's failure point): no SIGSTOP.
    const batches = planBatches(expand(defaultSuite().scenarios), {autoMechanism: 'packet-filter'})
    expect(names(batches)).toEqual([
      ['stall-kv gpu1', 'stall-kv gpu2', 'stall-kv gpu3', 'abort-mid-transfer gpu0'],
      ['drop-dest-info rank0', 'drop-dest-info rank1', 'drop-dest-info rank2', 'drop-dest-info rank3'],
      ['co-restart'],
    ])
    expect(planConflicts(batches, {autoMechanism: 'packet-filter'})).toEqual([])
    expect(renderPlanText(batches, {autoMechanism: 'packet-filter'})[0]).toMatch(/^batch 1: stall-kv gpu1 \(stall-kv GPU 1 \[kv:1\] pins in inflight\)/)
  })

  it('never batches two scenarios on the same GPU', () => {
    const a = one({name: 'a', fault: 'stall-kv', params: {gpu: 3, mechanism: 'packet-filter'}})
    const b = one({name: 'b', fault: 'abort-mid-transfer', params: {gpu: 3}})
    expect(conflict(a, b)).toMatch(/GPU 3/)
    expect(names(planBatches([a, b]))).toEqual([['a'], ['b']])
  })

  it('never batches drop-dest-info on all ranks with drop-dest-info on one rank (same ZMQ ports), nor with a fault holding pins in another queue', () => {
    const all = one({name: 'all', fault: 'drop-dest-info'})
    const r1 = one({name: 'r1', fault: 'drop-dest-info', params: {rank: 1}})
    const r2 = one({name: 'r2', fault: 'drop-dest-info', params: {rank: 2}})
    const stall = one({name: 'stall', fault: 'stall-kv', params: {gpu: 5, mechanism: 'packet-filter'}})
    expect(conflict(all, r1)).toMatch(/same ports/)
    expect(conflict(r1, r2)).toBeUndefined()
    expect(conflict(r1, stall)).toMatch(/different queues/)
    expect(names(planBatches([all, r1, r2, stall]))).toEqual([['all'], ['r1', 'r2'], ['stall']])
  })

  it('a SIGSTOP wedges its instance: it runs alone, and auto resolves by the data path', () => {
    const stop = one({name: 'stop', fault: 'stall-kv', params: {gpu: 1, mechanism: 'sigstop'}})
    const auto = one({name: 'auto', fault: 'stall-kv', params: {gpu: 2}})
    const other = one({name: 'other', fault: 'stall-kv', params: {gpu: 6, mechanism: 'packet-filter'}})
    expect(conflict(stop, other)).toMatch(/SIGSTOP wedges/)
    expect(names(planBatches([stop, other]))).toEqual([['stop'], ['other']])
    // Unknown data path: auto may be SIGSTOP, so it is planned as one.
    expect(names(planBatches([auto, other]))).toEqual([['auto'], ['other']])
    expect(names(planBatches([auto, other], {autoMechanism: 'packet-filter'}))).toEqual([['auto', 'other']])
  })

  it('a restart runs alone and is a barrier: nothing after it moves before it', () => {
    const a = one({name: 'a', fault: 'stall-kv', params: {gpu: 1, mechanism: 'packet-filter'}})
    const r = one({name: 'r', restart: {}})
    const b = one({name: 'b', fault: 'stall-kv', params: {gpu: 2, mechanism: 'packet-filter'}})
    expect(names(planBatches([a, r, b]))).toEqual([['a'], ['r'], ['b']])
  })

  it('repetitions of one scenario never share a window', () => {
    const s = expand([spec({name: 'x', fault: 'stall-kv', params: {gpu: 1, mechanism: 'packet-filter'}, repetitions: 3}), spec({name: 'y', fault: 'stall-kv', params: {gpu: 2, mechanism: 'packet-filter'}})])
    expect(s.map((x) => x.name)).toEqual(['x', 'y', 'x #2', 'x #3'])
    expect(names(planBatches(s))).toEqual([['x', 'y'], ['x #2'], ['x #3']])
  })

  it('scenarios on different instance pairs never share a batch (a batch acts on one pair); the plan names each fault\'s pair', () => {
    const p0 = one({name: 'p0', fault: 'stall-kv', params: {gpu: 1, mechanism: 'packet-filter'}})
    const p1 = one({name: 'p1', fault: 'stall-kv', params: {gpu: 2, mechanism: 'packet-filter'}, pair: {prefill: 1}})
    const p1too = one({name: 'p1 too', fault: 'stall-kv', params: {gpu: 3, mechanism: 'packet-filter'}, pair: {prefill: 1, decode: 0}})
    expect(conflict(p0, p1)).toBe('they act on different instance pairs (prefill[0] + decode[0] vs prefill[1] + decode[0]): a batch acts on one pair')
    expect(conflict(p1, p1too)).toBeUndefined()
    expect(names(planBatches([p0, p1, p1too]))).toEqual([['p0'], ['p1', 'p1 too']])
    // With --prefill-instance 1 the scenario that names no pair is on prefill[1] too.
    expect(names(planBatches([p0, p1, p1too], {defaultPair: {prefill: 1, decode: 0}}))).toEqual([['p0', 'p1', 'p1 too']])
    expect(renderPlanText(planBatches([p0, p1]), {showPairs: true})).toEqual([
      'batch 1: p0 (stall-kv on prefill[0] + decode[0] GPU 1 [kv:1] pins in inflight)',
      'batch 2: p1 (stall-kv on prefill[1] + decode[0] GPU 2 [kv:2] pins in inflight)',
    ])
    expect(() => spec({name: 'r', restart: {}, pair: {prefill: 1}})).toThrow(/a co-restart restarts every instance: pair applies to a fault scenario/)
  })

  it('planConflicts finds a conflicting pair put together by hand', () => {
    const a = one({name: 'a', fault: 'stall-kv', params: {gpu: 1, mechanism: 'packet-filter'}})
    const b = one({name: 'b', fault: 'drop-dest-info'})
    expect(planConflicts([{index: 1, scenarios: [a, b]}])).toEqual([expect.stringMatching(/^batch 1: a with b: .*different queues/)])
  })

  it('no batch of a random mix of scenarios ever holds a conflicting pair', () => {
    let seed = 7
    const rnd = (n: number) => { seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31; return seed % n }
    for (let round = 0; round < 50; round++) {
      const list: PlannedScenario[] = []
      for (let i = 0; i < 12; i++) {
        const k = rnd(5)
        const name = `s${i}`
        if (k === 0) list.push(one({name, fault: 'stall-kv', params: {gpu: rnd(8), mechanism: rnd(4) === 0 ? 'sigstop' : 'packet-filter'}}))
        else if (k === 1) list.push(one({name, fault: 'drop-dest-info', ...(rnd(2) ? {params: {rank: rnd(4)}} : {})}))
        else if (k === 2) list.push(one({name, fault: 'abort-mid-transfer', params: {gpu: rnd(8)}}))
        else if (k === 3) list.push(one({name, restart: {}}))
        else list.push(one({name, fault: 'stall-kv', params: {gpu: rnd(8), mechanism: 'packet-filter'}}))
      }
      const batches = planBatches(list)
      expect(planConflicts(batches)).toEqual([])
      expect(batches.flatMap((b) => b.scenarios.map((s) => s.name)).sort()).toEqual(list.map((s) => s.name).sort())
    }
  })
})
