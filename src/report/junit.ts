import type {Verdict} from '../model/verdict.js'
import type {ScenarioRun, SuiteRun} from '../model/run.js'

/**
 * JUnit XML of a suite run, in the Ant/Jenkins shape CI servers read: one <testsuite> per scenario, one <testcase>
 * per verdict (so one per pin and one per other check), a <failure> carrying the evidence for each failed check.
 * Timestamps are UTC without a zone suffix and times are decimal seconds, as the Ant schema wants them.
 */

/** Characters XML 1.0 cannot carry at all (even escaped): C0 controls but tab/LF/CR, lone surrogates, U+FFFE/U+FFFF. */
// eslint-disable-next-line no-control-regex
const CONTROL_OR_NONCHAR = /[\u0000-\u0008\u000B\u000C\u000E-\u001F\uFFFE\uFFFF]/
/** A high surrogate with no low one after it, or a low one with no high one before it. */
const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/
const INVALID_XML = new RegExp(`${CONTROL_OR_NONCHAR.source}|${LONE_SURROGATE.source}`, 'g')

/** Text content: control characters dropped, markup escaped. */
export function escapeXml(text: string): string {
  return text.replace(INVALID_XML, '').replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;')
}

/**
 * An attribute value (double-quoted): also quotes, and whitespace kept as references so parsers do not normalise it.
 */
