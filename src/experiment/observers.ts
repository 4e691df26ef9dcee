import type {Observe} from '../faults/fault.js'
import {getFault} from '../faults/registry.js'
import type {Entry} from './entry.js'
import {observeBreaker} from './observe-breaker.js'
import {observeDecodePins} from './observe-decode-pins.js'
import {observeHealth} from './observe-health.js'
import type {ObservationKind} from './observe-kind.js'
import {observePins} from './observe-pins.js'
import {observeTrials} from './observe-trials.js'

export type {AloneKind, AloneWatch, JudgeContext, ObservationKind, ObserveContext, WindowKind} from './observe-kind.js'

/**
 * What the runner does while a fault is in place, by the fault's `observe`: one module per kind (observe-<kind>.ts),
 * chosen through OBSERVERS. The runner (batch.ts) names no kind and no fault: it asks the kind of each scenario.
 * A new kind: its module, its row in faults/fault.ts ObservePlanFields (what it adds to a plan), and one line below.
 */
export const OBSERVERS: Record<Observe, ObservationKind> = {
  pins: observePins,
  trials: observeTrials,
  health: observeHealth,
  breaker: observeBreaker,
  'decode-pins': observeDecodePins,
}

/** The kind a scenario is observed by: its fault's `observe`. */
export function kindOf(e: Entry): ObservationKind {
  return OBSERVERS[(e.scenario?.fault ?? getFault(e.plan!.fault)).observe]
}
