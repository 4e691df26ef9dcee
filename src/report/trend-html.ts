import {BOUND_TEXT, MARGIN_BOUNDS, type MarginBound} from '../model/margins.js'
import {type MarginTrend, smallest, type Trend, verdictLetter} from '../model/trend.js'
import {HTML_CSS, niceTicks} from './html.js'
import {escapeAttr, escapeXml} from './junit.js'

/**
 * The trend page (`pdchaos report --trend --html FILE`): the drift named in words, the verdicts of each scenario and
 * check run by run, and per scenario a plot of every eviction's margin to each bound (inline SVG; no script, no
 * external resource). Each point carries its run and value (data-run, data-ms) and each plot its axis range, so a test
 * can check what a person sees.
 */

const esc = escapeXml
const attr = escapeAttr
const W = 1240
const LEFT = 80
const RIGHT = 30
const PLOT_W = W - LEFT - RIGHT
const PLOT_H = 220
const TOP = 30
const COLOR: Record<MarginBound | 'bound' | 'axis' | 'grid', string> = {
  early: '#222222',
  late: '#6a3fb5',
  bound: '#d62728',
  axis: '#888888',
  grid: '#eeeeee',
}
const CELL: Record<string, string> = {P: '#2ca02c', F: '#d62728', U: '#8c8c8c', '-': '#f2f2f2'}

const iso = (ms: number) => new Date(ms).toISOString().replace(/\.\d+Z$/, 'Z')

/** The y range of a plot: the data and the bound (0), with a little room. */
export function marginRange(m: MarginTrend): {lo: number; hi: number} {
  const all = m.runs.flatMap(r => r.margins.flatMap(x => [x.earlyMs, x.lateMs]))
  const lo = Math.min(0, ...all)
  const hi = Math.max(0, ...all)
  const pad = Math.max(10, (hi - lo) * 0.08)
  return {lo: lo - pad, hi: hi + pad}
}

function plot(t: Trend, m: MarginTrend): string {
  const n = Math.max(1, t.runs.length)
  const {lo, hi} = marginRange(m)
  const x = (run: number) => LEFT + (n === 1 ? PLOT_W / 2 : (run / (n - 1)) * PLOT_W)
  const y = (v: number) => TOP + PLOT_H - ((v - lo) / (hi - lo)) * PLOT_H
  const parts: string[] = []
  const height = TOP + PLOT_H + 48
  parts.push(
    `<svg xmlns="http://www.w3.org/2000/svg" class="trend-plot" width="${W}" height="${height}"` +
      ` viewBox="0 0 ${W} ${height}" data-y-min="${lo.toFixed(1)}" data-y-max="${hi.toFixed(1)}"` +
      ` data-runs="${t.runs.length}"` +
      ` role="img" aria-label="${attr(`eviction margins of ${m.scenario}`)}">`,
  )
  parts.push(
    `<rect x="${LEFT}" y="${TOP}" width="${PLOT_W}" height="${PLOT_H}" fill="#fcfcfc"` + ` stroke="${COLOR.grid}"/>`,
  )
  for (const v of niceTicks(lo, hi, 6)) {
    const yy = y(v).toFixed(1)
    parts.push(
      `<line x1="${LEFT}" x2="${LEFT + PLOT_W}" y1="${yy}" y2="${yy}" stroke="${COLOR.grid}"/>`,
      `<text x="${LEFT - 6}" y="${(y(v) + 4).toFixed(1)}" text-anchor="end" class="tick">${Math.round(v)} ms</text>`,
    )
  }
  // The bound: a margin below this line is an eviction outside the window.
  const y0 = y(0).toFixed(1)
  parts.push(
    `<line class="bound" x1="${LEFT}" x2="${LEFT + PLOT_W}" y1="${y0}" y2="${y0}" stroke="${COLOR.bound}"` +
      ' stroke-dasharray="6,3"/>',
    `<text x="${LEFT + PLOT_W - 4}" y="${(y(0) - 4).toFixed(1)}" text-anchor="end" class="tick">bound</text>`,
  )
  // Run labels on the x axis, thinned so they never overlap (about 110 px each).
  const every = Math.max(1, Math.ceil(n / Math.floor(PLOT_W / 110)))
  t.runs.forEach(r => {
    const xx = x(r.index).toFixed(1)
    parts.push(`<line x1="${xx}" x2="${xx}" y1="${TOP + PLOT_H}" y2="${TOP + PLOT_H + 4}" stroke="${COLOR.axis}"/>`)
    if (r.index % every === 0) {
      const label = esc(`#${r.index + 1} ${iso(r.startedAt).slice(5, 16)}`)
      parts.push(`<text x="${xx}" y="${TOP + PLOT_H + 17}" text-anchor="middle" class="tick">${label}</text>`)
    }
  })
  parts.push(
    `<text x="${LEFT + PLOT_W / 2}" y="${TOP + PLOT_H + 36}" text-anchor="middle" class="label">` +
      'run (oldest first)</text>',
  )
  parts.push(...plotPoints(m, x, y), ...plotLegend())
  parts.push('</svg>')
  return parts.join('\n')
}

