import type {Watchdog} from '../deployment/config.js'
import {badInput} from '../errors.js'

/**
 * Time a run needs after the lease starts and before the pins' window opens: inject, verify, send the pins. Measured
 * under 0.3 s over SSH (BENCHMARKS.md, Faults); 3 s leaves a slow host ten times that.
 */
const SETUP_SECONDS = 3

/**
 * The shortest lease TTL a judged run can use: the fault must stay in place while the pins' window (deadline + poll)
 * and the runner's margin past it (at least 2 s, 20 % of the window) pass. A shorter lease reverts the fault under the
 * pins, and the run would blame the deployment ("the fault did not take effect") for a bad flag.
 */
export function minRunTtlSeconds(w: Pick<Watchdog, 'deadlineSeconds' | 'pollSeconds'>): number {
  const window = w.deadlineSeconds + w.pollSeconds
  return Math.ceil(window + Math.max(2, window * 0.2) + SETUP_SECONDS)
}

/** --ttl against the deployment's watchdog (a held fault may have any TTL: nothing is judged). */
export function checkRunTtl(
  ttlSeconds: number | undefined,
  w: Pick<Watchdog, 'deadlineSeconds' | 'pollSeconds'>,
  mode: 'run' | 'hold' | 'dry-run',
): void {
  if (ttlSeconds === undefined || mode !== 'run') return
  const min = minRunTtlSeconds(w)
  if (ttlSeconds < min) {
    throw badInput(
      `--ttl ${ttlSeconds} is shorter than the run needs: ${min} s (watchdog deadline ${w.deadlineSeconds} s + ` +
        `poll ${w.pollSeconds} s + margin and setup)`,
      `pass --ttl ${min} or more, or leave --ttl out (the default fits the watchdog)`,
    )
  }
}
