import type {Host} from '../../../hosts/host.js'
import type {ScenarioRun} from '../../../model/run.js'
import type {VllmDeployment} from '../deployment-file.js'
import type {VllmStatusReport} from '../discover.js'

/**
 * A vLLM experiment: one fault mapped onto vLLM's hand-over (issue 31 item 3), its observation and its judgement.
 * `prepare` reads (the discovery report, the host) and changes nothing: it returns the plan as lines and a `run`
 * that acts, observes, reverts on every exit path (a fault installed on the host is held under a lease, as the
 * SGLang faults' are) and returns the scenario in the run model (model/run.ts), so the journal, JUnit, HTML and the
 * suite render it with the engine named. Adding a vLLM fault is its experiment file and one line in registry.ts.
 */

export interface VllmContext {
  /** The deployment file's path, as given. */
  file: string
  deployment: VllmDeployment
  host: Host
  /** What discovery read before the run: P's and D's pids, titles, lease contract, health. */
  discovery: VllmStatusReport
  signal: AbortSignal
  progress: (line: string) => void
}

/** What a user asked for on the command line or in a suite entry; each experiment takes what applies to it. */
export interface VllmFaultOptions {
  /** Requests to pin (--pins); undefined: the experiment's own default. */
  requests?: number
  /** --gpu: a rank's GPU (the TP rank on its instance). */
  gpu?: number
  /** --side: prefill or decode. */
  side?: 'prefill' | 'decode'
  /** --mechanism, where the fault has several. */
  mechanism?: string
  /** --ttl: the fault lease's TTL in seconds, when the user set one. */
  ttlS?: number
}

export type VllmPrepared =
  | {
      /** The plan as a person reads it (dry run, and the head of a run). */
      lines: string[]
      /** The plan as data (the dry run's --json). */
      plan: unknown
      run: () => Promise<ScenarioRun>
    }
  | {refusal: string; hint: string}

export interface VllmExperiment {
  /** The name users type (`pdchaos inject <fault>`, a suite entry's `fault:`). */
  fault: string
  /** One line: what it does to vLLM and what it proves. */
  summary: string
  /** Flags of `inject` this experiment reads; any other fault flag given is refused as not applying. */
  takes: readonly (keyof VllmFaultOptions)[]
  prepare(ctx: VllmContext, opts: VllmFaultOptions): Promise<VllmPrepared>
}
