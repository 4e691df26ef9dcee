import type {FleetMember, FleetRun} from '../model/fleet.js'
import {
  type CaseCounts,
  classPart,
  escapeAttr,
  escapeXml,
  junitTimestamp,
  scenarioCases,
  secs,
  systemOut,
  testsuitesDocument,
} from './junit.js'

/**
 * JUnit XML of a fleet: one <testsuite> per deployment, its testcases those of every scenario of its run (classnames
 * `pdchaos.<deployment>.<scenario>.<check>`, so CI servers group them by deployment). A deployment that reached no
 * verdict (unreachable, refused, crashed) is one testcase with an <error> carrying the reason; one never run (the fleet
 * was stopped first) is skipped.
 */

function memberProperties(m: FleetMember): Array<[string, string]> {
  const props: Array<[string, string]> = [
    ['status', m.status],
    ['exitCode', String(m.exitCode)],
  ]
  for (const [k, v] of [
    ['deployment', m.deployment],
    ['target', m.target],
    ['config', m.config],
    ['suite', m.suite],
    ['journal', m.journal],
  ] as const) {
    if (v !== undefined) props.push([k, v])
  }
  if (m.run?.stopped) props.push(['run.stopped', m.run.stopped.reason])
  if (m.run?.gate) props.push(['run.gate', m.run.gate.passed ? 'passed' : `failed: ${m.run.gate.reasons.join('; ')}`])
  return props
}

function memberSuite(m: FleetMember, fleetStart: number, out: string[]): CaseCounts {
  const counts: CaseCounts = {tests: 0, failures: 0, errors: 0, skipped: 0}
  const cases: string[] = []
  const prefix = `pdchaos.${classPart(m.name)}`
  for (const s of m.run?.scenarios ?? []) {
    const c = scenarioCases(m.run!, s, prefix)
    cases.push(...c.cases)
    counts.tests += c.tests
    counts.failures += c.failures
    counts.errors += c.errors
    counts.skipped += c.skipped
  }
  if (m.reason !== undefined) {
    // What happened to the deployment itself: the reason a CI server shows for it.
    const head =
      `    <testcase name="${escapeAttr(`deployment ${m.name}`)}" ` +
      `classname="${escapeAttr(`${prefix}.run`)}" time="0.000">`
    const text = m.suggestion ? `${m.reason}\nTry this: ${m.suggestion}` : m.reason
    counts.tests++
    if (m.status === 'not-run') {
      counts.skipped++
      cases.push(head, `      <skipped message="${escapeAttr(m.reason)}"/>`, '    </testcase>')
    } else {
      counts.errors++
      cases.push(
        head,
        `      <error message="${escapeAttr(`${m.status}: ${m.reason}`)}" ` +
          `type="${escapeAttr(m.status)}">${escapeXml(text)}</error>`,
        '    </testcase>',
      )
    }
  }
  // The Ant schema wants a timestamp on every testsuite: a deployment that never ran has the fleet's.
  const from = m.run?.startedAt ?? fleetStart
  const time = m.run ? secs(m.run.finishedAt - m.run.startedAt) : '0.000'
  out.push(
    `  <testsuite name="${escapeAttr(m.name)}" tests="${counts.tests}" failures="${counts.failures}" ` +
      `errors="${counts.errors}" skipped="${counts.skipped}" time="${time}" timestamp="${junitTimestamp(from)}">`,
    '    <properties>',
    ...memberProperties(m).map(([k, v]) => `      <property name="${escapeAttr(k)}" value="${escapeAttr(v)}"/>`),
    '    </properties>',
    ...cases,
    `    <system-out>${escapeXml(
      (m.run?.scenarios ?? [])
        .map(s => systemOut(s))
        .filter(Boolean)
        .join('\n'),
    )}</system-out>`,
    '    <system-err></system-err>',
    '  </testsuite>',
  )
  return counts
}

export function renderFleetJUnit(fleet: FleetRun): string {
  const body: string[] = []
  return testsuitesDocument(
    fleet,
    fleet.members.map(m => memberSuite(m, fleet.startedAt, body)),
    body,
  )
}
