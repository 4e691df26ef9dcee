import type {PinRecord} from '../checks/eviction.js'
import {faultWindows, type Observation} from '../model/timeline.js'
import {escapeAttr, escapeXml} from './junit.js'
import {failedChecks, runCounts, runPassed, type ScenarioRun, type SuiteRun} from '../model/run.js'

/**
 * The single-file HTML report of a suite run: a header with the counts and every failed check, then per scenario a
 * timeline drawn in inline SVG (fault windows, one bar per pin against its deadline ticks, load and canary requests,
 * metric series) and the verdict table with the evidence folded away. No external resource and no script: it opens
 * from a CI artifact store or a mail attachment as it is.
 */

export interface HtmlOptions {
  /** Pins drawn per scenario at most (failures first); the table still lists every verdict. */
  maxPinRows?: number
  /** Metric series drawn per scenario at most. */
  maxSeries?: number
}

const COLOR = {
  pass: '#2ca02c',
  fail: '#d62728',
  unverified: '#8c8c8c',
  fault: '#f5c542',
  deadline: '#222222',
  poll: '#6a3fb5',
  window: '#e3e3e3',
  load: '#4a7fc1',
  axis: '#888888',
  grid: '#eeeeee',
  marker: '#999999',
  series: '#1f6fb4',
}

const W = 1240
const LEFT = 170
const RIGHT = 30
const PLOT = W - LEFT - RIGHT

const esc = escapeXml
const attr = escapeAttr
const fmt = (n: number, d = 3) => (Number.isFinite(n) ? Number(n.toFixed(d)).toString() : String(n))
const iso = (ms: number) => new Date(ms).toISOString()
const clip = (s: string, n: number) => (s.length > n ? s.slice(0, n - 1) + '…' : s)

type Sent = Extract<Observation, {kind: 'request-sent'}>
type Answered = Extract<Observation, {kind: 'request-answered'}>

interface Scale {
  from: number
  to: number
  /** Clamped to the plot: what happened before or after the drawn span sits at its edge. */
  x: (t: number) => number
  inside: (t: number) => boolean
}

/**
 * The span the timeline draws: the action (fault windows, pins with their deadline + poll, abort trials, markers)
 * with a little room, not the whole scenario (calibration and the steady load before and after would squeeze seven
 * seconds of
 * action into a corner of thirty). A scenario without action (nothing recorded but requests) is drawn whole.
 */
export function timelineSpan(s: ScenarioRun): {from: number; to: number} {
  const action: number[] = []
  const {deadlineSeconds, pollSeconds} = s.contract
  for (const p of s.pins) {
    action.push(p.sentAt, p.sentAt + (deadlineSeconds + pollSeconds) * 1000, p.sentAt + p.bounds[1] * 1000)
    if (p.evictedAt !== null) action.push(p.evictedAt)
  }
  for (const l of s.leases) for (const t of [l.injectedAt, l.revertedAt]) if (t !== null) action.push(t)
  for (const a of s.aborts ?? []) action.push(a.sentAt, a.abortedAt, ...(a.releasedAt === null ? [] : [a.releasedAt]))
  for (const o of s.timeline?.observations ?? []) {
    const acts = (o.kind === 'marker' && o.name !== 'end') || o.kind === 'fault-injected' || o.kind === 'fault-reverted'
    if (acts) action.push(o.t)
  }
  const observed = (s.timeline?.observations ?? []).map(o => o.t)
  const all = [s.startedAt, s.finishedAt, ...observed, ...action].filter(Number.isFinite)
  const times = action.filter(Number.isFinite).length > 0 ? action.filter(Number.isFinite) : all
  const lo = Math.min(...times)
  const hi = Math.max(...times)
  const pad = Math.max(200, (hi - lo) * 0.04)
  const from = Math.max(Math.min(...all), lo - pad)
  return {from, to: Math.max(from + 1000, hi + pad)}
}

