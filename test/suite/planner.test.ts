import {describe, expect, it} from 'vitest'

import {
  conflict,
  expand,
  lagLimit,
  planBatches,
  planConflicts,
  type PlannedScenario,
  renderPlanText,
} from '../../src/suite/planner.js'
import {defaultSuite, type ScenarioSpec, ScenarioSchema} from '../../src/suite/suite-file.js'

const spec = (s: Record<string, unknown>): ScenarioSpec => ScenarioSchema.parse(s)
const one = (s: Record<string, unknown>): PlannedScenario => ({name: String(s.name), spec: spec(s), repetition: 1})
const names = (batches: ReturnType<typeof planBatches>) => batches.map(b => b.scenarios.map(s => s.name))

describe('batch planner', () => {
  it(
    'batches the default suite: the stall-kv GPUs with the abort scenario, the per-rank drop-dest-info together ' +
      'apart, trip-breaker and the restart alone',
    () => {
      // On the twin (a TCP data path) stall-kv's auto mechanism is the packet filter (or the twin's failure point): no
      // SIGSTOP.
      const batches = planBatches(expand(defaultSuite().scenarios), {autoMechanism: 'packet-filter'})
      expect(names(batches)).toEqual([
        ['stall-kv gpu1', 'stall-kv gpu2', 'stall-kv gpu3', 'abort-mid-transfer gpu0'],
        // The prefill-only abort set widens the same GPU: a window of its own.
        ['abort-mid-transfer gpu0 prefill'],
        ['drop-dest-info rank0', 'drop-dest-info rank1', 'drop-dest-info rank2', 'drop-dest-info rank3'],
        ['trip-breaker prefill'],
        ['kill-prefill'],
        ['restart prefill alone'],
        ['co-restart'],
      ])
      expect(planConflicts(batches, {autoMechanism: 'packet-filter'})).toEqual([])
      expect(renderPlanText(batches, {autoMechanism: 'packet-filter'})[0]).toMatch(
        /^batch 1: stall-kv gpu1 \(stall-kv GPU 1 \[kv:1\] pins in inflight\)/,
      )
    },
  )

  it(
    'sizes batches by the lags measured at calibration: fewer scenarios at once when ε would not stay well under ' +
      'the poll',
    () => {
      const cal = (entryMaxMs: number, answerMaxMs: number) => ({
        prefillMs: 40,
        prefillSpreadMs: 6,
        observeMs: 3,
        samples: 8,
        lags: {
          concurrency: 8,
          samples: 8,
          entry: {p50Ms: entryMaxMs / 2, maxMs: entryMaxMs, samples: 8},
          answer: {p50Ms: answerMaxMs / 2, maxMs: answerMaxMs, includesEntry: false},
          notes: [],
        },
      })
      // Poll 0.5 s: ε ≈ 5 + 20 + 10 + 3 ms is well under it; no limit.
      expect(lagLimit(cal(20, 10), 0.5)).toBeUndefined()
      // One lag sample of 1010 ms (seen on an independent target): ε a whole poll wide; one scenario at a time.
      const one1 = lagLimit(cal(1010, 20), 1)!
      expect(one1.maxPerBatch).toBe(1)
      expect(one1.why).toMatch(
        /^at most 1 scenario per batch: ε ≈ 1038 ms from the lags measured at calibration .* against a poll of 1000 ms, more than 25 %/,
      )
      expect(lagLimit(cal(150, 30), 0.5)!.maxPerBatch).toBe(2)
      const scenarios = expand(defaultSuite().scenarios)
      const capped = planBatches(scenarios, {autoMechanism: 'packet-filter', maxPerBatch: 2})
      expect(capped.every(b => b.scenarios.length <= 2)).toBe(true)
      expect(capped.flatMap(b => b.scenarios.map(s => s.name)).sort()).toEqual(scenarios.map(s => s.name).sort())
      expect(planConflicts(capped, {autoMechanism: 'packet-filter'})).toEqual([])
    },
  )

  it('never batches two scenarios on the same GPU', () => {
    const a = one({name: 'a', fault: 'stall-kv', params: {gpu: 3, mechanism: 'packet-filter'}})
    const b = one({name: 'b', fault: 'abort-mid-transfer', params: {gpu: 3}})
    expect(conflict(a, b)).toMatch(/GPU 3/)
    expect(names(planBatches([a, b]))).toEqual([['a'], ['b']])
  })

  it(
    'never batches drop-dest-info on all ranks with drop-dest-info on one rank (same ZMQ ports), nor with a fault ' +
      'holding pins in another queue',
    () => {
      const all = one({name: 'all', fault: 'drop-dest-info'})
      const r1 = one({name: 'r1', fault: 'drop-dest-info', params: {rank: 1}})
      const r2 = one({name: 'r2', fault: 'drop-dest-info', params: {rank: 2}})
      const stall = one({name: 'stall', fault: 'stall-kv', params: {gpu: 5, mechanism: 'packet-filter'}})
      expect(conflict(all, r1)).toMatch(/same ports/)
      expect(conflict(r1, r2)).toBeUndefined()
      expect(conflict(r1, stall)).toMatch(/different queues/)
      expect(names(planBatches([all, r1, r2, stall]))).toEqual([['all'], ['r1', 'r2'], ['stall']])
    },
  )

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
    const s = expand([
      spec({name: 'x', fault: 'stall-kv', params: {gpu: 1, mechanism: 'packet-filter'}, repetitions: 3}),
      spec({name: 'y', fault: 'stall-kv', params: {gpu: 2, mechanism: 'packet-filter'}}),
    ])
    expect(s.map(x => x.name)).toEqual(['x', 'y', 'x #2', 'x #3'])
    expect(names(planBatches(s))).toEqual([['x', 'y'], ['x #2'], ['x #3']])
  })

  it(
    'scenarios on pairs that share no instance share a batch, whatever their GPUs, ports and queues; the plan ' +
      "names each fault's pair",
    () => {
      const p0 = one({name: 'p0', fault: 'stall-kv', params: {gpu: 1, mechanism: 'packet-filter'}})
      const p1 = one({
        name: 'p1',
        fault: 'stall-kv',
        params: {gpu: 1, mechanism: 'packet-filter'},
        pair: {prefill: 1, decode: 1},
      })
      const dd0 = one({name: 'dd0', fault: 'drop-dest-info'})
      const dd1 = one({name: 'dd1', fault: 'drop-dest-info', pair: {prefill: 1, decode: 1}})
      // GPU 1 of prefill[0]'s pair and GPU 1 of prefill[1]'s are different GPUs; each prefill has its own ZMQ ports and
      // queues.
      expect(conflict(p0, p1)).toBeUndefined()
      expect(conflict(dd0, dd1)).toBeUndefined()
      expect(conflict(p0, dd1)).toBeUndefined()
      expect(names(planBatches([p0, dd0, p1, dd1]))).toEqual([
        ['p0', 'p1'],
        ['dd0', 'dd1'],
      ])
      expect(renderPlanText(planBatches([dd0, dd1]), {showPairs: true})).toEqual([
        'batch 1: dd0 (drop-dest-info on prefill[0] + decode[0] [zmq:all] pins in bootstrap) | dd1 (drop-dest-info ' +
          'on prefill[1] + decode[1] [zmq:all] pins in bootstrap)',
      ])
      expect(() => spec({name: 'r', restart: {}, pair: {prefill: 1}})).toThrow(
        /a co-restart restarts every instance: pair applies to a fault scenario/,
      )
    },
  )

  it(
    "pairs that share the decode instance: the prefill side (ZMQ ports, queues) is each one's own, a GPU number " +
      "may be the shared decode's",
    () => {
      const dd0 = one({name: 'dd0', fault: 'drop-dest-info'})
      const dd1 = one({name: 'dd1', fault: 'drop-dest-info', pair: {prefill: 1}})
      const stall1 = one({
        name: 'stall1',
        fault: 'stall-kv',
        params: {gpu: 5, mechanism: 'packet-filter'},
        pair: {prefill: 1},
      })
      const stall0 = one({name: 'stall0', fault: 'stall-kv', params: {gpu: 5, mechanism: 'packet-filter'}})
      expect(conflict(dd0, dd1)).toBeUndefined()
      // Pins in prefill[0]'s bootstrap queue and prefill[1]'s inflight queue: neither fault moves the other's.
      expect(conflict(dd0, stall1)).toBeUndefined()
      expect(conflict(stall0, stall1)).toBe(
        'both act on GPU 5 (prefill[0] + decode[0] and prefill[1] + decode[0] share decode[0], whose GPU it may be)',
      )
      expect(names(planBatches([dd0, stall1, dd1, stall0]))).toEqual([
        ['dd0', 'stall1'],
        ['dd1', 'stall0'],
      ])
      // The scenario that names no pair follows --prefill-instance: on prefill[1] it is the same pair as dd1.
      expect(conflict(dd0, dd1, {defaultPair: {prefill: 1, decode: 0}})).toMatch(/same ports \(zmq:all\)$/)
    },
  )

  it('pairs that share the prefill instance keep its rules: its ZMQ ports and its one queue', () => {
    const dd = one({name: 'dd', fault: 'drop-dest-info', params: {rank: 1}})
    const ddAll = one({name: 'dd all', fault: 'drop-dest-info', pair: {decode: 1}})
    const stall = one({
      name: 'stall',
      fault: 'stall-kv',
      params: {gpu: 6, mechanism: 'packet-filter'},
      pair: {decode: 1},
    })
    expect(conflict(dd, ddAll)).toBe(
      'both filter the same ports (zmq:1) (prefill[0] + decode[0] and prefill[0] + decode[1] share prefill[0])',
    )
    expect(conflict(dd, stall)).toMatch(
      /^their pins sit in different queues \(bootstrap vs inflight\).*share prefill\[0\]\)$/,
    )
    expect(names(planBatches([dd, ddAll, stall]))).toEqual([['dd'], ['dd all'], ['stall']])
  })

  it('planConflicts finds a conflicting pair put together by hand', () => {
    const a = one({name: 'a', fault: 'stall-kv', params: {gpu: 1, mechanism: 'packet-filter'}})
    const b = one({name: 'b', fault: 'drop-dest-info'})
    expect(planConflicts([{index: 1, scenarios: [a, b]}])).toEqual([
      expect.stringMatching(/^batch 1: a with b: .*different queues/),
    ])
  })

  it('no batch of a random mix of scenarios ever holds a conflicting pair', () => {
    let seed = 7
    const rnd = (n: number) => {
      seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31
      return seed % n
    }
    for (let round = 0; round < 50; round++) {
      const list: PlannedScenario[] = []
      for (let i = 0; i < 12; i++) {
        const k = rnd(5)
        const name = `s${i}`
        const pair = rnd(3) === 0 ? {} : {pair: {prefill: rnd(2), decode: rnd(2)}}
        if (k === 0)
          list.push(
            one({
              name,
              fault: 'stall-kv',
              params: {gpu: rnd(8), mechanism: rnd(4) === 0 ? 'sigstop' : 'packet-filter'},
              ...pair,
            }),
          )
        else if (k === 1)
          list.push(one({name, fault: 'drop-dest-info', ...(rnd(2) ? {params: {rank: rnd(4)}} : {}), ...pair}))
        else if (k === 2) list.push(one({name, fault: 'abort-mid-transfer', params: {gpu: rnd(8)}, ...pair}))
        else if (k === 3) list.push(one({name, restart: {}}))
        else list.push(one({name, fault: 'stall-kv', params: {gpu: rnd(8), mechanism: 'packet-filter'}, ...pair}))
      }
      const batches = planBatches(list)
      expect(planConflicts(batches)).toEqual([])
      expect(batches.flatMap(b => b.scenarios.map(s => s.name)).sort()).toEqual(list.map(s => s.name).sort())
    }
  })
})