/** Per bound: the smallest margin of each run joined (the line the drift is fitted to), and every eviction's point. */
function plotPoints(m: MarginTrend, x: (run: number) => number, y: (v: number) => number): string[] {
  const parts: string[] = []
  for (const bound of MARGIN_BOUNDS) {
    const key = bound === 'early' ? 'earlyMs' : 'lateMs'
    // The smallest margin per run, joined: the line the drift is fitted to.
    const path = m.runs.map((r, i) => `${i === 0 ? 'M' : 'L'}${x(r.run).toFixed(1)},${y(smallest(r)[key]).toFixed(1)}`)
    parts.push(
      `<path class="min ${bound}" d="${path.join('')}" fill="none" stroke="${COLOR[bound]}"` +
        ' stroke-width="1.5" stroke-opacity="0.7"/>',
    )
    for (const r of m.runs) {
      for (const e of r.margins) {
        const v = e[key]
        const title =
          `${e.rid}: evicted after ${e.evictionSeconds} s, ${v} ms to ${BOUND_TEXT[bound]}` + ` (run ${r.run + 1})`
        parts.push(
          `<circle class="pt ${bound}" data-run="${r.run}" data-ms="${v}" cx="${x(r.run).toFixed(1)}"` +
            ` cy="${y(v).toFixed(1)}" r="4" fill="${COLOR[bound]}"><title>${esc(title)}</title></circle>`,
        )
      }
    }
  }
  return parts
}

/** The legend above the plot: one entry per bound's points, then the bound line. */
function plotLegend(): string[] {
  const parts: string[] = []
  let lx = LEFT
  for (const bound of MARGIN_BOUNDS) {
    const text = `margin to ${BOUND_TEXT[bound]} (${bound})`
    parts.push(
      `<g transform="translate(${lx},14)"><circle cx="5" cy="-4" r="4" fill="${COLOR[bound]}"/>` +
        `<text x="14" y="0" class="legend">${esc(text)}</text></g>`,
    )
    lx += 30 + text.length * 6.6
  }
  parts.push(
    `<g transform="translate(${lx},14)">` +
      `<line x1="0" x2="18" y1="-4" y2="-4" stroke="${COLOR.bound}" stroke-dasharray="6,3"/>` +
      '<text x="24" y="0" class="legend">bound (0 ms)</text></g>',
  )
  return parts
}

function verdictGrid(t: Trend): string {
  const named = (d: string, s: string) => (t.deployments.length > 1 ? `${d} · ${s}` : s)
  const head = t.runs.map(r => `<th title="${attr(`${r.runId} ${iso(r.startedAt)}`)}">${r.index + 1}</th>`).join('')
  const rows = t.checks.map(c => {
    const cells = c.perRun
      .map((cell, i) => {
        const l = verdictLetter(cell)
        const title = cell
          ? `run ${i + 1}: ${cell.pass} passed, ${cell.fail} failed, ${cell.unverified} unverified`
          : `run ${i + 1}: not judged`
        const cls = `cell v${l === '-' ? 'none' : l}`
        return `<td class="${cls}" style="background:${CELL[l]}" title="${attr(title)}">${l}</td>`
      })
      .join('')
    return `<tr><td class="name">${esc(named(c.deployment, c.scenario))}</td><td>${esc(c.check)}</td>${cells}</tr>`
  })
  return (
    `<table class="trend"><thead><tr><th>scenario</th><th>check</th>${head}</tr></thead>` +
    `<tbody>\n${rows.join('\n')}\n</tbody></table>`
  )
}

export function renderTrendHtml(t: Trend, title = 'trend'): string {
  const named = (d: string, s: string) => (t.deployments.length > 1 ? `${d} · ${s}` : s)
  const status = t.drifts.length > 0 ? 'fail' : 'pass'
  const first = t.runs[0]
  const last = t.runs.at(-1)
  return [
    '<!DOCTYPE html>',
    '<html lang="en"><head><meta charset="utf-8">',
    `<title>${esc(`pdchaos ${title}: ${t.drifts.length} drift(s) over ${t.runs.length} runs`)}</title>`,
    `<style>${HTML_CSS}${TREND_CSS}</style></head><body>`,
    `<h1><span class="badge ${status}">${t.drifts.length > 0 ? 'DRIFT' : 'STEADY'}</span> pdchaos ${esc(title)}</h1>`,
    `<p class="facts">${esc(
      `${t.runs.length} run(s)` +
        `${first && last ? ` from ${iso(first.startedAt)} to ${iso(last.startedAt)}` : ''}` +
        ` · deployment(s) ${t.deployments.join(', ')} · ${t.runs.filter(r => r.passed).length} passed`,
    )}</p>`,
    t.drifts.length === 0
      ? `<p class="note">No eviction margin fell by ${t.driftMs} ms or more beyond the runs' noise.</p>`
      : `<h2>Drift (${t.drifts.length})</h2>` +
        `<ul class="drift">${t.drifts.map(d => `<li>${esc(d.text)}</li>`).join('')}</ul>`,
    '<h2>Verdicts per run</h2>',
    t.checks.length > 0 ? verdictGrid(t) : '<p class="note">no verdicts in these runs</p>',
    ...t.margins.map(m =>
      [
        `<section class="margins"><h2>${esc(named(m.deployment, m.scenario))}: eviction margins</h2>`,
        `<p class="facts">${esc(
          `${m.runs.reduce((k, r) => k + r.margins.length, 0)} eviction(s)` +
            ` in ${m.runs.length} run(s);` +
            ` deadline ${m.runs.at(-1)!.deadlineSeconds} s, poll ${m.runs.at(-1)!.pollSeconds} s;` +
            " lines join each run's smallest margin",
        )}</p>`,
        plot(t, m),
        '</section>',
      ].join('\n'),
    ),
    '</body></html>',
    '',
  ].join('\n')
}

const TREND_CSS = `
table.trend{border-collapse:collapse;margin-top:8px}
table.trend th,table.trend td{border:1px solid #fff;padding:2px 6px;text-align:left}
table.trend td.cell{color:#fff;text-align:center;font-weight:600;min-width:14px} table.trend td.cell.vnone{color:#999}
ul.drift li{margin:3px 0;font-weight:600}
`
