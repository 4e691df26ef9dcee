import type {FleetRun} from '../model/fleet.js'
import {renderFleetHtml} from '../report/fleet-html.js'
import {renderFleetJUnit} from '../report/fleet-junit.js'
import {fleetJson, renderFleet} from '../report/fleet-text.js'
import {pushFleet} from '../report/push.js'
import {redactText} from '../util/redact.js'
import {checkOutputFile, checkPushUrl, outputWriter} from './outputs.js'

/**
 * How a fleet's report ends, for `suite --fleet` and `pdchaos report` alike: the summary and the exit code first, then
 * the combined JUnit, HTML and Pushgateway push, each failure reported with the verdict kept (as a single run's).
 */

export interface FleetOutputs {
  junit?: string
  html?: string
  push?: string
}

/** Checked before the run (or the journals are read): exit 2 naming the flag. */
export function checkFleetOutputs(o: FleetOutputs): void {
  if (o.junit !== undefined) checkOutputFile('--junit', o.junit)
  if (o.html !== undefined) checkOutputFile('--html', o.html)
  if (o.push !== undefined) checkPushUrl('--push', o.push)
}

export async function finishFleet(
  fleet: FleetRun,
  o: {json: boolean; log: (text: string) => void; files: FleetOutputs; runId: string; wallMs?: number},
): Promise<Record<string, unknown>> {
  if (!o.json) o.log(renderFleet(fleet, o.wallMs === undefined ? {} : {wallMs: o.wallMs}))
  process.exitCode = fleet.exitCode
  const {errors, attempt, write} = outputWriter()
  const {junit, html, push} = o.files
  if (junit) await attempt(`JUnit to ${junit}`, () => write(junit, renderFleetJUnit(fleet)))
  if (html) await attempt(`the HTML report to ${html}`, () => write(html, renderFleetHtml(fleet)))
  let pushed = push
    ? await attempt(`metrics to the Pushgateway at ${redactText(push)}`, () => pushFleet(push, fleet, o.runId))
    : undefined
  // The gateway URL may carry basic-auth credentials: never printed, never in the JSON result.
  if (pushed) {
    pushed = {...pushed, url: redactText(pushed.url)}
    if (!o.json) process.stderr.write(`pushed ${pushed.series} series to ${pushed.url}\n`)
  }
  return {
    ...fleetJson(fleet),
    ...(fleet.runId ? {} : {runId: o.runId}),
    ...(pushed ? {pushed} : {}),
    ...(errors.length ? {outputErrors: errors} : {}),
  }
}
