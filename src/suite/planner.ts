import {FIRST_PAIR, type InstancePair} from '../deployment/single-host.js'
import {
  type FaultScenario,
  type Footprint,
  type FootprintContext,
  isPrefillInstancePort,
  portsOverlap,
} from '../faults/fault.js'
import {parseFaultParams} from '../faults/params.js'
import {getFault} from '../faults/registry.js'
import {EPSILON_FLOOR_MS} from '../checks/epsilon.js'
import {describeLags, lagAllowanceMs} from '../model/lags.js'
import type {Calibration} from '../model/timeline.js'
import type {ScenarioSpec} from './suite-file.js'
import {throwIfStopped, yielder} from '../util/stop.js'

/**
 * The batch planner (pure): which scenarios may share one fault window. In a TP group every request spans all
 * ranks, so scenarios in a batch share one window and must not interfere: no two touch the same GPU or rank, no two
 * filter the same ports, none wedges an instance (SIGSTOP) next to anything else, all hold their pins in the same
 * PD queue (a fault that holds every request in Bootstrapping would keep another's pins out of Transferring),
 * and a restart runs alone. Order is kept around anything that runs alone. Where the deployment lists several
 * instances of a role, what a footprint holds belongs to its pair's instances: scenarios on pairs that share no
 * instance never overlap, and on pairs that share one only what may be that instance's can (see `conflict`).
 */

export interface PlannedScenario {
  /** Unique in the run: the scenario's name, with `#k` for its k-th repetition (k > 1). */
  name: string
  spec: ScenarioSpec
  repetition: number
}

/** What one scenario holds while it runs: its fault's footprint, and its base name (repetitions never share). */
export type ScenarioFootprint = Footprint & {base: string}

export interface Batch {
  index: number
  scenarios: PlannedScenario[]
}

export type PlanOptions = FootprintContext & {
  /** The instance pair of a scenario that names none (--prefill-instance, --decode-instance). */
  defaultPair?: InstancePair
  /** The deployment lists several instances of a role: the plan names each fault's pair. */
  showPairs?: boolean
  /** At most this many scenarios share one window (from the lags measured at calibration: `lagLimit`). */
  maxPerBatch?: number
}

/** ε's late side must stay well under the poll: at most this share of it, or batches shrink. */
export const EPSILON_SHARE_OF_POLL = 0.25

/**
 * How many scenarios may share one window, from the lags measured at calibration. ε's late side grows with the
 * entry and answer lags (checks/epsilon.ts), and the lags grow with what runs at once: the more scenarios hold pins
 * and send steady load together, the slower a busy host takes new requests in. Where the measured ε is already more
 * than a quarter of the poll, a window with many scenarios would push it toward a whole poll, and every verdict near
 * a bound would be unverified: batches are cut to two scenarios (ε up to half a poll) or to one (beyond).
 */
export function lagLimit(
  c: Calibration | undefined,
  pollSeconds: number,
): {maxPerBatch: number; why: string} | undefined {
  if (!c?.lags) return undefined
  const pollMs = pollSeconds * 1000
  const epsMs = EPSILON_FLOOR_MS + lagAllowanceMs(c.lags) + Math.max(c.prefillSpreadMs, 1) / 2
  const share = epsMs / pollMs
  const measured =
    `ε ≈ ${Math.round(epsMs)} ms from the lags measured at calibration (${describeLags(c.lags)}) ` +
    `against a poll of ${Math.round(pollMs)} ms`
  if (share <= EPSILON_SHARE_OF_POLL) return undefined
  const maxPerBatch = share <= 2 * EPSILON_SHARE_OF_POLL ? 2 : 1
  const most = `at most ${maxPerBatch} scenario${maxPerBatch === 1 ? '' : 's'} per batch`
  const share100 = Math.round(EPSILON_SHARE_OF_POLL * 100)
  return {maxPerBatch, why: `${most}: ${measured}, more than ${share100} % of it; fewer at once keep the lags down`}
}

/** The prefill/decode instance pair a scenario acts on: its own `pair:`, each role defaulting to the run's. */
export function pairOfScenario(s: PlannedScenario, opts: PlanOptions = {}): InstancePair {
  return pairOfSpec(s.spec, opts.defaultPair ?? FIRST_PAIR)
}