function scaleFor(s: ScenarioRun): Scale {
  const {from, to} = timelineSpan(s)
  const x = (t: number) => LEFT + ((Math.min(to, Math.max(from, t)) - from) / (to - from)) * PLOT
  return {from, to, x, inside: (t: number) => t >= from && t <= to}
}

/** Round steps (1, 2 or 5 × 10^k) from lo to hi, about `count` of them. */
export function niceTicks(lo: number, hi: number, count: number): number[] {
  const raw = (hi - lo) / count
  if (!(raw > 0) || !Number.isFinite(raw)) return [lo]
  const mag = 10 ** Math.floor(Math.log10(raw))
  const step = [1, 2, 5, 10].map(m => m * mag).find(v => v >= raw) ?? raw
  const out: number[] = []
  for (let v = Math.ceil(lo / step) * step; v <= hi + 1e-9 && out.length < 50; v += step) out.push(Number(v.toFixed(9)))
  return out
}

/** Axis ticks, seconds from the span's start, about ten of them. */
function ticks(scale: Scale): number[] {
  return niceTicks(0, (scale.to - scale.from) / 1000, 10)
}

/**
 * Lanes for labels along the time axis, so that none overlaps another: each label goes to the first lane whose last
 * label ends before it starts (text width estimated from its length at the labels' font size).
 */
export function labelLanes(items: Array<{x: number; text: string}>, charPx = 6.2, gap = 6): number[] {
  const ends: number[] = []
  const order = items.map((it, i) => ({...it, i})).sort((a, b) => a.x - b.x)
  const lanes = new Array<number>(items.length).fill(0)
  for (const it of order) {
    const width = it.text.length * charPx
    let lane = ends.findIndex(end => end + gap <= it.x)
    if (lane < 0) lane = ends.push(-Infinity) - 1
    ends[lane] = it.x + width
    lanes[it.i] = lane
  }
  return lanes
}

function axis(scale: Scale, y: number, top: number): string {
  const parts = [`<line x1="${LEFT}" y1="${y}" x2="${LEFT + PLOT}" y2="${y}" stroke="${COLOR.axis}"/>`]
  for (const s of ticks(scale)) {
    const x = scale.x(scale.from + s * 1000).toFixed(1)
    parts.push(
      `<line x1="${x}" y1="${top}" x2="${x}" y2="${y}" stroke="${COLOR.grid}"/>`,
      `<line x1="${x}" y1="${y}" x2="${x}" y2="${y + 5}" stroke="${COLOR.axis}"/>`,
      `<text x="${x}" y="${y + 17}" text-anchor="middle" class="tick">+${fmt(s, 2)}s</text>`,
    )
  }
  return parts.join('')
}

function windowsOf(s: ScenarioRun, scale: Scale): Array<{label: string; from: number; to: number; open: boolean}> {
  if (s.leases.length > 0) {
    return s.leases
      .filter(l => l.injectedAt !== null)
      .map(l => ({
        label: `${l.fault} (${l.id})${l.verifiedClean ? '' : ' — not verified clean'}`,
        from: l.injectedAt as number,
        to: l.revertedAt ?? scale.to,
        open: l.revertedAt === null,
      }))
  }
  return s.timeline
    ? faultWindows(s.timeline).map(w => ({
        label: `${w.fault} (${w.leaseId})`,
        from: w.from,
        to: w.to ?? scale.to,
        open: w.to === undefined,
      }))
    : []
}

/** Where a pin's bar ends, and whether it is open-ended (never evicted). */
function pinEnd(p: PinRecord, scale: Scale): {t: number; open: boolean} {
  if (p.evictedAt !== null) return {t: p.evictedAt, open: false}
  const answered = p.evidence.answeredAfterSeconds
  if (typeof answered === 'number') return {t: p.sentAt + answered * 1000, open: false}
  const held = p.evidence.heldSeconds
  return {t: typeof held === 'number' ? p.sentAt + held * 1000 : scale.to, open: true}
}

