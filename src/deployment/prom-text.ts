import {PdError} from '../errors.js'
import {ExitCode} from '../exit-codes.js'

/**
 * A small parser for the Prometheus text exposition format and OpenMetrics 1.0, as SGLang (prometheus_client),
 * the router and prom-client serve them. No package fits: the candidates lose the
 * labels of labelled histograms or reject `sglang:`/`vllm:` names and NaN.
 *
 * Output is flat: one sample per line, with its family. Timestamps are normalised to epoch milliseconds
 * (the text format writes ms, OpenMetrics writes seconds). Exemplars are dropped.
 */

export type MetricType =
  | 'counter'
  | 'gauge'
  | 'histogram'
  | 'summary'
  | 'untyped'
  | 'unknown'
  | 'gaugehistogram'
  | 'info'
  | 'stateset'
const TYPES = new Set<string>([
  'counter',
  'gauge',
  'histogram',
  'summary',
  'untyped',
  'unknown',
  'gaugehistogram',
  'info',
  'stateset',
])

export type Labels = Record<string, string>

export interface Sample {
  name: string
  labels: Labels
  value: number
  /** Epoch milliseconds, when the line carried a timestamp. */
  timestamp?: number
  /**
   * The family this sample belongs to (name minus _bucket/_count/_sum/_total/_created when that family is declared).
   */
  family: string
}

export interface Family {
  name: string
  type: MetricType
  help?: string
  unit?: string
}

export interface ParsedMetrics {
  format: 'text' | 'openmetrics'
  samples: Sample[]
  families: Family[]
}

export interface ParseOptions {
  /** Force OpenMetrics (e.g. from the content-type); otherwise a `# EOF` line says so. */
  openMetrics?: boolean
  /** Named in errors: "prefill /metrics". */
  source?: string
}

const NAME = /^[a-zA-Z_:][a-zA-Z0-9_:]*/
const LABEL_NAME = /^[a-zA-Z_][a-zA-Z0-9_]*/
const SUFFIXES = ['_bucket', '_count', '_sum', '_total', '_created', '_gcount', '_gsum', '_info']

class LineError extends Error {}

export function parsePromText(text: string, opts: ParseOptions = {}): ParsedMetrics {
  const lines = text.split('\n')
  const openMetrics = opts.openMetrics ?? lines.some(l => l.replace(/\r$/, '') === '# EOF')
  const families = new Map<string, Family>()
  const raw: Array<Omit<Sample, 'family'>> = []
  let eofAt = 0
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i].replace(/\r$/, '')
    if (eofAt) {
      if (line.trim() !== '') throw malformed(opts, i + 1, `content after "# EOF" (line ${eofAt})`, line)
      continue
    }
    try {
      if (line.trim() === '') continue
      if (line.startsWith('#')) {
        if (line === '# EOF') {
          eofAt = i + 1
          continue
        }
        metaLine(line, families, openMetrics)
        continue
      }
      raw.push(sampleLine(line, openMetrics))
    } catch (error) {
      if (error instanceof LineError) throw malformed(opts, i + 1, error.message, line)
      throw error
    }
  }
  const samples = raw.map(s => ({...s, family: familyOf(s.name, families)}))
  // Samples of undeclared families still have a family, of type untyped.
  for (const s of samples) if (!families.has(s.family)) families.set(s.family, {name: s.family, type: 'untyped'})
  return {format: openMetrics ? 'openmetrics' : 'text', samples, families: [...families.values()]}
}

function malformed(opts: ParseOptions, lineNo: number, what: string, line: string): PdError {
  const quoted = line.length > 80 ? JSON.stringify(line.slice(0, 80)) + '…' : JSON.stringify(line)
  return new PdError(
    `malformed metrics${opts.source ? ` from ${opts.source}` : ''} at line ${lineNo}: ${what}: ${quoted}`,
    {
      exit: ExitCode.unreachable,
      code: 'E_METRICS',
      suggestion: 'check that the URL serves Prometheus text format (a proxy or another service may be answering)',
    },
  )
}

