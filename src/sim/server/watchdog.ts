import type {BugName, WatchdogScope} from '../sim-config.js'

/**
 * The watchdog under test: which held requests a poll tick evicts. Time is counted from entry into the
 * bootstrap queue (scope all) or the inflight queue (scope inflight). The defects shift the threshold.
 */
export interface Held {
  queue: 'bootstrap' | 'waiting' | 'inflight'
  bootstrapAt: number
  inflightAt?: number
}

/** lateMs: a watchdog made slower on purpose (`sim up --watchdog-late-ms`), e.g. a margin drifting across nights. */
export interface WatchdogPolicy {
  scope: WatchdogScope
  deadlineS: number
  pollS: number
  bugs: readonly BugName[]
  lateMs?: number
}

/** Seconds a request must have been held before this watchdog evicts it. */
export function evictionThresholdS(p: WatchdogPolicy): number {
  const late = (p.lateMs ?? 0) / 1000
  if (p.bugs.includes('early-evict')) return p.deadlineS / 2 + late
  if (p.bugs.includes('late-evict')) return p.deadlineS + 2 * p.pollS + late
  return p.deadlineS + late
}

/** How long `h` has been held in the watched queues at `now` (ms), or undefined when it is not watched. */
export function heldMs(p: WatchdogPolicy, h: Held, now: number): number | undefined {
  if (p.scope === 'off') return undefined
  if (p.scope === 'inflight')
    return h.queue === 'inflight' && h.inflightAt !== undefined ? now - h.inflightAt : undefined
  return now - h.bootstrapAt
}

export function shouldEvict(p: WatchdogPolicy, h: Held, now: number): boolean {
  const held = heldMs(p, h, now)
  return held !== undefined && held >= evictionThresholdS(p) * 1000
}