function pinRows(
  s: ScenarioRun,
  scale: Scale,
  top: number,
  maxRows: number,
): {svg: string; height: number; hidden: number} {
  const ordered = [
    ...s.pins.filter(p => p.verdict === 'fail'),
    ...s.pins.filter(p => p.verdict === 'unverified'),
    ...s.pins.filter(p => p.verdict === 'pass'),
  ]
  const shown = ordered.slice(0, maxRows)
  const rowH = shown.length > 60 ? 8 : 18
  const barH = rowH > 10 ? 8 : 5
  const {deadlineSeconds, pollSeconds} = s.contract
  const parts: string[] = []
  shown.forEach((p, i) => {
    const y = top + i * rowH + rowH / 2
    const color = COLOR[p.verdict]
    const end = pinEnd(p, scale)
    const x0 = scale.x(p.sentAt)
    const x1 = Math.max(x0 + 2, scale.x(end.t))
    const wLow = scale.x(p.sentAt + p.bounds[0] * 1000)
    const wHigh = scale.x(p.sentAt + p.bounds[1] * 1000)
    const dl = scale.x(p.sentAt + deadlineSeconds * 1000)
    const dlp = scale.x(p.sentAt + (deadlineSeconds + pollSeconds) * 1000)
    const title =
      `${p.rid}: ${p.verdict}, ` +
      `${p.evictionSeconds === null ? 'never evicted' : `evicted after ${p.evictionSeconds} s`}, ` +
      `window [${p.bounds[0]} s, ${p.bounds[1]} s]`
    parts.push(`<g class="pin ${p.verdict}"><title>${esc(title)}</title>`)
    if (rowH > 10)
      parts.push(`<text x="${LEFT - 8}" y="${y + 4}" text-anchor="end" class="label">${esc(clip(p.rid, 24))}</text>`)
    parts.push(
      `<rect x="${wLow.toFixed(1)}" y="${(y - rowH / 2 + 1).toFixed(1)}" ` +
        `width="${Math.max(1, wHigh - wLow).toFixed(1)}" height="${rowH - 2}" fill="${COLOR.window}"/>`,
      `<rect x="${x0.toFixed(1)}" y="${(y - barH / 2).toFixed(1)}" width="${(x1 - x0).toFixed(1)}" ` +
        `height="${barH}" fill="${color}"/>`,
    )
    if (end.open) {
      const h = barH
      parts.push(
        `<polygon points="${x1.toFixed(1)},${(y - h).toFixed(1)} ${(x1 + 10).toFixed(1)},${y.toFixed(1)} ` +
          `${x1.toFixed(1)},${(y + h).toFixed(1)}" fill="${color}"/>`,
      )
    }
    const tick = (x: number, c: string, dash: string) =>
      `<line x1="${x.toFixed(1)}" y1="${(y - rowH / 2 + 1).toFixed(1)}" x2="${x.toFixed(1)}" ` +
      `y2="${(y + rowH / 2 - 1).toFixed(1)}" stroke="${c}" stroke-width="2"${dash}/>`
    parts.push(tick(dl, COLOR.deadline, ''), tick(dlp, COLOR.poll, ' stroke-dasharray="3,2"'), '</g>')
  })
  return {svg: parts.join(''), height: shown.length * rowH, hidden: ordered.length - shown.length}
}

