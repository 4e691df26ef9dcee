import {badInput} from '../errors.js'
import type {Fault} from './fault.js'

/**
 * A fault's params, read from its one zod schema: what the CLI derives flags from, what the suite file's `params`
 * are validated against, and the one validation both go through (so bounds are stated once, and a param that does
 * not apply to the fault is refused naming the fault).
 */

export type ParamKind =
  | {type: 'integer' | 'number'; min?: number; max?: number}
  | {type: 'enum'; options: string[]}
  | {type: 'boolean'}

export interface ParamInfo {
  key: string
  /** The oclif flag: kebab-case of the key unless the fault names it. */
  flag: string
  kind: ParamKind
  description: string
  default?: unknown
}

/** Where raw params came from: named as flags (`--gpu`) or as the suite file's keys (`params.gpu`). */
export type ParamSource = 'flags' | 'file'

interface ZodLike {
  description?: string
  _zod: {def: {type: string; innerType?: ZodLike; defaultValue?: unknown; entries?: Record<string, string>}}
  minValue?: number | null
  maxValue?: number | null
  isInt?: boolean
}

const kebab = (key: string): string => key.replace(/[A-Z]/g, c => `-${c.toLowerCase()}`)

function kindOf(schema: ZodLike): ParamKind {
  const t = schema._zod.def.type
  if (t === 'number') {
    const n = schema
    return {
      type: n.isInt ? 'integer' : 'number',
      ...(Number.isFinite(n.minValue) ? {min: n.minValue!} : {}),
      ...(Number.isFinite(n.maxValue) ? {max: n.maxValue!} : {}),
    }
  }
  if (t === 'enum') return {type: 'enum', options: Object.values(schema._zod.def.entries ?? {})}
  if (t === 'boolean') return {type: 'boolean'}
  throw new Error(`param schema type ${t} is not supported: use a number, an enum or a boolean`)
}

export function paramsOf(fault: Fault): ParamInfo[] {
  return Object.entries(fault.params.shape).map(([key, raw]) => {
    let s = raw as unknown as ZodLike
    const description = s.description ?? ''
    let dflt: unknown
    while (s._zod.def.type === 'optional' || s._zod.def.type === 'default') {
      if (s._zod.def.type === 'default') dflt = s._zod.def.defaultValue
      s = s._zod.def.innerType!
    }
    return {
      key,
      flag: fault.flagNames?.[key] ?? kebab(key),
      kind: kindOf(s),
      description: s.description ?? description,
      ...(dflt === undefined ? {} : {default: dflt}),
    }
  })
}

function describeKind(k: ParamKind): string {
  if (k.type === 'enum') return `one of ${k.options.join(', ')}`
  if (k.type === 'boolean') return 'true or false'
  const what = k.type === 'integer' ? 'an integer' : 'a number'
  if (k.min !== undefined && k.max !== undefined) return `${what} from ${k.min} to ${k.max}`
  if (k.min !== undefined) return `${what} of at least ${k.min}`
  return what
}

function check(info: ParamInfo, raw: unknown): {value: unknown} | {why: string} {
  const k = info.kind
  if (k.type === 'enum') {
    if (typeof raw === 'string' && k.options.includes(raw)) return {value: raw}
  } else if (k.type === 'boolean') {
    if (typeof raw === 'boolean') return {value: raw}
    if (raw === 'true' || raw === 'false') return {value: raw === 'true'}
  } else {
    const n = typeof raw === 'string' && raw.trim() !== '' ? Number(raw) : raw
    if (
      typeof n === 'number' &&
      Number.isFinite(n) &&
      (k.type === 'number' || Number.isInteger(n)) &&
      (k.min === undefined || n >= k.min) &&
      (k.max === undefined || n <= k.max)
    )
      return {value: n}
  }
  return {why: `must be ${describeKind(k)} (got ${JSON.stringify(raw)})`}
}

/** A value in range for a param, written as its source takes it: `--trials 6`, `params.trials: 6`. */
function example(info: ParamInfo, label: string, source: ParamSource): string {
  const k = info.kind
  const v = info.default ?? (k.type === 'enum' ? k.options[0] : k.type === 'boolean' ? true : (k.min ?? 1))
  return source === 'flags' ? `pass for example ${label} ${String(v)}` : `write for example ${label}: ${String(v)}`
}

/** One thing wrong with a fault's params: the param it concerns (when one does) and a one-line message. */
export interface ParamIssue {
  key?: string
  message: string
  suggestion?: string
}

/**
 * Validate raw params for one fault: unknown keys are refused naming the fault and what it takes; each value
 * against its bounds; then the fault's cross-param rules. Undefined values count as not given.
 */
export function checkFaultParams<P>(
  fault: Fault<P>,
  raw: Record<string, unknown>,
  source: ParamSource,
): {params: P} | {issue: ParamIssue} {
  const infos = paramsOf(fault)
  const label = (key: string): string => {
    const info = infos.find(i => i.key === key)
    return source === 'flags' ? `--${info?.flag ?? kebab(key)}` : `params.${key}`
  }
  const out: Record<string, unknown> = {}
  for (const [key, value] of Object.entries(raw)) {
    if (value === undefined) continue
    const info = infos.find(i => i.key === key)
    if (!info) {
      const takes = infos.length ? infos.map(i => label(i.key)).join(', ') : 'no parameters'
      return {issue: {key, message: `${fault.name} takes no ${label(key)}`, suggestion: `${fault.name} takes ${takes}`}}
    }
    const c = check(info, value)
    if ('why' in c)
      return {
        issue: {key, message: `${fault.name}: ${label(key)} ${c.why}`, suggestion: example(info, label(key), source)},
      }
    out[key] = c.value
  }
  const parsed = fault.params.safeParse(out)
  if (!parsed.success)
    return {issue: {message: `${fault.name}: ${parsed.error.issues[0]?.message ?? 'invalid params'}`}}
  const params = parsed.data as P
  const rule = fault.refine?.(params, label)
  if (rule) return {issue: {key: rule.key, message: `${fault.name} ${rule.why}`}}
  return {params}
}

/** checkFaultParams, or a badInput (exit 2) with its message. */
export function parseFaultParams<P>(fault: Fault<P>, raw: Record<string, unknown>, source: ParamSource = 'flags'): P {
  const r = checkFaultParams(fault, raw, source)
  if ('issue' in r) throw badInput(r.issue.message, r.issue.suggestion)
  return r.params
}
