import type {FleetMember, FleetRun} from '../model/fleet.js'
import {failedChecks, runCounts} from '../model/run.js'
import {HTML_CSS, type HtmlOptions, runBody} from './html.js'
import {fleetTitle} from './fleet-text.js'
import {escapeAttr as attr, escapeXml as esc} from './junit.js'

/**
 * The fleet's single-file HTML report: an index (one row per deployment: its verdict, exit code, counts, where it ran,
 * and for one that reached no verdict the reason), every failed check across the fleet, then each deployment's own
 * report embedded (the same body `suite --html` writes for it). One file, no script and no link outside it, so it opens
 * from a CI artifact store as it is.
 */

const BADGE: Record<FleetMember['status'], string> = {
  pass: 'pass',
  fail: 'fail',
  stopped: 'stopped',
  'cleanup-unverified': 'fail',
  unreachable: 'error',
  error: 'error',
  'not-run': 'unverified',
}

const FLEET_CSS =
  `
table.fleet{border-collapse:collapse;margin:10px 0 18px} table.fleet th,table.fleet td{border-bottom:1px solid ` +
  `#e5e5e5;padding:4px 10px;text-align:left;vertical-align:top}
section.deployment{border-top:3px solid #ddd;margin-top:36px;padding-top:4px} section.deployment>h1{font-size:20px}
`

/** The anchor of a deployment's section (names are plain characters; escaped anyway). */
const anchor = (m: FleetMember) => `deployment-${m.name}`

function row(m: FleetMember): string {
  const c = m.run ? runCounts(m.run) : undefined
  const checks = c
    ? `${c.passed} passed, ${c.failed} failed, ${c.unverified} unverified, ${c.scenarios} ` +
      `scenarios${c.faultsLeftBehind ? `, ${c.faultsLeftBehind} faults left behind` : ''}`
    : '—'
  const where = [m.deployment, m.target].filter(Boolean).join(' · ')
  return (
    `<tr><td><a href="#${attr(anchor(m))}">${esc(m.name)}</a></td><td><span ` +
    `class="badge ${BADGE[m.status]}">${esc(m.status.toUpperCase())}</span></td>` +
    `<td>${m.exitCode}</td><td>${esc(checks)}</td><td>${esc(where)}</td><td>` +
    `${m.reason === undefined ? '' : `<span class="error">${esc(m.reason)}</span>`}</td></tr>`
  )
}

function section(m: FleetMember, options: HtmlOptions): string {
  return [
    `<section class="deployment" id="${attr(anchor(m))}">`,
    `<h1><span class="badge ${BADGE[m.status]}">${esc(m.status.toUpperCase())}</span> ${esc(m.name)}` +
      `${m.run ? ` — suite ${esc(m.run.name)}` : ''}</h1>`,
    `<p class="facts">${esc(
      [
        `exit ${m.exitCode}`,
        m.target,
        m.config && `deployment ` + `file ${m.config}`,
        m.journal && `journal ${m.journal}`,
      ]
        .filter(Boolean)
        .join(' · '),
    )}</p>`,
    m.reason === undefined
      ? ''
      : `<p class="error">${esc(m.reason)}</p>${
          m.suggestion ? `<p class="facts">Try ` + `this: ${esc(m.suggestion)}</p>` : ''
        }`,
    ...(m.run
      ? runBody(m.run, options, `${anchor(m)}-`)
      : ['<p class="note">no run: no verdicts for this deployment</p>']),
    '</section>',
  ].join('\n')
}

export function renderFleetHtml(fleet: FleetRun, options: HtmlOptions = {}): string {
  const status = fleet.exitCode === 0 ? 'pass' : fleet.exitCode === 3 ? 'stopped' : 'fail'
  const failed = fleet.members.flatMap(m => (m.run ? failedChecks(m.run).map(f => ({m, ...f})) : []))
  const failedList =
    failed.length === 0
      ? '<p class="note">no check failed</p>'
      : `<h2>Failed checks (${failed.length})</h2><ul class="failed">${failed
          .map(
            ({m, scenario, verdict: v}) =>
              `<li><b>${esc(m.name)}</b> · <b>${esc(scenario)}</b> · ${esc(v.check)} · <span ` +
              `class="subject">${esc(v.subject)}</span> — ${esc(v.summary)}</li>`,
          )
          .join('')}</ul>`
  return [
    '<!DOCTYPE html>',
    '<html lang="en"><head><meta charset="utf-8">',
    `<title>${esc(`pdchaos ${fleetTitle(fleet)}: ${status.toUpperCase()} (exit ${fleet.exitCode})`)}</title>`,
    `<style>${HTML_CSS}${FLEET_CSS}</style></head><body>`,
    `<h1><span class="badge ${status}">${status.toUpperCase()}</span> pdchaos ${esc(fleetTitle(fleet))}</h1>`,
    `<p class="facts">${esc(
      `${fleet.members.length} deployment(s) · exit ${fleet.exitCode} · ` +
        `started ${new Date(fleet.startedAt).toISOString()} ` +
        `· ${((fleet.finishedAt - fleet.startedAt) / 1000).toFixed(1)} ` +
        `s${fleet.maxParallel ? ` · at most ${fleet.maxParallel} at a time` : ''}`,
    )}</p>`,
    '<table class="fleet"><thead><tr><th>deployment</th><th>verdict</th><th>exit</th><th>checks</th>' +
      '<th>where</th><th>reason</th></tr></thead><tbody>',
    ...fleet.members.map(row),
    '</tbody></table>',
    failedList,
    ...fleet.members.map(m => section(m, options)),
    '</body></html>',
    '',
  ].join('\n')
}
