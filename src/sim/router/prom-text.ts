/**
 * A tiny Prometheus text-format registry for the router's own smg_* series (counters and gauges only).
 * Rendered on demand; label values are escaped as the exposition format requires.
 */

type Labels = Record<string, string>

interface Family {
  help: string
  type: 'counter' | 'gauge'
  series: Map<string, {labels: Labels; value: number}>
}

const escapeLabel = (v: string): string => v.replace(/\\/g, '\\\\').replace(/"/g, '\\"').replace(/\n/g, '\\n')

function key(labels: Labels): string {
  return Object.keys(labels).sort().map((k) => `${k}="${escapeLabel(labels[k])}"`).join(',')
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

  get(name: string, labels: Labels = {}): number {
    return this.families.get(name)?.series.get(key(labels))?.value ?? 0
  }

  render(): string {
    const out: string[] = []
    for (const [name, f] of this.families) {
      out.push(`# HELP ${name} ${f.help}`, `# TYPE ${name} ${f.type}`)
      for (const [k, s] of f.series) out.push(`${name}${k ? `{${k}}` : ''} ${s.value}`)
    }
    return out.join('\n') + '\n'
  }

  private entry(name: string, labels: Labels): {labels: Labels; value: number} {
    const f = this.families.get(name)
    if (!f) throw new Error(`metric ${name} not defined`)
    const k = key(labels)
    let s = f.series.get(k)
    if (!s) {
      s = {labels, value: 0}
      f.series.set(k, s)
    }
    return s
  }
}