function requestDots(s: ScenarioRun, scale: Scale, y: number): {svg: string; count: number} {
  const obs = s.timeline?.observations ?? []
  const answers = new Map<string, Answered>()
  for (const o of obs) if (o.kind === 'request-answered') answers.set(o.rid, o)
  const sent = obs.filter((o): o is Sent => o.kind === 'request-sent' && o.role !== 'pin' && scale.inside(o.t))
  const parts = sent.slice(0, 2000).map(o => {
    const a = answers.get(o.rid)
    // trip-breaker: a trip request is meant to fail; a probe at the open breaker is meant to be refused with 503.
    const ok =
      a !== undefined &&
      ((a.status >= 200 && a.status < 300) || o.role === 'trip' || (o.role === 'probe' && a.status === 503))
    const x = scale.x(o.t).toFixed(1)
    const cy = o.role === 'canary' ? y - 6 : y + 4
    const fill = ok ? (o.role === 'canary' ? COLOR.pass : COLOR.load) : COLOR.fail
    const what = a ? `answered ${a.status} after ${fmt((a.t - o.t) / 1000)} s` : 'no answer'
    return (
      `<circle cx="${x}" cy="${cy}" r="${o.role === 'canary' ? 4 : 3}" ` +
      `fill="${fill}"><title>${esc(`${o.role} ${o.rid}: ${what}`)}</title></circle>`
    )
  })
  return {svg: parts.join(''), count: sent.length}
}

function markerList(s: ScenarioRun, scale: Scale): Array<Extract<Observation, {kind: 'marker'}>> {
  return (s.timeline?.observations ?? [])
    .filter(
      (o): o is Extract<Observation, {kind: 'marker'}> => o.kind === 'marker' && o.name !== 'end' && scale.inside(o.t),
    )
    .slice(0, 30)
}

type Marker = Extract<Observation, {kind: 'marker'}>

function markerLines(ms: Marker[], scale: Scale, top: number, bottom: number): string {
  return ms
    .map(m => {
      const x = scale.x(m.t).toFixed(1)
      return (
        `<line x1="${x}" y1="${top}" x2="${x}" y2="${bottom}" stroke="${COLOR.marker}" stroke-dasharray="2,3">` +
        `<title>${esc(m.name)}</title></line>`
      )
    })
    .join('')
}

function seriesCharts(
  s: ScenarioRun,
  scale: Scale,
  top: number,
  maxSeries: number,
): {svg: string; height: number; hidden: number} {
  const bySeries = new Map<string, Array<{t: number; v: number}>>()
  // The gateway's breaker states (trip-breaker) as a series: 0 closed, 1 open, 2 half-open (smg_worker_cb_state).
  const CB: Record<string, number> = {closed: 0, open: 1, half_open: 2}
  // First, so that the series limit never hides them.
  for (const o of s.timeline?.observations ?? []) {
    if (o.kind !== 'breaker' || !scale.inside(o.t)) continue
    const key = `gateway breaker of ${o.role === 'other' ? o.worker : o.role} (0 closed, 1 open, 2 half-open)`
    let arr = bySeries.get(key)
    if (!arr) bySeries.set(key, (arr = []))
    arr.push({t: o.t, v: CB[o.state] ?? 0})
  }
  // Before the span only the value a series holds at the span's start matters: its last sample before it.
  const before = new Map<string, number>()
  for (const o of s.timeline?.observations ?? []) {
    if (o.kind !== 'metric' || !Number.isFinite(o.value) || o.t > scale.to) continue
    const key = `${o.instance ?? o.service} ${o.name}`
    if (o.t < scale.from) {
      before.set(key, o.value)
      if (!bySeries.has(key)) bySeries.set(key, [])
      continue
    }
    let arr = bySeries.get(key)
    if (!arr) {
      arr = []
      bySeries.set(key, arr)
    }
    arr.push({t: o.t, v: o.value})
  }
  for (const [key, v] of before) {
    const arr = bySeries.get(key)!
    if (arr.length === 0 || arr[0]!.t > scale.from) arr.unshift({t: scale.from, v})
  }
  const keys = [...bySeries.keys()].slice(0, maxSeries)
  const H = 56
  const GAP = 22
  const parts: string[] = []
  keys.forEach((key, i) => {
    const pts = bySeries.get(key) as Array<{t: number; v: number}>
    const y0 = top + i * (H + GAP) + GAP
    const lo = Math.min(0, ...pts.map(p => p.v))
    const hi = Math.max(lo + 1, ...pts.map(p => p.v))
    const y = (v: number) => y0 + H - ((v - lo) / (hi - lo)) * H
    // Gauges hold their value until the next sample: draw steps, not slopes.
    const path: string[] = []
    pts.forEach((p, j) => {
      const x = scale.x(p.t).toFixed(1)
      if (j === 0) path.push(`M${x},${y(p.v).toFixed(1)}`)
      else path.push(`H${x}`, `V${y(p.v).toFixed(1)}`)
    })
    parts.push(
      `<text x="${LEFT - 8}" y="${y0 + 12}" text-anchor="end" class="label">${esc(clip(key.split(' ')[0], 24))}</text>`,
      `<text x="${LEFT}" y="${y0 - 4}" class="series-name">${esc(key.split(' ').slice(1).join(' '))} ` +
        `(min ${fmt(Math.min(...pts.map(p => p.v)))}, max ${fmt(Math.max(...pts.map(p => p.v)))})</text>`,
      `<rect x="${LEFT}" y="${y0}" width="${PLOT}" height="${H}" fill="#fafafa" stroke="${COLOR.grid}"/>`,
      `<text x="${LEFT - 8}" y="${y0 + H}" text-anchor="end" class="tick">${fmt(lo)}</text>`,
      `<text x="${LEFT - 8}" y="${y0 + 26}" text-anchor="end" class="tick">${fmt(hi)}</text>`,
      `<path d="${path.join('')}" fill="none" stroke="${COLOR.series}" stroke-width="1.5"/>`,
    )
  })
  return {svg: parts.join(''), height: keys.length * (H + GAP), hidden: bySeries.size - keys.length}
}

