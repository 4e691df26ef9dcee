import type {Contract} from '../model/run.js'
import type {CompetingTimeout} from '../model/competing.js'
import type {PinState} from '../model/timeline.js'
import type {SglangTimeouts, TimeoutSetting} from '../engines/sglang/discovery/sglang-timeouts.js'
import {PdError} from '../errors.js'
import {ExitCode} from '../exit-codes.js'

/**
 * Which of SGLang's own timeouts can release a fault's pins, and the plan-time refusal when one fires before or inside
 * the watchdog's window (the experiment could not exercise the watchdog).
 *
 * - A pin held in Bootstrapping (bootstrap queue): prefill's bootstrap timeout (its sender, from its creation), and
 *   decode's waiting timeout (decode sent its destination info, so its clock runs; its ABORT may reach prefill).
 * - A pin held after bootstrap (inflight queue): decode's waiting timeout, then its ABORT to prefill.
 * - Decode's heartbeat only where the fault can cut decode off from prefill's bootstrap server: a NIC's link taken
 *   down or its InfiniBand port disabled (a packet filter on the ZMQ or KV connections leaves /health answering).
 */

type Window = Pick<Contract, 'deadlineSeconds' | 'pollSeconds'>

/** The refusal's error code: a suite records the scenario as not run, with the reason. */
export const COMPETING_CODE = 'E_COMPETING_TIMEOUT'

/** Slack past deadline + poll within which a timeout counts as inside the window at plan time (entry offset, ε). */
export const PLAN_SLACK_SECONDS = 1

/** A default counts as read only where the reader's environment was read (and the variable was unset there). */
const knownOf = (x: TimeoutSetting): boolean => x.from !== 'default' || x.envRead === true

const CUTS_HEARTBEAT = new Set(['link-down', 'ib-port-disable'])

export function competingTimeoutsFor(
  pins: PinState | 'trials' | undefined,
  mechanism: string,
  t: SglangTimeouts | undefined,
): CompetingTimeout[] | undefined {
  if (pins === undefined || pins === 'trials') return []
  // Nothing read: none can be excluded (the eviction check then names them all as not read).
  if (!t) return undefined
  const out: CompetingTimeout[] = []
  if (pins.queue === 'bootstrap') {
    out.push({
      cause: 'bootstrap-timeout',
      name: "prefill's bootstrap timeout",
      setting: t.bootstrap.setting,
      seconds: t.bootstrap.seconds,
      source: t.bootstrap.source,
      known: knownOf(t.bootstrap),
    })
  }
  out.push({
    cause: 'waiting-timeout',
    name: "decode's waiting timeout",
    setting: t.waiting.setting,
    seconds: t.waiting.seconds,
    source: t.waiting.source,
    known: knownOf(t.waiting),
  })
  if (CUTS_HEARTBEAT.has(mechanism)) {
    out.push({
      cause: 'heartbeat',
      name: "decode's heartbeat failure",
      setting: t.heartbeat.setting,
      seconds: t.heartbeat.seconds,
      known: knownOf(t.heartbeat),
      source: `${t.heartbeat.intervalSeconds} s × ${t.heartbeat.maxFailure}: ${t.heartbeat.source}`,
    })
  }
  return out
}

/** The competitors that fire before the window's end (deadline + poll + PLAN_SLACK_SECONDS). */
export function firingInWindow(competing: CompetingTimeout[] | undefined, contract: Window): CompetingTimeout[] {
  const end = contract.deadlineSeconds + contract.pollSeconds + PLAN_SLACK_SECONDS
  return (competing ?? []).filter(c => c.seconds !== null && c.seconds <= end)
}

/** One line per competitor firing in the window, naming the setting and where it was read. */
export function competingText(c: CompetingTimeout, contract: Window): string {
  const where = c.seconds! < contract.deadlineSeconds ? 'before the watchdog deadline' : 'inside the watchdog window'
  const window = `deadline ${contract.deadlineSeconds} s + poll ${contract.pollSeconds} s`
  return `${c.name} ${c.setting} = ${c.seconds} s (read from ${c.source}) fires ${where} (${window})`
}

/** The refusal (exit 2): the experiment cannot exercise the watchdog; what to change, or how to run it anyway. */
export function competingRefusal(fault: string, firing: CompetingTimeout[], contract: Window): PdError {
  const above = contract.deadlineSeconds + contract.pollSeconds + PLAN_SLACK_SECONDS
  const which = firing.map(c => competingText(c, contract)).join('; ')
  const message = `${fault} cannot exercise the watchdog: ${which}, so SGLang would release the pins first`
  const roles = new Set(firing.map(c => (c.cause === 'bootstrap-timeout' ? 'prefill' : 'decode')))
  const servers = [...roles].join(' and ')
  const settings = firing.map(c => c.setting).join(' and ')
  const suggestion =
    `raise ${settings} above ${above} s in the environment of the ${servers} server, ` +
    'or pass --allow-competing-timeout (suite: allowCompetingTimeout: true) to run it anyway: ' +
    'those pins are then unverified'
  return new PdError(message, {exit: ExitCode.badInput, suggestion, code: COMPETING_CODE})
}
