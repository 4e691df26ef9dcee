import {badInput} from '../../../errors.js'
import {vllmAbortMidTransfer} from './abort-mid-transfer.js'
import {vllmDropDestInfo} from './drop-dest-info.js'
import type {VllmExperiment} from './experiment.js'
import {vllmStallKv} from './stall-kv.js'
import {vllmKillDecode} from './kill-decode.js'
import {vllmWedgeRank} from './wedge-rank.js'

/**
 * Every fault pdchaos can inject into a vLLM PD deployment, by the name users type. Adding one is its experiment file
 * in this folder (its plan and record in ../faults/) and one line here; `inject`, the suite and the reports follow.
 */
export const VLLM_EXPERIMENTS: Record<string, VllmExperiment> = {
  [vllmDropDestInfo.fault]: vllmDropDestInfo,
  [vllmStallKv.fault]: vllmStallKv,
  [vllmAbortMidTransfer.fault]: vllmAbortMidTransfer,
  [vllmWedgeRank.fault]: vllmWedgeRank,
  [vllmKillDecode.fault]: vllmKillDecode,
}

export const VLLM_FAULT_NAMES = (): string[] => Object.keys(VLLM_EXPERIMENTS)

export function getVllmExperiment(name: string): VllmExperiment {
  const e = VLLM_EXPERIMENTS[name]
  if (!e)
    throw badInput(
      `${JSON.stringify(name)} is not built for vLLM deployments`,
      `use one of: ${VLLM_FAULT_NAMES().join(', ')}`,
    )
  return e
}
