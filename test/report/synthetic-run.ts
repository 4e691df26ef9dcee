import {checkEvictions} from '../../src/checks/eviction.js'
import type {Observation, Timeline} from '../../src/model/timeline.js'
import {fail, pass, type Verdict} from '../../src/model/verdict.js'
import type {LeaseRecord} from '../../src/model/run.js'
import type {Contract, ScenarioRun, SuiteRun} from '../../src/model/run.js'
import {TIMEOUTS_READ} from '../checks/synthetic.js'

/**
 * A realistic suite run built from synthetic timelines and judged by the real eviction check: drop-dest-info with
 * four pins, stall-kv on GPU 2 with three pins, and a co-restart. With `failing`, one drop-dest-info pin is never
 * evicted (the seed's bug); otherwise every pin leaves inside its window.
 */

export const T0 = 1_800_000_000_000
const contract: Contract = {scope: 'all', deadlineSeconds: 2, pollSeconds: 0.5}
const calibration = {prefillMs: 40, prefillSpreadMs: 6, observeMs: 3, samples: 20}

/** Text a renderer must escape: markup, an ampersand, quotes, a control character. */
export const NASTY = 'rid <script>alert("x")</script> & \'q\' \u0001 end'

function lease(id: string, fault: string, from: number, to: number, clean = true): LeaseRecord {
  return {
    id,
    fault,
    mechanism: fault === 'stall-kv' ? 'signals' : 'packet-filter',
    injectedAt: from,
    revertedAt: to,
    verifiedInjected: true,
    verifiedClean: clean,
    expiresAt: to + 60_000,
    evidence: {injected: ['rules listed'], clean: ['table gone']},
  }
}

function load(
  obs: Observation[],
  base: number,
  fromMs: number,
  toMs: number,
  everyMs: number,
  failFrom?: number,
  failTo?: number,
) {
  let i = 0
  for (let ms = fromMs; ms < toMs; ms += everyMs, i++) {
    const rid = `load-${base}-${i}`
    obs.push({kind: 'request-sent', t: base + ms, rid, role: 'load'})
    const failed = failFrom !== undefined && failTo !== undefined && ms >= failFrom && ms < failTo
    obs.push({kind: 'request-answered', t: base + ms + 60, rid, status: failed ? 503 : 200})
  }
}

function gauge(
  obs: Observation[],
  base: number,
  service: 'prefill' | 'decode',
  name: string,
  points: Array<[number, number]>,
) {
  for (const [ms, value] of points) obs.push({kind: 'metric', t: base + ms, service, name, value})
}

function injectScenario(
  name: string,
  fault: string,
  base: number,
  pins: Array<{rid: string; sentMs: number; answerMs?: number}>,
  params: Record<string, unknown>,
  leaseId: string,
  queue: 'bootstrap' | 'inflight',
): ScenarioRun {
  const obs: Observation[] = []
  const injectMs = 200
  const revertMs = 4200
  obs.push({kind: 'fault-injected', t: base + injectMs, fault, leaseId, verified: true, evidence: 'rules listed'})
  obs.push({kind: 'fault-reverted', t: base + revertMs, fault, leaseId, verifiedClean: true, evidence: 'table gone'})
  const state =
    queue === 'bootstrap' ? {queue, kvPoll: 'Bootstrapping' as const} : {queue, kvPoll: 'Transferring' as const}
  for (const p of pins) {
    obs.push({kind: 'request-sent', t: base + p.sentMs, rid: p.rid, role: 'pin', fault, expectedState: state})
    if (p.answerMs !== undefined)
      obs.push({kind: 'request-answered', t: base + p.answerMs, rid: p.rid, status: 500, detail: 'watchdog timeout'})
  }
  load(obs, base, 0, 4600, 250)
  const q = queue === 'bootstrap' ? 'sglang:num_prefill_bootstrap_queue_reqs' : 'sglang:num_prefill_inflight_queue_reqs'
  const held = (ms: number) => pins.filter(p => p.sentMs <= ms && (p.answerMs === undefined || p.answerMs > ms)).length
  gauge(
    obs,
    base,
    'prefill',
    q,
    Array.from({length: 24}, (_, i) => [i * 200, held(i * 200)] as [number, number]),
  )
  gauge(
    obs,
    base,
    'prefill',
    'sglang:num_bootstrap_failed_reqs_total',
    Array.from(
      {length: 24},
      (_, i) =>
        [i * 200, pins.filter(p => p.answerMs !== undefined && p.answerMs <= i * 200).length] as [number, number],
    ),
  )
  obs.push({kind: 'marker', t: base + 4600, name: 'end'})
  obs.sort((a, b) => a.t - b.t)
  const timeline: Timeline = {contract, calibration, observations: obs}
  const {verdicts, pins: pinRecords} = checkEvictions(timeline, TIMEOUTS_READ)
  const extra: Verdict[] = [
    pass('cleanup', leaseId, 'fault reverted and verified clean', {evidence: ['table gone']}),
    pass('collateral', 'load', 'no collateral loss: 19/19 load requests answered', {answered: 19, failed: 0}),
  ]
  return {
    name,
    kind: 'inject',
    fault,
    params,
    startedAt: base,
    finishedAt: base + 4700,
    verdicts: [...verdicts, ...extra],
    pins: pinRecords,
    leases: [lease(leaseId, fault, base + injectMs, base + revertMs)],
    timeline,
    contract,
  }
}

