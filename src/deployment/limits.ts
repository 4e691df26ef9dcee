/**
 * The deployment file's bounds, apart from its schema (config.ts) so that a command that checks one of them (`sim up
 * --deadline`) does not load the schema's validator with it.
 */

/** The most a probe may wait (probeTimeoutSeconds). */
export const MAX_PROBE_TIMEOUT_SECONDS = 120
/** The longest watchdog deadline and poll a run can judge: the default lease of a batch (about 2.2 × (deadline + poll)
 * + 80 s, experiment/batch.ts) must stay under the lease cap (an hour, faults/lease/lease.ts); test/deployment holds it. */
export const MAX_DEADLINE_SECONDS = 1200
export const MAX_POLL_SECONDS = 300
