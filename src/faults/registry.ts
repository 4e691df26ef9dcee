import {badInput} from '../errors.js'
import {abortMidTransfer} from './abort-mid-transfer.js'
import {dropDestInfo} from './drop-dest-info.js'
import type {Fault, FaultName} from './fault.js'
import {stallKv} from './stall-kv.js'

/** Every fault pdchaos can inject, by the name users type. */
export const FAULTS: {[K in FaultName]: Fault<any>} = {
  'drop-dest-info': dropDestInfo,
  'stall-kv': stallKv,
  'abort-mid-transfer': abortMidTransfer,
}

export const FAULT_NAMES = Object.keys(FAULTS) as FaultName[]

export function isFaultName(name: string): name is FaultName {
  return Object.hasOwn(FAULTS, name)
}

export function getFault(name: string): Fault<unknown> {
  if (!isFaultName(name)) throw badInput(`unknown fault ${JSON.stringify(name)}`, `use one of: ${FAULT_NAMES.join(', ')}`)
  return FAULTS[name] as Fault<unknown>
}
