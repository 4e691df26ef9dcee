import {describe, expect, it} from 'vitest'

import {checkRecovery} from '../../src/checks/recovery.js'
import {
  LOADS_DECODE_PREALLOC_QUEUE,
  LOADS_DECODE_TRANSFER_QUEUE,
  LOADS_PREFILL_BOOTSTRAP_QUEUE,
  LOADS_PREFILL_INFLIGHT_QUEUE,
  LOADS_USED_TOKENS,
  WATCHDOG_EVICTED_TOTAL,
} from '../../src/engines/sglang/sglang-metrics.js'
import {drained} from '../../src/experiment/batch-pairs.js'
import {viewFor} from '../../src/experiment/judge.js'
import {TimelineBuilder} from './synthetic.js'

/**
 * A batch over two instance pairs (prefill[0] + decode and prefill[1] + decode): every server's samples say which
 * instance they are from, and what the batch concludes about the deployment covers each of them.
 */
const P0 = 'services.prefill[0]'
const P1 = 'services.prefill[1]'
const D = 'services.decode'
const SERVERS = [
  {service: 'prefill' as const, instance: P0},
  {service: 'prefill' as const, instance: P1},
  {service: 'decode' as const, instance: D},
]

/** Every PD queue of a server at `ms`, all reading `value` unless `over` says otherwise. */
function queues(
  b: TimelineBuilder,
  ms: number,
  instance: string,
  value = 0,
  over: Record<string, number> = {},
): TimelineBuilder {
  const names =
    instance === D
      ? [LOADS_DECODE_PREALLOC_QUEUE, LOADS_DECODE_TRANSFER_QUEUE]
      : [LOADS_PREFILL_BOOTSTRAP_QUEUE, LOADS_PREFILL_INFLIGHT_QUEUE]
  for (const n of names) b.metric(instance === D ? 'decode' : 'prefill', n, ms, over[n] ?? value, instance)
  return b
}

const recovered = () => new TimelineBuilder().fault(100, 3000).request('c1', 'canary', 3100, {ms: 3150, status: 200})

describe('a batch over two instance pairs', () => {
  it('fails the drain when one prefill instance still holds a request, though the other (sampled last) reads 0', () => {
    const b = queues(queues(queues(recovered(), 3200, P1, 0, {[LOADS_PREFILL_INFLIGHT_QUEUE]: 2}), 3201, D), 3202, P0)
    const q = checkRecovery(b.build(), {instances: SERVERS}).find(v => v.subject === 'queues')!
    expect(q).toMatchObject({verdict: 'fail', summary: `queues not drained: ${P1} ${LOADS_PREFILL_INFLIGHT_QUEUE}=2`})
    expect(drained(b, SERVERS)).toBe(false)
  })

  it(
    "passes the drain only when every pair's servers read 0; a pair never sampled leaves it unproven and the wait " +
      'going',
    () => {
      const all = queues(queues(queues(recovered(), 3200, P0), 3200, P1), 3200, D)
      expect(checkRecovery(all.build(), {instances: SERVERS}).find(v => v.subject === 'queues')).toMatchObject({
        verdict: 'pass',
        summary: 'every PD queue drained to 0',
      })
      expect(drained(all, SERVERS)).toBe(true)
      const noP1 = queues(queues(recovered(), 3200, P0), 3200, D)
      expect(checkRecovery(noP1.build(), {instances: SERVERS}).find(v => v.subject === 'queues')).toMatchObject({
        verdict: 'unverified',
        summary: `no PD queue of ${P1} was sampled after the revert: drain unproven`,
      })
      expect(drained(noP1, SERVERS)).toBe(false)
      // One pair, unlabelled as before: its two servers, each seen at 0.
      const one = new TimelineBuilder()
        .metric('prefill', LOADS_PREFILL_INFLIGHT_QUEUE, 10, 0)
        .metric('decode', LOADS_DECODE_TRANSFER_QUEUE, 10, 0)
      expect(drained(one, [{service: 'prefill'}, {service: 'decode'}])).toBe(true)
      expect(
        drained(new TimelineBuilder().metric('prefill', LOADS_PREFILL_INFLIGHT_QUEUE, 10, 0), [
          {service: 'prefill'},
          {service: 'decode'},
        ]),
      ).toBe(false)
    },
  )

  it(
    "sums the watchdog counter over both prefill instances, and judges each instance's KV tokens against its own " +
      'baseline',
    () => {
      const b = new TimelineBuilder()
        .fault(100, 3000)
        .pin('a', 200, {ms: 2400, status: 500})
        .pin('b', 200, {ms: 2400, status: 500})
        .request('c1', 'canary', 3100, {ms: 3150, status: 200})
        .metric('prefill', WATCHDOG_EVICTED_TOTAL, 50, 4, P0)
        .metric('prefill', WATCHDOG_EVICTED_TOTAL, 50, 10, P1)
        .metric('prefill', WATCHDOG_EVICTED_TOTAL, 3200, 5, P0)
        .metric('prefill', WATCHDOG_EVICTED_TOTAL, 3201, 11, P1)
        .loads('prefill', 50, 0, {}, P0)
        .loads('prefill', 50, 0, {}, P1)
        .loads('prefill', 3200, 0, {}, P0)
        .loads('prefill', 3201, 64, {}, P1)
      const v = checkRecovery(b.build(), {instances: SERVERS})
      expect(v.find(x => x.subject === 'counters')).toMatchObject({
        verdict: 'pass',
        summary: 'failure counters moved by 2, as expected (2)',
      })
      expect(v.filter(x => x.subject.endsWith('KV tokens')).map(x => [x.subject, x.verdict])).toEqual([
        [`${P0} KV tokens`, 'pass'],
        [`${P1} KV tokens`, 'fail'],
      ])
    },
  )

  it("each scenario's view keeps its own pair's samples and log reads, and the shared decode's", () => {
    const tl = new TimelineBuilder()
      .metric('prefill', LOADS_USED_TOKENS, 10, 1, P0)
      .metric('prefill', LOADS_USED_TOKENS, 10, 2, P1)
      .metric('decode', LOADS_USED_TOKENS, 10, 3, D)
      .build()
    tl.observations.push({
      kind: 'log-read',
      t: tl.observations[0]!.t,
      service: 'prefill',
      source: 'journald',
      ok: false,
      lines: 0,
      truncated: false,
      detail: 'no access',
      instance: P1,
    })
    const seen = viewFor(tl, 'on prefill0', {prefill: P0, decode: D}).observations.map(o =>
      'instance' in o ? o.instance : undefined,
    )
    expect(seen).toEqual([P0, D])
    expect(
      viewFor(tl, 'on prefill1', {prefill: P1, decode: D}).observations.filter(o => o.kind === 'log-read'),
    ).toHaveLength(1)
  })
})
