import {
  MAX_DEADLINE_SECONDS,
  MAX_POLL_SECONDS,
  MIN_DEADLINE_SECONDS,
  MIN_POLL_SECONDS,
} from '../../../deployment/limits.js'

/**
 * The one home of the watchdog contract's rules: each bound on the deadline and the poll (limits.ts), and the rule no
 * single field can say, poll <= deadline (a watchdog that polls less often than its deadline gives an eviction window
 * wider than the deadline itself, which no check can judge as a deadline). The deployment loader (load.ts), the
 * schema's bounds (config.ts, from the same limits) and the CLI's flags (`--sim-deadline`, `sim up --deadline`) all
 * ask this function and only word its answer for their own input. The twin keeps its own copy behind its wall.
 */
export type WatchdogRuleBreak =
  | {rule: 'deadline-min' | 'deadline-max'; value: number; limit: number}
  | {rule: 'poll-min' | 'poll-max'; value: number; limit: number}
  | {rule: 'poll-over-deadline'; value: number; limit: number}

/** A deadline and a poll in seconds; either may be missing (a flag not given): its rules are then not checked. */
export interface WatchdogTiming {
  deadlineSeconds?: number
  pollSeconds?: number
}

/**
 * Every rule `t` breaks, in the order a user fixes them: the deadline's minimum, the poll's minimum, the deadline's
 * maximum, the poll's maximum, then poll <= deadline (only when both are given). A non-number (NaN) breaks the minimum.
 */
export function watchdogRuleBreaks(t: WatchdogTiming): WatchdogRuleBreak[] {
  const out: WatchdogRuleBreak[] = []
  const d = t.deadlineSeconds
  const p = t.pollSeconds
  if (d !== undefined && !(d >= MIN_DEADLINE_SECONDS))
    out.push({rule: 'deadline-min', value: d, limit: MIN_DEADLINE_SECONDS})
  if (p !== undefined && !(p >= MIN_POLL_SECONDS)) out.push({rule: 'poll-min', value: p, limit: MIN_POLL_SECONDS})
  if (d !== undefined && d > MAX_DEADLINE_SECONDS)
    out.push({rule: 'deadline-max', value: d, limit: MAX_DEADLINE_SECONDS})
  if (p !== undefined && p > MAX_POLL_SECONDS) out.push({rule: 'poll-max', value: p, limit: MAX_POLL_SECONDS})
  if (d !== undefined && p !== undefined && p > d) out.push({rule: 'poll-over-deadline', value: p, limit: d})
  return out
}