function legend(y: number): {svg: string; height: number} {
  const items: Array<[string, string]> = [
    [`<rect width="18" height="8" y="-7" fill="${COLOR.pass}"/>`, 'pin evicted in window'],
    [`<rect width="18" height="8" y="-7" fill="${COLOR.fail}"/>`, 'pin failed (open arrow: never evicted)'],
    [`<rect width="18" height="12" y="-9" fill="${COLOR.window}"/>`, 'allowed window (with ε)'],
    [`<line x1="9" x2="9" y1="-10" y2="3" stroke="${COLOR.deadline}" stroke-width="2"/>`, 'deadline'],
    [
      `<line x1="9" x2="9" y1="-10" y2="3" stroke="${COLOR.poll}" stroke-width="2" stroke-dasharray="3,2"/>`,
      'deadline + poll',
    ],
    [`<rect width="18" height="12" y="-9" fill="${COLOR.fault}" fill-opacity="0.35"/>`, 'fault injected → reverted'],
    [`<circle cx="9" cy="-3" r="3" fill="${COLOR.load}"/>`, 'load request ok'],
    [`<circle cx="9" cy="-3" r="4" fill="${COLOR.pass}"/>`, 'canary ok'],
    [`<circle cx="9" cy="-3" r="3" fill="${COLOR.fail}"/>`, 'request failed'],
  ]
  let x = LEFT
  let row = 0
  const svg = items
    .map(([glyph, text]) => {
      const width = 34 + text.length * 6.6
      if (x + width > W - RIGHT) {
        x = LEFT
        row++
      }
      const g =
        `<g transform="translate(${x.toFixed(0)},${y + row * 18})">${glyph}<text x="24" y="2" ` +
        `class="legend">${esc(text)}</text></g>`
      x += width
      return g
    })
    .join('')
  return {svg, height: (row + 1) * 18}
}