/** A scenario's `pair:` with each role it leaves out taken from `d`. */
export function pairOfSpec(spec: Pick<ScenarioSpec, 'pair'>, d: InstancePair): InstancePair {
  return {prefill: spec.pair?.prefill ?? d.prefill, decode: spec.pair?.decode ?? d.decode}
}

const pairText = (p: InstancePair) => `prefill[${p.prefill}] + decode[${p.decode}]`

export function footprint(s: PlannedScenario, opts: PlanOptions = {}): ScenarioFootprint {
  // Planning compares every pair: each footprint is computed once per plan (per options object), not per comparison
  // (parsing the params each time made 1,000 scenarios take 6 s to plan).
  let known = footprints.get(opts)
  if (!known) footprints.set(opts, (known = new WeakMap()))
  let fp = known.get(s)
  if (!fp) known.set(s, (fp = footprintOf(s, opts)))
  return fp
}

const footprints = new WeakMap<PlanOptions, WeakMap<PlannedScenario, ScenarioFootprint>>()

function footprintOf(s: PlannedScenario, opts: PlanOptions): ScenarioFootprint {
  const base = s.spec.name
  if (s.spec.restart) return {exclusive: 'a restart runs alone', gpus: [], ports: [], base}
  const {fault, params} = faultScenarioOf(s)!
  return {...fault.footprint(params, opts), base}
}

const parsed = new WeakMap<ScenarioSpec, FaultScenario>()

/**
 * A fault scenario's fault and params, parsed once per scenario of the file (the planner, the runner and the judge all
 * use this one parse); undefined for a co-restart. Params are named as the file's keys in errors.
 */
export function faultScenarioOf(s: PlannedScenario): FaultScenario | undefined {
  if (s.spec.fault === undefined) return undefined
  let known = parsed.get(s.spec)
  if (!known) {
    const fault = getFault(s.spec.fault)
    known = {fault, params: parseFaultParams(fault, s.spec.params, 'file')}
    parsed.set(s.spec, known)
  }
  return known
}

/** Why two scenarios may not share a window, or undefined when they may. */
export function conflict(a: PlannedScenario, b: PlannedScenario, opts: PlanOptions = {}): string | undefined {
  const fa = footprint(a, opts)
  const fb = footprint(b, opts)
  if (fa.exclusive) return `${a.name}: ${fa.exclusive}`
  if (fb.exclusive) return `${b.name}: ${fb.exclusive}`
  if (fa.base === fb.base) return `${a.name} and ${b.name} are repetitions of one scenario`
  const [pa, pb] = [pairOfScenario(a, opts), pairOfScenario(b, opts)]
  const samePrefill = pa.prefill === pb.prefill
  if (samePrefill && pa.decode === pb.decode) return overlap(fa, fb, true, '')
  // Different pairs: each footprint's GPUs, ports and queue are its own pair's instances'. A GPU (and its KV
  // connections, its NIC) may be either instance's (discovery says which, after planning): only a shared instance
  // can make two of them one. A prefill instance's own ports and the PD queues are that instance's.
  if (!samePrefill && pa.decode !== pb.decode) return undefined
  const shared = samePrefill ? `prefill[${pa.prefill}]` : `decode[${pa.decode}]`
  return overlap(
    fa,
    fb,
    samePrefill,
    ` (${pairText(pa)} and ${pairText(pb)} share ${shared}${samePrefill ? '' : ', whose GPU it may be'})`,
  )
}

/**
 * What two footprints hold in common on instances they share: GPUs and their KV and NIC ports always (either
 * instance's); a prefill instance's own ports and the PD queue only when they share it (`samePrefill`).
 */
function overlap(fa: Footprint, fb: Footprint, samePrefill: boolean, why: string): string | undefined {
  const gpu = fa.gpus.find(g => fb.gpus.includes(g))
  if (gpu !== undefined) return `both act on GPU ${gpu}${why}`
  // A prefill instance's own ports (faults/fault.ts names them): on another prefill instance the same name is another
  // port.
  const port = fa.ports.find(x => (samePrefill || !isPrefillInstancePort(x)) && fb.ports.some(y => portsOverlap(x, y)))
  if (port !== undefined) return `both filter the same ports (${port})${why}`
  if (samePrefill && fa.queue && fb.queue && fa.queue !== fb.queue)
    return (
      `their pins sit in different queues (${fa.queue} vs ${fb.queue}): one fault would move the other's ` +
      `pins${why}`
    )
  return undefined
}