export function escapeAttr(text: string): string {
  return escapeXml(text)
    .replace(/"/g, '&quot;')
    .replace(/'/g, '&apos;')
    .replace(/\n/g, '&#10;')
    .replace(/\r/g, '&#13;')
    .replace(/\t/g, '&#9;')
}

export const secs = (ms: number): string => Math.max(0, ms / 1000).toFixed(3)

/** ISO 8601 in UTC, to the second, without a zone designator (the Ant schema's timestamp pattern). */
export function junitTimestamp(ms: number): string {
  return new Date(ms).toISOString().slice(0, 19)
}

/** Scenario names go into dotted class names; dots in them would split the class path CI servers show. */
export const classPart = (s: string): string => s.replace(/[.\s]+/g, '_')

function testcaseTime(s: ScenarioRun, v: Verdict): number {
  const pin = s.pins.find(p => p.rid === v.subject)
  if (pin?.evictionSeconds !== null && pin?.evictionSeconds !== undefined) return pin.evictionSeconds
  const held = v.evidence.heldSeconds
  return typeof held === 'number' ? held : 0
}

function properties(run: SuiteRun, s: ScenarioRun): Array<[string, string]> {
  const props: Array<[string, string]> = [
    ['run', run.name],
    ['deployment', run.deployment],
    ...(run.engine ? [['engine', run.engine] as [string, string]] : []),
    ['kind', s.kind],
    ['contract.scope', s.contract.scope],
    ['contract.deadlineSeconds', String(s.contract.deadlineSeconds)],
    ['contract.pollSeconds', String(s.contract.pollSeconds)],
  ]
  if (s.fault !== undefined) props.push(['fault', s.fault])
  if (s.params !== undefined) props.push(['params', JSON.stringify(s.params)])
  for (const l of s.leases) props.push([`lease.${l.id}`, `verifiedClean=${l.verifiedClean}`])
  if (run.stopped) props.push(['run.stopped', run.stopped.reason])
  return props
}

export function systemOut(s: ScenarioRun): string {
  const iso = (ms: number | null) => (ms === null ? 'never' : new Date(ms).toISOString())
  const lines = s.leases.map(
    l =>
      `lease ${l.id} ${l.fault} (${l.mechanism}): injected ${iso(l.injectedAt)}, reverted ${iso(l.revertedAt)}, ` +
      `verified clean: ${l.verifiedClean}`,
  )
  for (const p of s.pins) {
    lines.push(
      `pin ${p.rid}: ${p.verdict}, evicted ` +
        `after ${p.evictionSeconds === null ? 'never' : p.evictionSeconds + ' s'}, window [${p.bounds[0]} ` +
        `s, ${p.bounds[1]} s]`,
    )
  }
  return lines.join('\n')
}

export interface CaseCounts {
  tests: number
  failures: number
  errors: number
  skipped: number
}

/** A scenario's testcases: one per verdict, and one for the scenario itself when it errored or was never run.
 * classPrefix heads every classname (`pdchaos`, or `pdchaos.<deployment>` in a fleet's report). */
export function scenarioCases(run: SuiteRun, s: ScenarioRun, classPrefix = 'pdchaos'): CaseCounts & {cases: string[]} {
  const cases: string[] = []
  let failures = 0
  let errors = 0
  let skipped = 0
  for (const v of s.verdicts) {
    const head =
      `    <testcase name="${escapeAttr(`${v.check} ${v.subject}`)}" ` +
      `classname="${escapeAttr(`${classPrefix}.${classPart(s.name)}.${v.check}`)}" ` +
      `time="${testcaseTime(s, v).toFixed(3)}"`
    if (v.verdict === 'pass') {
      cases.push(`${head}/>`)
      continue
    }
    if (v.verdict === 'unverified') {
      // Neither a pass nor a failure: JUnit's skipped, with why and what would make it verifiable.
      skipped++
      cases.push(
        `${head}>`,
        `      <skipped ` +
          `message="${escapeAttr(
            `unverified: ${v.summary} (${String(v.evidence.why)}; to ` + `verify: ${String(v.evidence.toVerify)})`,
          )}"/>`,
        '    </testcase>',
      )
      continue
    }
    failures++
    cases.push(
      `${head}>`,
      `      <failure message="${escapeAttr(v.summary)}" ` +
        `type="${escapeAttr(v.check)}">${escapeXml(JSON.stringify(v.evidence, null, 2))}</failure>`,
      '    </testcase>',
    )
  }
  const runCase =
    `    <testcase name="${escapeAttr(`scenario ${s.name}`)}" ` +
    `classname="${escapeAttr(`${classPrefix}.${classPart(s.name)}.run`)}" time="${secs(s.finishedAt - s.startedAt)}">`
  if (s.status === 'halted') {
    // Halted (`pdchaos halt`) before it finished: not a failure of the deployment, nor of the infrastructure.
    skipped++
    cases.push(
      runCase,
      `      <skipped message="${escapeAttr(`halted: ${run.stopped?.reason ?? ''}`)}"/>`,
      '    </testcase>',
    )
  } else if (s.error !== undefined) {
    errors++
    cases.push(
      runCase,
      `      <error message="${escapeAttr(s.error)}" type="infrastructure">${escapeXml(s.error)}</error>`,
      '    </testcase>',
    )
  } else if (s.verdicts.length === 0 && run.stopped) {
    skipped++
    cases.push(
      runCase,
      `      <skipped message="${escapeAttr(`run stopped: ${run.stopped.reason}`)}"/>`,
      '    </testcase>',
    )
  }
  return {cases, tests: s.verdicts.length + errors + skipped, failures, errors, skipped}
}

function renderSuite(run: SuiteRun, s: ScenarioRun, out: string[]): CaseCounts {
  const {cases, ...counts} = scenarioCases(run, s)
  out.push(
    `  <testsuite name="${escapeAttr(s.name)}" tests="${counts.tests}" failures="${counts.failures}" ` +
      `errors="${counts.errors}" skipped="${counts.skipped}" time="${secs(s.finishedAt - s.startedAt)}" ` +
      `timestamp="${junitTimestamp(s.startedAt)}">`,
    '    <properties>',
    ...properties(run, s).map(([k, v]) => `      <property name="${escapeAttr(k)}" value="${escapeAttr(v)}"/>`),
    '    </properties>',
    ...cases,
    `    <system-out>${escapeXml(systemOut(s))}</system-out>`,
    '    <system-err></system-err>',
    '  </testsuite>',
  )
  return counts
}

export function renderJUnit(run: SuiteRun): string {
  const body: string[] = []
  return testsuitesDocument(
    run,
    run.scenarios.map(s => renderSuite(run, s, body)),
    body,
  )
}

/** The <testsuites> document around testsuites already rendered into `body`, with their summed counts. */
export function testsuitesDocument(
  o: {name: string; startedAt: number; finishedAt: number},
  counts: CaseCounts[],
  body: string[],
): string {
  const total: CaseCounts = {tests: 0, failures: 0, errors: 0, skipped: 0}
  for (const c of counts) {
    total.tests += c.tests
    total.failures += c.failures
    total.errors += c.errors
    total.skipped += c.skipped
  }
  return [
    '<?xml version="1.0" encoding="UTF-8"?>',
    `<testsuites name="${escapeAttr(o.name)}" tests="${total.tests}" failures="${total.failures}" ` +
      `errors="${total.errors}" skipped="${total.skipped}" time="${secs(o.finishedAt - o.startedAt)}" ` +
      `timestamp="${junitTimestamp(o.startedAt)}">`,
    ...body,
    '</testsuites>',
    '',
  ].join('\n')
}