function timelineSvg(s: ScenarioRun, opts: Required<HtmlOptions>): string {
  const scale = scaleFor(s)
  const key = legend(18)
  const top = 18 + key.height + 10
  const wins = windowsOf(s, scale)
  const marks = markerList(s, scale)
  // Fault and marker labels share a band above the requests, each in the first lane where it overlaps nothing.
  const labels = [
    ...wins.map(w => ({
      x: scale.x(w.from) + 4,
      text: clip(`${w.label}${w.open ? ' — not reverted' : ''}`, 100),
      cls: 'fault-label',
    })),
    ...marks.map(m => ({x: scale.x(m.t) + 3, text: clip(m.name, 28), cls: 'marker'})),
  ]
  const lanes = labelLanes(labels)
  const laneCount = labels.length === 0 ? 1 : Math.max(...lanes) + 1
  const LANE = 13
  const reqY = top + laneCount * LANE + 14
  const pinsTop = reqY + 20
  const dots = requestDots(s, scale, reqY)
  const pins = pinRows(s, scale, pinsTop, opts.maxPinRows)
  const pinsBottom = pinsTop + Math.max(pins.height, 18)
  const axisY = pinsBottom + 8
  const series = seriesCharts(s, scale, axisY + 40, opts.maxSeries)
  const height = axisY + 44 + series.height + 10
  const windows = wins
    .map(w => {
      const x0 = scale.x(w.from)
      const x1 = scale.x(w.to)
      return (
        `<rect x="${x0.toFixed(1)}" y="${top}" width="${Math.max(1, x1 - x0).toFixed(1)}" ` +
        `height="${(axisY - top).toFixed(1)}" fill="${COLOR.fault}" ` +
        `fill-opacity="0.35"><title>${esc(
          `${w.label}: ${iso(w.from)} ` + `→ ${w.open ? 'not reverted' : iso(w.to)}`,
        )}</title></rect>`
      )
    })
    .join('')
  const labelSvg = labels
    .map(
      (l, i) => `<text x="${l.x.toFixed(1)}" y="${top + 11 + lanes[i]! * LANE}" class="${l.cls}">${esc(l.text)}</text>`,
    )
    .join('')
  const rowLabels =
    `<text x="${LEFT - 8}" y="${reqY + 4}" text-anchor="end" class="label">requests ` + `(${dots.count})</text>`
  const pinNote =
    s.pins.length === 0 ? `<text x="${LEFT + 6}" y="${pinsTop + 13}" class="note">no pins in this scenario</text>` : ''
  const caption =
    `<text x="${LEFT}" y="${axisY + 32}" class="tick">seconds after ${esc(iso(scale.from))}` +
    `${
      scale.from > s.startedAt + 1
        ? ` (${fmt((scale.from - s.startedAt) / 1000, 1)} s into the scenario; the span drawn is the fault's action)`
        : ''
    }` +
    '</text>'
  return [
    `<svg xmlns="http://www.w3.org/2000/svg" width="${W}" height="${height.toFixed(0)}" viewBox="0 ` +
      `0 ${W} ${height.toFixed(0)}" role="img" aria-label="${attr(`timeline of ${s.name}`)}"` +
      ` data-from="${scale.from.toFixed(0)}" data-to="${scale.to.toFixed(0)}">`,
    key.svg,
    windows,
    markerLines(marks, scale, top, axisY),
    labelSvg,
    rowLabels,
    dots.svg,
    pinNote,
    pins.svg,
    axis(scale, axisY, top),
    caption,
    series.svg,
    '</svg>',
    pins.hidden > 0
      ? `<p class="note">${pins.hidden} more passing pins not drawn; every pin is in the table below.</p>`
      : '',
    series.hidden > 0 ? `<p class="note">${series.hidden} more metric series not drawn.</p>` : '',
  ].join('\n')
}

function verdictTable(s: ScenarioRun): string {
  const rank = {fail: 0, unverified: 1, pass: 2} as const
  const rows = [...s.verdicts]
    .sort((a, b) => rank[a.verdict] - rank[b.verdict])
    .map(v =>
      [
        `<tr class="${v.verdict}">`,
        `<td>${esc(v.check)}</td><td class="subject">${esc(v.subject)}</td><td ` +
          `class="verdict">${v.verdict.toUpperCase()}</td>`,
        `<td>${esc(v.summary)}<details><summary>evidence</summary><pre>${esc(JSON.stringify(v.evidence, null, 2))}` +
          `</pre></details></td>`,
        '</tr>',
      ].join(''),
    )
  return (
    `<table class="verdicts"><thead><tr><th>check</th><th>subject</th><th>verdict</th><th>summary and ` +
    `evidence</th></tr></thead><tbody>\n${rows.join('\n')}\n</tbody></table>`
  )
}

