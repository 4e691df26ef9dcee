import type {ParamSource} from '../faults/params.js'
import type {Recorder} from '../workload/recorder.js'

/** How one batch runs (runBatch, experiment/batch.ts): what the suite runner or `inject` asks of it. */
export interface BatchSettings {
  /**
   * run: the whole experiment; dry-run: plan and read-only probes only; hold: inject, verify, leave it to its lease.
   */
  mode: 'run' | 'dry-run' | 'hold'
  promptTokens: number
  /** Steady load: one request every loadIntervalMs while the batch runs (0: none). */
  loadIntervalMs: number
  canaries: number
  /** direct (default): each pin is one prefill request, sent to prefill and decode once. router: through the router,
   * as a client would send it — a retrying gateway then sends an evicted pin again and the verdicts judge the router,
   * not one request (kept to show exactly that). */
  pinPath?: 'direct' | 'router'
  /** Pins are sent `burst` at a time, `gapMs` apart: a burst queues at the server and blurs each pin's entry time. */
  pinPacing: {burst: number; gapMs: number}
  /** Lease TTL override (ms); default from the contract and the batch's window. */
  ttlMs?: number
  paramsSource: ParamSource
  /** A scenario that cannot be planned: thrown (inject: exit 2 naming why) or recorded as its error (suite). */
  planErrors: 'throw' | 'record'
  /**
   * Run a scenario although one of SGLang's own timeouts fires before its window closes (`--allow-competing-timeout`):
   * its pins released inside the window are unverified by construction. Default: refused at plan time.
   */
  allowCompetingTimeout?: boolean
  /**
   * The caller stops the batch on SIGINT or SIGTERM itself (through `signal`): the lease guards then leave the first
   * signal to it, so the batch reverts and the run is recorded; a second signal is theirs (revert and exit).
   */
  callerStopsOnSignal?: boolean
  /** Aborted when a stop condition fires: the batch stops waiting and reverts at once. */
  signal?: AbortSignal
  say: (line: string) => void
  /** Told when the batch has its recorder (the collateral stop condition reads it live). */
  onRecorder?: (rec: Recorder | undefined) => void
  /** A countdown to the batch's window close (for a spinner). */
  onDeadline?: (label: string, at: number) => void
}
