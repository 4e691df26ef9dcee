import type {Observation} from './timeline.js'
import type {Verdict} from './verdict.js'

/** What a co-restart did and saw: each step behind its health gate, the canaries, the pin watch, its verdicts. */

export type ServiceName = 'prefill' | 'decode' | 'router'

export interface RestartStep {
  service: ServiceName
  /** Where the file lists several instances of the role: which one this step restarted (services.prefill[1]). */
  instance?: string
  command: string[]
  exitCode: number | null
  /** A multi-node instance: the command's exit on each node, node rank 0 first (all started together). */
  nodes?: Array<{host: string; exitCode: number | null}>
  commandMs: number
  /** From the restart command's start to the first healthy answer; null when the gate timed out. */
  healthyAfterMs: number | null
  lastHealth?: {ok: boolean; status?: number; ms: number; error?: string}
}

export interface WatchSample {
  atS: number
  inflight?: number
  bootstrap?: number
  decodeRunning?: number
  line: string
}

/** One canary after a role restarted alone: through the router or direct to the pair, timed from the role's health. */
export interface CanaryOutcome {
  rid: string
  path: 'router' | 'direct'
  /** Seconds after the restarted role was healthy. */
  sentAfterS: number
  status: number | null
  /** Seconds the answer took (null: abandoned at our deadline). */
  tookS: number | null
  /** A router canary the gateway refused before any worker saw it (503, no available server: its breaker open). */
  refusedByGateway?: true
}

/** `restart --only ROLE`: the canaries after the role's health gate, judged against decode's heartbeat bound. */
export interface AloneRecovery {
  role: 'prefill' | 'decode'
  healthyAt: number
  /** Decode's heartbeat from its environment; absent when it could not be read (the verdict is then unverified). */
  heartbeat?: {intervalSeconds: number; maxFailure: number; boundSeconds: number; source: string}
  canaries: CanaryOutcome[]
  /** The co-restart run afterwards to bring a deployment the role's restart left broken back (its steps' names). */
  repaired?: string[]
}

export interface RestartResult {
  steps: RestartStep[]
  totalMs: number
  canaries: Array<{rid: string; status: number | null; ms: number}>
  watch: {
    samples: WatchSample[]
    requests: Array<{rid: string; sentAtS: number; status: number | null; ms: number | null}>
  }
  verdicts: Verdict[]
  observations: Observation[]
  /** `restart --only ROLE` only. */
  alone?: AloneRecovery
}