/** Expand repetitions, in file order. */
export function expand(specs: ScenarioSpec[]): PlannedScenario[] {
  const out: PlannedScenario[] = []
  for (let k = 1; k <= Math.max(...specs.map(s => s.repetitions)); k++) {
    for (const spec of specs)
      if (k <= spec.repetitions) out.push({name: k === 1 ? spec.name : `${spec.name} #${k}`, spec, repetition: k})
  }
  return out
}

/**
 * First fit, in order: each scenario joins the first batch since the last exclusive one that it does not conflict
 * with; an exclusive scenario gets its own batch and is a barrier (nothing after it moves before it).
 */
export function planBatches(scenarios: PlannedScenario[], opts: PlanOptions = {}): Batch[] {
  const steps = fitEach(scenarios, opts)
  for (;;) {
    const step = steps.next()
    if (step.done) return step.value
  }
}

/**
 * planBatches in turns: the event loop runs every ~50 ms (a SIGINT is heard; progress is shown), and a stop ends
 * it with exit 3. A plan of MAX_PLANNED_SCENARIOS takes about 2 s on a loaded machine.
 */
export async function planBatchesInTurns(
  scenarios: PlannedScenario[],
  opts: PlanOptions,
  o: {signal?: AbortSignal; onProgress?: (planned: number, of: number) => void},
): Promise<Batch[]> {
  const steps = fitEach(scenarios, opts)
  const pause = yielder()
  let lastShown = performance.now()
  for (;;) {
    const step = steps.next()
    if (step.done) return step.value
    await pause()
    throwIfStopped(o.signal, `planning (${step.value} of ${scenarios.length} scenarios placed)`)
    if (performance.now() - lastShown > 500) {
      lastShown = performance.now()
      o.onProgress?.(step.value, scenarios.length)
    }
  }
}

/** First fit, one scenario per step (the step's value: how many are placed). */
function* fitEach(scenarios: PlannedScenario[], opts: PlanOptions): Generator<number, Batch[]> {
  const batches: PlannedScenario[][] = []
  let barrier = 0
  let placed = 0
  for (const s of scenarios) {
    placed++
    if (footprint(s, opts).exclusive) {
      batches.push([s])
      barrier = batches.length
    } else {
      let fit: PlannedScenario[] | undefined
      const room = (b: PlannedScenario[]) => opts.maxPerBatch === undefined || b.length < opts.maxPerBatch
      for (let i = barrier; i < batches.length && !fit; i++) {
        if (room(batches[i]!) && batches[i]!.every(x => conflict(x, s, opts) === undefined)) fit = batches[i]
      }
      if (fit) fit.push(s)
      else batches.push([s])
    }
    yield placed
  }
  return batches.map((scenarios, index) => ({index: index + 1, scenarios}))
}

/** Every pair that shares a batch and conflicts (empty for a sound plan). Checked before any injection. */
export function planConflicts(batches: Batch[], opts: PlanOptions = {}): string[] {
  const out: string[] = []
  for (const b of batches) {
    for (let i = 0; i < b.scenarios.length; i++) {
      for (let j = i + 1; j < b.scenarios.length; j++) {
        const why = conflict(b.scenarios[i], b.scenarios[j], opts)
        if (why) out.push(`batch ${b.index}: ${b.scenarios[i].name} with ${b.scenarios[j].name}: ${why}`)
      }
    }
  }
  return out
}

export function renderPlanText(batches: Batch[], opts: PlanOptions = {}): string[] {
  return batches.map(b => {
    const what = b.scenarios.map(s => {
      const f = footprint(s, opts)
      const on = opts.showPairs && !s.spec.restart ? ` on ${pairText(pairOfScenario(s, opts))}` : ''
      const detail = s.spec.restart
        ? s.spec.restart.only
          ? `restart ${s.spec.restart.only} alone, canaries against decode's heartbeat bound`
          : `restart ${s.spec.restart.services.join('→')}`
        : `${s.spec.fault}${on}${f.gpus.length ? ` GPU ${f.gpus.join(',')}` : ''}` +
          `${f.ports.length ? ` [${f.ports.join(',')}]` : ''}${f.queue ? ` pins in ${f.queue}` : ''}`
      return `${s.name} (${detail})`
    })
    return `batch ${b.index}: ${what.join(' | ')}`
  })
}
