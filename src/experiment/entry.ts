import type {FaultPlan, FaultScenario} from '../faults/fault.js'
import type {CompetingTimeout} from '../model/competing.js'
import type {LeaseRecord} from '../model/run.js'
import type {BatchScenario} from './batch-scenario.js'
import type {Calibrated} from './session.js'

/** What one scenario of the batch holds while it runs. */
export interface Entry {
  s: BatchScenario
  /** Its fault and params, parsed once (absent: they could not be, and `error` says why). */
  scenario?: FaultScenario
  plan?: FaultPlan
  lease?: LeaseRecord
  error?: string
  startedAt: number
  /** Its own pair's calibration, where the batch spans several pairs (each measured on its own servers). */
  calibration?: Calibrated
  /**
   * Its pair's servers (their paths in the file), where the batch spans several pairs: its view keeps their samples
   * only.
   */
  instances?: {prefill: string; decode: string}
  /** The same fault on the other nodes of a multi-node instance (Fault.onEveryNode), each under its own lease there. */
  parts?: EntryPart[]
  /** SGLang's own timeouts that could release its pins (experiment/competing.ts), as discovery read them. */
  competing?: CompetingTimeout[]
  /** Run although one of them fires before the window closes (--allow-competing-timeout). */
  competingAllowed?: boolean
}

/** The fault on one more node of an instance: its own plan, host and lease. */
export interface EntryPart {
  host: string
  plan: FaultPlan
  lease?: LeaseRecord
}

/** Every lease of a scenario: its own, then one per other node it acts on. */
export const leasesOf = (e: Entry): LeaseRecord[] =>
  [e.lease, ...(e.parts ?? []).map(p => p.lease)].filter((l): l is LeaseRecord => l !== undefined)

/** The scenario's fault took effect everywhere it acts (each node's lease verified). */
export const injectedEverywhere = (e: Entry): boolean =>
  leasesOf(e).length === 1 + (e.parts?.length ?? 0) && leasesOf(e).every(l => l.verifiedInjected)