function restartScenario(base: number): ScenarioRun {
  const obs: Observation[] = []
  obs.push({kind: 'marker', t: base, name: 'restart prefill'})
  obs.push({kind: 'marker', t: base + 1500, name: 'restart decode'})
  obs.push({kind: 'marker', t: base + 2600, name: 'restart router'})
  for (let i = 0; i < 4; i++) {
    obs.push({kind: 'request-sent', t: base + 3200 + i * 100, rid: `canary-${i}`, role: 'canary'})
    obs.push({kind: 'request-answered', t: base + 3300 + i * 100, rid: `canary-${i}`, status: 200})
  }
  load(obs, base, 3800, 6000, 300)
  gauge(
    obs,
    base,
    'prefill',
    'sglang:num_prefill_inflight_queue_reqs',
    Array.from({length: 12}, (_, i) => [3800 + i * 200, i % 3] as [number, number]),
  )
  obs.sort((a, b) => a.t - b.t)
  return {
    name: 'co-restart',
    kind: 'restart',
    startedAt: base,
    finishedAt: base + 6100,
    pins: [],
    leases: [],
    contract,
    timeline: {contract, calibration: {prefillMs: 0, prefillSpreadMs: 0, observeMs: 0, samples: 0}, observations: obs},
    verdicts: [
      pass('restart', 'prefill', 'healthy 1.2 s after its restart command', {healthyAfterMs: 1200}),
      pass('restart', 'decode', 'healthy 0.9 s after its restart command', {healthyAfterMs: 900}),
      pass('restart', 'router', 'healthy 0.4 s after its restart command', {healthyAfterMs: 400}),
      pass('recovery', 'canaries', '4/4 canaries answered 200 end to end', {answered: 4}),
    ],
  }
}

export function syntheticRun(opts: {failing: boolean}): SuiteRun {
  const s1 = injectScenario(
    'drop-dest-info',
    'drop-dest-info',
    T0,
    [
      {rid: 'pin-d1', sentMs: 400, answerMs: 2420},
      {rid: 'pin-d2', sentMs: 600, answerMs: 2750},
      // The seed's bug: never evicted, still held when pdchaos stopped watching.
      {rid: opts.failing ? NASTY : 'pin-d3', sentMs: 800, answerMs: opts.failing ? undefined : 3000},
      {rid: 'pin-d4', sentMs: 1000, answerMs: 3200},
    ],
    {},
    'L-drop-1',
    'bootstrap',
  )
  const s2 = injectScenario(
    'stall-kv gpu2',
    'stall-kv',
    T0 + 5000,
    [
      {rid: 'pin-s1', sentMs: 400, answerMs: 2600},
      {rid: 'pin-s2', sentMs: 700, answerMs: 2900},
      {rid: 'pin-s3', sentMs: 1000, answerMs: 3300},
    ],
    {gpu: 2},
    'L-stall-1',
    'bootstrap',
  )
  const s3 = restartScenario(T0 + 10_000)
  return {
    name: 'nightly',
    runId: 'r-test-1',
    startedAt: T0,
    finishedAt: T0 + 16_200,
    deployment: 'twin',
    scenarios: [s1, s2, s3],
  }
}

export {fail, pass}
