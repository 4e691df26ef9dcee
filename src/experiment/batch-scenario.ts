import type {FaultScenario} from '../faults/fault.js'
import type {RunSession} from './session.js'

/** One fault scenario of a batch, as the suite file or `inject` states it (batch.ts runs it, judge.ts judges it). */
export interface BatchScenario {
  /** Unique in the run. */
  name: string
  fault: string
  /** Raw params, validated against the fault's schema here (named as flags or as the file's keys in errors). */
  params: Record<string, unknown>
  pins: number
  /** Its fault and params, parsed once where the scenario was read (the suite planner); absent: parsed by the batch. */
  scenario?: FaultScenario
  /** The host whose GPU params.gpu names, where ranks on several hosts use that index (a multi-node instance). */
  gpuHost?: string
  /** The session of the instance pair it acts on (clients, calibration, discovery, hosts); absent: the batch's own. */
  session?: RunSession
  /** Where the file states that pair's two instances: labels its servers' samples where a batch spans several pairs. */
  pair?: {prefill: string; decode: string}
}
