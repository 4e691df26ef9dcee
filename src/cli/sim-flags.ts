import {Flags} from '@oclif/core'

import {badInput} from '../errors.js'
import {defaultSimDir} from '../state-dir.js'

/** The twin's state dir flag of `pdchaos sim …` (same env variable as the global --state-dir). */
export const stateDirFlag = Flags.string({
  summary: "The twin's state dir (default $PDCHAOS_SIM_DIR or ~/.local/state/pdchaos/sim).",
  env: 'PDCHAOS_SIM_DIR',
  default: async () => defaultSimDir(),
})

/** A number of seconds given on the command line; a non-number is bad input naming the flag. */
export function seconds(flag: string, raw: string | undefined): number | undefined {
  if (raw === undefined) return undefined
  const v = Number(raw)
  if (raw.trim() === '' || !Number.isFinite(v)) throw badInput(`${flag} must be a number of seconds, got "${raw}"`, `pass for example ${flag} 30`)
  return v
}
