import type {ScenarioRun} from '../model/run.js'
import type {Recorder} from '../workload/recorder.js'
import type {SampledServer} from '../workload/sampler.js'
import type {SendOptions, Sent} from '../workload/send.js'
import type {PairInBatch} from './batch-pairs.js'
import type {BatchScenario} from './batch-scenario.js'
import type {BatchSettings} from './batch-settings.js'
import type {Entry} from './entry.js'
import type {Calibrated, RunSession} from './session.js'

/** The shape of an observation kind (experiment/observers.ts holds the table of them). */

/** What a kind may use while the batch runs. */
export interface ObserveContext {
  /** The batch's own session (its router carries the steady load). */
  session: RunSession
  pairs: PairInBatch[]
  pairOf: (s: BatchScenario) => PairInBatch
  rec: Recorder
  settings: BatchSettings
  /** The batch's stop: aborted when a stop condition fires. */
  signal: AbortSignal
  calibration: Calibrated
  /** The batch's sampled servers (a kind may take a reading of its own: sampleOnce). */
  servers: SampledServer[]
  /** How long one request of the batch may take. */
  requestTimeoutMs: number
}

/** What the kinds of one verdict pass share: requests of the whole batch the watchdog could have evicted. */
export interface JudgeContext {
  batchPins: number
}

interface KindBase {
  /** Its requests move the watchdog's eviction counter: recovery checks that counter's balance only then. */
  countsEvictions: boolean
  /** Its verdicts on the scenario's own view of the timeline (run.timeline), once its fault took effect. */
  judge(run: ScenarioRun, e: Entry, j: JudgeContext): void
}

/** A kind whose scenarios send requests in the batch's one shared window (several scenarios at once). */
export interface WindowKind extends KindBase {
  share: 'window'
  /** What it sends, for the "sending pins:" line ("2 pin(s)", "6 abort trials"). */
  sends(e: Entry): string
  /** Send its requests (each through `send`, recorded in `sent`), paced; ends when all are sent. */
  send(e: Entry, o: WindowSend): Promise<void>
}

export interface WindowSend {
  ctx: ObserveContext
  /** Send one request of this scenario to its pair's servers, with the fields every pin carries. */
  send: (o: Partial<SendOptions>) => Sent
  sent: (s: Sent) => void
  /** The pair's clients, for what a kind sends beside its requests (an abort). */
  own: RunSession
  /** Stops sending. */
  stop: AbortSignal
}

/** A kind that watches the deployment for its one scenario, which the planner runs alone. */
export interface AloneKind extends KindBase {
  share: 'alone'
  /** Start watching before the fault is injected (mode run only). */
  watch(e: Entry, ctx: ObserveContext): Promise<AloneWatch>
}

export interface AloneWatch {
  /** With the fault in place (injected and verified): observe it. */
  hold(): Promise<void>
  /** After the revert. */
  afterRevert(): Promise<void>
  /** End every probe it runs (on every exit path). */
  stop(): Promise<void>
}

export type ObservationKind = WindowKind | AloneKind
