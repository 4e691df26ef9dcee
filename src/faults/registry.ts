import {badInput} from '../errors.js'
import {abortMidTransfer} from './abort-mid-transfer.js'
import {dropDestInfo} from './drop-dest-info.js'
import type {Fault} from './fault.js'
import {killPrefill} from './kill-prefill.js'
import {stallKv} from './stall-kv.js'
import {tripBreaker} from './trip-breaker.js'
import {wedgeRank} from './wedge-rank.js'

/**
 * Every fault pdchaos can inject, by the name users type.
 *
 * Adding a fault is its file in src/faults/ and one line here, nothing else: the flags, the suite schema, the
 * planner (its `footprint`), the runner (its `observe` kind: pins, trials, health or breaker, each a module in
 * src/experiment/observe-*.ts chosen by experiment/observers.ts), the judge and the reports follow. No code in
 * src/suite/ or src/experiment/ names a fault. The built-in suite's scenarios are in builtin-suite.ts.
 */
export const FAULTS = {
  'drop-dest-info': dropDestInfo,
  'stall-kv': stallKv,
  'abort-mid-transfer': abortMidTransfer,
  'wedge-rank': wedgeRank,
  'trip-breaker': tripBreaker,
  'kill-prefill': killPrefill,
} as const satisfies Record<string, Fault>

export type FaultName = keyof typeof FAULTS

export const FAULT_NAMES = Object.keys(FAULTS) as FaultName[]

export function isFaultName(name: string): name is FaultName {
  return Object.hasOwn(FAULTS, name)
}

export function getFault(name: string): Fault {
  if (!isFaultName(name))
    throw badInput(`unknown fault ${JSON.stringify(name)}`, `use one of: ${FAULT_NAMES.join(', ')}`)
  return FAULTS[name] as Fault
}