/** `# HELP name text`, `# TYPE name type`, `# UNIT name unit`; any other comment is ignored. */
function metaLine(line: string, families: Map<string, Family>, openMetrics: boolean): void {
  const m = /^#[ \t]+(HELP|TYPE|UNIT)[ \t]+(\S+)(?:[ \t]+(.*))?$/.exec(line)
  if (!m) {
    if (/^#[ \t]*(HELP|TYPE|UNIT)\b/.test(line))
      throw new LineError(`incomplete ${line.replace(/^#\s*/, '').split(/\s/)[0]} line`)
    return // a plain comment
  }
  const [, kind, name, rest = ''] = m
  if (!NAME.test(name) || NAME.exec(name)![0] !== name)
    throw new LineError(`invalid metric name ${JSON.stringify(name)}`)
  const fam = families.get(name) ?? {name, type: 'untyped' as MetricType}
  if (kind === 'HELP') {
    fam.help = openMetrics ? unescapeHelp(rest, true) : unescapeHelp(rest, false)
  } else if (kind === 'UNIT') {
    fam.unit = rest.trim()
  } else {
    const type = rest.trim()
    if (!TYPES.has(type)) throw new LineError(`unknown metric type ${JSON.stringify(type)}`)
    if (families.has(name) && fam.type !== 'untyped' && fam.type !== type)
      throw new LineError(`second TYPE for ${name} (${fam.type}, then ${type})`)
    fam.type = type as MetricType
  }
  families.set(name, fam)
}

/** HELP escapes: \\ and \n (and \" in OpenMetrics). */
function unescapeHelp(s: string, quotes: boolean): string {
  return s.replace(/\\([\\n"])/g, (all, c: string) => (c === 'n' ? '\n' : c === '"' && !quotes ? all : c))
}

function sampleLine(line: string, openMetrics: boolean): Omit<Sample, 'family'> {
  const nameMatch = NAME.exec(line)
  if (!nameMatch) throw new LineError('expected a metric name')
  const name = nameMatch[0]
  let pos = name.length
  let labels: Labels = {}
  if (line[pos] === '{') {
    const parsed = parseLabels(line, pos + 1)
    labels = parsed.labels
    pos = parsed.end
  }
  let rest = line.slice(pos)
  if (rest !== '' && !/^[ \t]/.test(rest))
    throw new LineError(`unexpected ${JSON.stringify(rest[0])} after the metric name`)
  // An OpenMetrics exemplar follows " # ": drop it (the labels, where "#" may be quoted, are already consumed).
  const hash = rest.indexOf('#')
  if (hash >= 0) {
    if (!openMetrics && !/[ \t]$/.test(rest.slice(0, hash))) throw new LineError('unexpected "#"')
    rest = rest.slice(0, hash)
  }
  const tokens = rest
    .trim()
    .split(/[ \t]+/)
    .filter(Boolean)
  if (tokens.length === 0) throw new LineError('missing value')
  if (tokens.length > 2) throw new LineError(`unexpected ${JSON.stringify(tokens[2])} after the value and timestamp`)
  const value = parseValue(tokens[0])
  const sample: Omit<Sample, 'family'> = {name, labels, value}
  if (tokens.length === 2) sample.timestamp = parseTimestamp(tokens[1], openMetrics)
  return sample
}

/** Labels from just after "{" to the matching "}", with the escapes \\ \" \n in values. */
function parseLabels(line: string, start: number): {labels: Labels; end: number} {
  const labels: Labels = {}
  let pos = start
  const skipSpace = () => {
    while (line[pos] === ' ' || line[pos] === '\t') pos++
  }
  for (;;) {
    skipSpace()
    if (line[pos] === '}') return {labels, end: pos + 1}
    const nameMatch = LABEL_NAME.exec(line.slice(pos))
    if (!nameMatch)
      throw new LineError(pos >= line.length ? 'unterminated label set' : `invalid label name at column ${pos + 1}`)
    const labelName = nameMatch[0]
    pos += labelName.length
    skipSpace()
    if (line[pos] !== '=') throw new LineError(`expected "=" after label ${labelName}`)
    pos++
    skipSpace()
    if (line[pos] !== '"') throw new LineError(`expected a quoted value for label ${labelName}`)
    pos++
    let value = ''
    for (;;) {
      const c = line[pos]
      if (c === undefined) throw new LineError(`unterminated value of label ${labelName}`)
      if (c === '"') break
      if (c === '\\') {
        const e = line[pos + 1]
        if (e === '\\') value += '\\'
        else if (e === '"') value += '"'
        else if (e === 'n') value += '\n'
        else throw new LineError(`invalid escape "\\${e ?? ''}" in label ${labelName}`)
        pos += 2
        continue
      }
      value += c
      pos++
    }
    pos++ // the closing quote
    if (Object.hasOwn(labels, labelName)) throw new LineError(`label ${labelName} appears twice`)
    // defineProperty: a label named __proto__ must stay a label.
    Object.defineProperty(labels, labelName, {value, enumerable: true, writable: true, configurable: true})
    skipSpace()
    if (line[pos] === ',') {
      pos++
      continue
    }
    if (line[pos] === '}') return {labels, end: pos + 1}
    throw new LineError(pos >= line.length ? 'unterminated label set' : `expected "," or "}" after label ${labelName}`)
  }
}

function parseValue(token: string): number {
  // Case-insensitive like Prometheus's own parser (Go ParseFloat): prom-client writes "Nan", Python "NaN" and "+Inf".
  const special = /^([+-]?)(nan|inf|infinity)$/i.exec(token)
  if (special) {
    if (special[2].toLowerCase() === 'nan') return Number.NaN
    return special[1] === '-' ? Number.NEGATIVE_INFINITY : Number.POSITIVE_INFINITY
  }
  // Number() accepts "", "0x1f" and " 1": only decimal floats are allowed here.
  if (!/^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/.test(token))
    throw new LineError(`invalid value ${JSON.stringify(token)}`)
  return Number(token)
}

function parseTimestamp(token: string, openMetrics: boolean): number {
  if (openMetrics) {
    if (!/^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$/.test(token))
      throw new LineError(`invalid timestamp ${JSON.stringify(token)}`)
    return Number(token) * 1000
  }
  if (!/^-?\d+$/.test(token))
    throw new LineError(`invalid timestamp ${JSON.stringify(token)} (the text format wants integer milliseconds)`)
  return Number(token)
}

/** The declared family a sample name belongs to: itself, or itself minus a histogram/summary/counter suffix. */
function familyOf(name: string, families: Map<string, Family>): string {
  const own = families.get(name)
  if (own && own.type !== 'untyped') return name
  for (const suffix of SUFFIXES) {
    if (!name.endsWith(suffix)) continue
    const base = name.slice(0, -suffix.length)
    if (families.get(base)?.type && families.get(base)!.type !== 'untyped') return base
    // prometheus_client's text format declares counters with their _total name and emits <base>_created beside them.
    if (suffix === '_created' && families.get(base + '_total')?.type === 'counter') return base + '_total'
  }
  return name
}

const matches = (labels: Labels, subset: Labels | undefined): boolean =>
  subset === undefined || Object.entries(subset).every(([k, v]) => labels[k] === v)

/** The value of the first sample named `name` whose labels include `subset`; undefined when there is none. */
export function sampleValue(samples: readonly Sample[], name: string, subset?: Labels): number | undefined {
  return samples.find(s => s.name === name && matches(s.labels, subset))?.value
}

/** The sum over every sample named `name` whose labels include `subset` (0 when there is none). */
export function sumOf(samples: readonly Sample[], name: string, subset?: Labels): number {
  let sum = 0
  for (const s of samples) if (s.name === name && matches(s.labels, subset)) sum += s.value
  return sum
}

export interface HistogramSeries {
  /** The series' labels without `le`. */
  labels: Labels
  buckets: Array<{le: number; count: number}>
  count?: number
  sum?: number
}

/** A histogram family, one entry per label set, buckets in ascending `le`. */
export function histogramSeries(samples: readonly Sample[], family: string, subset?: Labels): HistogramSeries[] {
  const byKey = new Map<string, HistogramSeries>()
  const seriesFor = (labels: Labels): HistogramSeries => {
    const key = JSON.stringify(Object.entries(labels).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0)))
    let s = byKey.get(key)
    if (!s) {
      s = {labels, buckets: []}
      byKey.set(key, s)
    }
    return s
  }
  for (const s of samples) {
    if (s.family !== family || !matches(s.labels, subset)) continue
    if (s.name === family + '_bucket') {
      const {le, ...rest} = s.labels
      if (le === undefined) continue
      seriesFor(rest).buckets.push({le: parseValueLoose(le), count: s.value})
    } else if (s.name === family + '_count') {
      seriesFor(s.labels).count = s.value
    } else if (s.name === family + '_sum') {
      seriesFor(s.labels).sum = s.value
    }
  }
  for (const s of byKey.values()) s.buckets.sort((a, b) => a.le - b.le)
  return [...byKey.values()]
}

function parseValueLoose(token: string): number {
  try {
    return parseValue(token)
  } catch {
    return Number.NaN
  }
}

/** A label value as the text format writes it (for tests and for rendering). */
export function escapeLabelValue(value: string): string {
  return value.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n')
}