/** " — <b>unverified</b>: why; to verify: what would decide it" after an abort-coverage summary. */
function coverageUnverified(c: {why?: string; toVerify?: string}): string {
  return ` — <b>unverified</b>: ${esc(c.why ?? '')}; to verify: ${esc(c.toVerify ?? '')}`
}

function scenarioSection(s: ScenarioRun, id: string, opts: Required<HtmlOptions>): string {
  const failed = s.verdicts.filter(v => v.verdict === 'fail').length
  const unverified = s.verdicts.filter(v => v.verdict === 'unverified').length
  // Halted (`pdchaos halt`) before it finished: its badge says so; what it recorded is shown as for any scenario.
  const status =
    s.status === 'halted'
      ? 'halted'
      : s.error !== undefined
        ? 'error'
        : failed > 0
          ? 'fail'
          : unverified > 0
            ? 'unverified'
            : 'pass'
  const facts = [
    s.kind,
    s.fault && `fault ${s.fault}`,
    s.params && Object.keys(s.params).length > 0 && `params ${JSON.stringify(s.params)}`,
    `watchdog scope ${s.contract.scope}, deadline ${s.contract.deadlineSeconds} s, poll ${s.contract.pollSeconds} s`,
    `${fmt((s.finishedAt - s.startedAt) / 1000, 1)} s from ${iso(s.startedAt)}`,
    `${s.verdicts.length - failed - unverified}/${s.verdicts.length} checks ` +
      `passed${unverified ? `, ${unverified} unverified` : ''}`,
  ]
    .filter(Boolean)
    .join(' · ')
  return [
    `<section class="scenario ${status}" id="${attr(id)}">`,
    `<h2><span class="badge ${status}">${status.toUpperCase()}</span> ${esc(s.name)}` +
      `${s.pair ? ` <small>on ${esc(s.pair.prefill)} + ${esc(s.pair.decode)}</small>` : ''}</h2>`,
    `<p class="facts">${esc(facts)}</p>`,
    s.error !== undefined ? `<p class="error">${esc(s.error)}</p>` : '',
    s.abortCoverage
      ? `<p class="facts">${esc(s.abortCoverage.summary)}` +
        `${s.abortCoverage.verified ? '' : coverageUnverified(s.abortCoverage)}</p>`
      : '',
    s.timeline || s.pins.length > 0 || s.leases.length > 0
      ? timelineSvg(s, opts)
      : '<p class="note">no timeline recorded</p>',
    verdictTable(s),
    '</section>',
  ].join('\n')
}

export const HTML_CSS =
  `
body{font:14px/1.4 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu ` +
  `Sans",sans-serif;margin:24px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 6px} h2{font-size:17px;margin:28px 0 4px}
.badge{display:inline-block;padding:1px ` +
  `8px;border-radius:4px;color:#fff;font-size:13px;font-weight:600;vertical-align:1px}
.badge.pass{background:${COLOR.pass}} .badge.fail{background:${COLOR.fail}} ` +
  `.badge.error,.badge.stopped,.badge.halted{background:#8a5a00} .badge.unverified{background:${COLOR.unverified}}
.counts span{display:inline-block;margin-right:18px} .counts b{font-size:18px}
.facts,.note{color:#555;margin:2px 0 8px} .error{color:#8a5a00;font-weight:600}
ul.failed li{margin:3px 0} ul.failed .subject{font-family:ui-monospace,Menlo,Consolas,monospace}
table.verdicts{border-collapse:collapse;width:1240px;margin-top:8px}
table.verdicts th,table.verdicts td{border-bottom:1px solid #e5e5e5;padding:4px 6px;text-align:left;vertical-align:top}
table.verdicts td.subject{font-family:ui-monospace,Menlo,Consolas,monospace;max-width:260px;overflow-wrap:anywhere}
tr.fail td.verdict{color:${COLOR.fail};font-weight:700} tr.pass td.verdict{color:${COLOR.pass};font-weight:700} ` +
  `tr.unverified td.verdict{color:${COLOR.unverified};font-weight:700}
pre{background:#f6f6f6;padding:6px;max-height:320px;overflow:auto;font-size:12px;
white-space:pre-wrap;overflow-wrap:anywhere}
svg text{font-family:system-ui,"DejaVu Sans",sans-serif} svg .tick{font-size:10px;fill:#666}
svg .label{font-size:11px;fill:#333}
svg .legend{font-size:11px;fill:#333} svg .marker{font-size:10px;fill:#777}
svg .fault-label{font-size:11px;fill:#7a5b00}
svg .series-name{font-size:11px;fill:#333} svg .note{font-size:11px;fill:#777}
`

