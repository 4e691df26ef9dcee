import {Flags, type Interfaces} from '@oclif/core'

import {badInput} from '../errors.js'
import {paramsOf, type ParamInfo} from '../faults/params.js'
import {FAULT_NAMES, getFault} from '../faults/registry.js'

/**
 * `pdchaos inject`'s fault flags, derived from the faults' param schemas: one flag per param name across the faults,
 * its help naming the faults it applies to. Values are validated once, by the fault's schema (parseFaultParams),
 * which also refuses a flag that does not apply to the chosen fault.
 */

interface FlagSource {
  info: ParamInfo
  faults: string[]
}

function sources(): Map<string, FlagSource> {
  const byFlag = new Map<string, FlagSource>()
  for (const name of FAULT_NAMES) {
    for (const info of paramsOf(getFault(name))) {
      const s = byFlag.get(info.flag)
      if (s) s.faults.push(name)
      else byFlag.set(info.flag, {info, faults: [name]})
    }
  }
  return byFlag
}

function helpValue(info: ParamInfo): string | undefined {
  const k = info.kind
  if (k.type !== 'integer' && k.type !== 'number') return undefined
  return k.min !== undefined && k.max !== undefined ? `<${k.min}-${k.max}>` : `<${k.type}>`
}

function summaryOf(s: FlagSource): string {
  // Each fault's own description, prefixed with its name where the text does not already start with one.
  const texts = s.faults.map(f => {
    const d = paramsOf(getFault(f)).find(i => i.flag === s.info.flag)?.description ?? ''
    return d.startsWith(`${f}:`) ? d : `${f}: ${d}`
  })
  return [...new Set(texts)].join(' ')
}

/** Every value the flag takes for any fault (each fault checks its own). */
function enumOptions(s: FlagSource, flag: string): string[] {
  return [
    ...new Set(
      s.faults.flatMap(f => {
        const k = paramsOf(getFault(f)).find(i => i.flag === flag)?.kind
        return k?.type === 'enum' ? k.options : []
      }),
    ),
  ]
}

export function faultFlags(): Record<string, Interfaces.OptionFlag<string | undefined>> {
  const out: Record<string, Interfaces.OptionFlag<string | undefined>> = {}
  for (const [flag, s] of sources()) {
    const k = s.info.kind
    // A boolean param is a switch (`--allow-link-down`): given means true.
    if (k.type === 'boolean') {
      out[flag] = Flags.boolean({helpGroup: 'FAULT', summary: summaryOf(s)}) as unknown as Interfaces.OptionFlag<
        string | undefined
      >
      continue
    }
    out[flag] =
      k.type === 'enum'
        ? (Flags.string({
            helpGroup: 'FAULT',
            summary: summaryOf(s),
            options: enumOptions(s, flag),
          }) as Interfaces.OptionFlag<string | undefined>)
        : (Flags.string({
            helpGroup: 'FAULT',
            summary: summaryOf(s),
            ...(helpValue(s.info) ? {helpValue: helpValue(s.info)} : {}),
          }) as Interfaces.OptionFlag<string | undefined>)
  }
  return out
}

/**
 * The fault params the user gave, keyed by param name (what parseFaultParams and the suite file use). A flag of
 * another fault is refused here, by the name the user typed (a param key can differ from its flag: widen-kbytes).
 */
export function faultParamsFromFlags(flags: Record<string, unknown>, fault: string): Record<string, unknown> {
  const raw: Record<string, unknown> = {}
  for (const [flag, s] of sources()) {
    // A switch not given may read as false: only a given one is a param (other faults take no such flag).
    if (flags[flag] === undefined || (s.info.kind.type === 'boolean' && flags[flag] === false)) continue
    if (!s.faults.includes(fault)) {
      const takes = paramsOf(getFault(fault)).map(i => `--${i.flag}`)
      throw badInput(
        `${fault} takes no --${flag}`,
        `${fault} takes ${takes.length ? takes.join(', ') : 'no fault flags'}`,
      )
    }
    raw[s.info.key] = flags[flag]
  }
  return raw
}
