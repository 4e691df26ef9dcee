/**
 * The deployment file's bounds, apart from its schema (config.ts) so that a command that checks one of them (`sim up
 * --deadline`) does not load the schema's validator with it.
 */

/** The most a probe may wait (probeTimeoutSeconds). */
export const MAX_PROBE_TIMEOUT_SECONDS = 120
/** The longest watchdog deadline and poll a run can judge: the default lease of a batch (about 2.2 × (deadline + poll)
 * + 80 s, experiment/batch.ts) must stay under the lease cap (an hour, faults/lease/lease.ts); test/deployment holds
 * it. */
export const MAX_DEADLINE_SECONDS = 1200
export const MAX_POLL_SECONDS = 300
/**
 * The shortest watchdog poll and deadline, and probe timeout, pdchaos accepts: below them the loops that wait on them
 * spin (a poll of 1e-300 s is a busy loop), and no real watchdog runs that fast. 10 ms is far below any real one.
 */
export const MIN_POLL_SECONDS = 0.01
export const MIN_DEADLINE_SECONDS = 0.1
export const MIN_PROBE_TIMEOUT_SECONDS = 0.1