/** A run's verdict: pass, fail, or stopped. */
export function runStatus(run: SuiteRun): 'pass' | 'fail' | 'stopped' {
  return run.stopped ? 'stopped' : runPassed(run) ? 'pass' : 'fail'
}

/** The body of a run's report after its title: facts, counts, stop, gate, failed checks and a section per scenario.
 * idPrefix keeps the scenarios' anchors apart when several runs share a page (a fleet's report). */
export function runBody(run: SuiteRun, options: HtmlOptions = {}, idPrefix = ''): string[] {
  const opts: Required<HtmlOptions> = {maxPinRows: options.maxPinRows ?? 120, maxSeries: options.maxSeries ?? 6}
  const c = runCounts(run)
  const failures = failedChecks(run)
  const failedList =
    failures.length === 0
      ? '<p class="note">no check failed</p>'
      : `<h2>Failed checks (${failures.length})</h2><ul class="failed">${failures
          .map(
            ({scenario, verdict: v}) =>
              `<li><b>${esc(scenario)}</b> · ${esc(v.check)} · <span class="subject">${esc(v.subject)}</span> ` +
              `— ${esc(v.summary)}</li>`,
          )
          .join('')}</ul>`
  return [
    `<p class="facts">${esc(
      `${run.engine ? `engine ${run.engine} · ` : ''}deployment ${run.deployment} · started ${iso(run.startedAt)} ` +
        `· ${fmt((run.finishedAt - run.startedAt) / 1000, 1)} s`,
    )}</p>`,
    `<p class="counts"><span><b>${c.passed}</b> passed</span><span><b>${c.failed}</b> ` +
      `failed</span><span><b>${c.unverified}</b> unverified</span><span><b>${c.scenarios}</b> scenarios</span>` +
      `<span><b>${c.errored}</b> errored</span><span><b>${c.faultsLeftBehind}</b> faults left behind</span></p>`,
    run.stopped ? `<p class="error">Stopped: ${esc(run.stopped.reason)}</p>` : '',
    run.gate
      ? `<p class="facts">Release ` +
        `gate: ${run.gate.passed ? 'passed' : 'failed'}` +
        `${run.gate.reasons.length > 0 ? ` — ${esc(run.gate.reasons.join('; '))}` : ''}</p>`
      : '',
    failedList,
    ...run.scenarios.map((s, i) => scenarioSection(s, `${idPrefix}scenario-${i}`, opts)),
  ]
}

export function renderHtml(run: SuiteRun, options: HtmlOptions = {}): string {
  const status = runStatus(run)
  return [
    '<!DOCTYPE html>',
    '<html lang="en"><head><meta charset="utf-8">',
    `<title>${esc(`pdchaos ${run.name}: ${status.toUpperCase()}`)}</title>`,
    `<style>${HTML_CSS}</style></head><body>`,
    `<h1><span class="badge ${status}">${status.toUpperCase()}</span> pdchaos ${esc(run.name)}</h1>`,
    ...runBody(run, options),
    '</body></html>',
    '',
  ].join('\n')
}
