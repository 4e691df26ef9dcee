/**
 * A tiny Prometheus text-format registry for the router's own smg_* series: counters, gauges, and summaries rendered
 * as their _sum and _count only (sgl-model-gateway's exporter renders a histogram without buckets as a summary; the
 * twin leaves out the quantile lines). Rendered on demand; label values are escaped as the exposition format requires.
 */

type Labels = Record<string, string>

interface Family {
  help: string
  type: 'counter' | 'gauge' | 'summary'
  series: Map<string, {labels: Labels; value: number; count: number}>
}

const escapeLabel = (v: string): string => v.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n')

function key(labels: Labels): string {
  return Object.keys(labels)
    .sort()
    .map(k => `${k}="${escapeLabel(labels[k])}"`)
    .join(',')
}

export class PromRegistry {
  private readonly families = new Map<string, Family>()

  define(name: string, type: Family['type'], help: string): void {
    if (!this.families.has(name)) this.families.set(name, {help, type, series: new Map()})
  }

  inc(name: string, labels: Labels = {}, by = 1): void {
    const s = this.entry(name, labels)
    s.value += by
  }

  set(name: string, labels: Labels, value: number): void {
    this.entry(name, labels).value = value
  }

  /** One observation of a summary: adds to its _sum and _count. */
  observe(name: string, labels: Labels, value: number): void {
    const s = this.entry(name, labels)
    s.value += value
    s.count++
  }

  /** A summary's _count (get() answers its _sum). */
  count(name: string, labels: Labels = {}): number {
    return this.families.get(name)?.series.get(key(labels))?.count ?? 0
  }

  get(name: string, labels: Labels = {}): number {
    return this.families.get(name)?.series.get(key(labels))?.value ?? 0
  }

  render(): string {
    const out: string[] = []
    for (const [name, f] of this.families) {
      out.push(`# HELP ${name} ${f.help}`, `# TYPE ${name} ${f.type}`)
      for (const [k, s] of f.series) {
        const l = k ? `{${k}}` : ''
        if (f.type === 'summary') out.push(`${name}_sum${l} ${s.value}`, `${name}_count${l} ${s.count}`)
        else out.push(`${name}${l} ${s.value}`)
      }
    }
    return out.join('\n') + '\n'
  }

  private entry(name: string, labels: Labels): {labels: Labels; value: number; count: number} {
    const f = this.families.get(name)
    if (!f) throw new Error(`metric ${name} not defined`)
    const k = key(labels)
    let s = f.series.get(k)
    if (!s) {
      s = {labels, value: 0, count: 0}
      f.series.set(k, s)
    }
    return s
  }
}
