import type {DeploymentInput} from '../deployment/config.js'
import {PdError} from '../errors.js'
import {ExitCode, type ExitCodeValue} from '../exit-codes.js'
import * as lifecycle from '../sim/lifecycle/index.js'
import {
  type EXIT_INTERRUPTED,
  SimError,
  type SimErrorKind,
  type SimUpOptions,
  type TwinDeployment,
} from '../sim/lifecycle/index.js'
import {checkWatchdogFlags, simStateDir, type WatchdogWords} from './sim-flags.js'

/**
 * The CLI's door to the twin's lifecycle (`pdchaos sim …` and `--sim`): the same calls, with the twin's errors
 * turned into the CLI's, so a command renders them with the README's exit codes like any other error.
 */

const EXIT: Record<SimErrorKind, ExitCodeValue> = {
  'bad-input': ExitCode.badInput,
  unavailable: ExitCode.unreachable,
  'cleanup-unverified': ExitCode.cleanupUnverified,
}

/**
 * A SimError as the CLI's PdError (same message, suggestion and cause; the exit code of its kind); anything else as it
 * is.
 */
export function fromSimError(error: unknown): unknown {
  if (!(error instanceof SimError)) return error
  const pd = new PdError(error.message, {exit: EXIT[error.kind], suggestion: error.suggestion, cause: error.cause})
  // Where the twin raised it, for --verbose.
  if (error.stack) pd.stack = error.stack.replace(/^SimError/, pd.name)
  return pd
}

async function translated<T>(call: () => Promise<T>): Promise<T> {
  try {
    return await call()
  } catch (error) {
    throw fromSimError(error)
  }
}

export const simUp = async (options: SimUpOptions): Promise<lifecycle.SimUpResult> => {
  checkTwinWatchdog(options.deadlineS, options.pollS)
  return translated(() => lifecycle.simUp({...options, stateDir: simStateDir(options.stateDir)}))
}

/**
 * The twin writes a deployment file for pdchaos: its watchdog must be one that file may hold (the twin checks the
 * rest). The rules are the contract's (deployment/watchdog-rules.ts); these are `sim up`'s words for them.
 */
const SIM_UP_WATCHDOG_WORDS: WatchdogWords = {
  'deadline-min': b => [
    `--deadline must be at least ${b.limit} seconds, got ${b.value}`,
    'pass a deadline in seconds, e.g. --deadline 30',
  ],
  'poll-min': b => [
    `--poll must be at least ${b.limit} seconds (10 ms; shorter is a busy loop), got ${b.value}`,
    'pass a poll interval in seconds, e.g. --poll 1',
  ],
  'deadline-max': b => [
    `--deadline must be at most ${b.limit} seconds (the longest watchdog a run can judge under its lease), ` +
      `got ${b.value}`,
    `pass --deadline ${b.limit} or less`,
  ],
  'poll-over-deadline': b => [
    `--poll (${b.value} s) is longer than --deadline (${b.limit} s)`,
    'give a poll interval at most the deadline',
  ],
}

const checkTwinWatchdog = (deadlineS: number | undefined, pollS: number | undefined): void =>
  checkWatchdogFlags({deadlineSeconds: deadlineS, pollSeconds: pollS}, SIM_UP_WATCHDOG_WORDS)

// The state dir is checked first: a file there is bad input, not "no twin is running".
export const simDown = async (stateDir: string): Promise<lifecycle.SimDownResult> =>
  translated(() => lifecycle.simDown(simStateDir(stateDir)))
export const simStatus = async (stateDir: string): Promise<lifecycle.SimStatusResult> =>
  translated(() => lifecycle.simStatus(simStateDir(stateDir)))
export const simRestart = async (
  stateDir: string,
  service: string,
  waitS?: number,
): Promise<lifecycle.SimRestartResult> => translated(() => lifecycle.simRestart(simStateDir(stateDir), service, waitS))

// Checked when compiling: an interrupted `sim up` exits with the README's "stopped", and the file the twin writes is
// one the deployment schema reads (test/sim checks that it reads back to the very same document).
type Holds<T extends true> = T
export type TwinAgreesWithCli = [
  Holds<typeof EXIT_INTERRUPTED extends typeof ExitCode.stopped ? true : false>,
  Holds<TwinDeployment extends DeploymentInput ? true : false>,
]
