import {spawnSync} from 'node:child_process'
import {mkdtempSync, rmSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {fileURLToPath} from 'node:url'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {escapeAttr, escapeXml, junitTimestamp, renderJUnit} from '../../src/report/junit.js'
import type {SuiteRun} from '../../src/model/run.js'
import {NASTY, syntheticRun, T0} from './synthetic-run.js'
import {ensureTool} from './tools.js'

const XSD = fileURLToPath(new URL('fixtures/junit.xsd', import.meta.url))
let dir: string
let xmllint: string

beforeAll(() => {
  xmllint = ensureTool('xmllint', 'libxml2-utils')
  dir = mkdtempSync(join(tmpdir(), 'pdchaos-junit-'))
}, 200_000)
afterAll(() => {
  if (dir) rmSync(dir, {recursive: true, force: true})
})

function lint(xml: string, name: string, ...args: string[]) {
  const file = join(dir, name)
  writeFileSync(file, xml)
  const r = spawnSync(xmllint, [...args, file], {encoding: 'utf8', timeout: 20_000})
  return {code: r.status, stdout: r.stdout, stderr: r.stderr}
}
const validate = (xml: string, name: string) => lint(xml, name, '--noout', '--schema', XSD)
const xpath = (xml: string, name: string, expr: string) => lint(xml, name, '--xpath', expr).stdout.replace(/\n$/, '')

describe('renderJUnit', () => {
  it('a run with a failing pin validates against the JUnit schema, one testcase per verdict', () => {
    const run = syntheticRun({failing: true})
    const xml = renderJUnit(run)
    const r = validate(xml, 'fail.xml')
    expect(r.stderr).toContain('validates')
    expect(r.code).toBe(0)
    const verdicts = run.scenarios.reduce((n, s) => n + s.verdicts.length, 0)
    expect(xpath(xml, 'q1.xml', 'count(//testcase)')).toBe(String(verdicts))
    expect(xpath(xml, 'q2.xml', 'count(//testsuite)')).toBe('3')
    expect(xpath(xml, 'q3.xml', 'string(/testsuites/@failures)')).toBe('1')
    expect(xpath(xml, 'q4.xml', 'count(//failure)')).toBe('1')
    expect(xpath(xml, 'q5.xml', 'string(//testcase[failure]/@classname)')).toBe('pdchaos.drop-dest-info.eviction')
    expect(xpath(xml, 'q6.xml', 'string(//testsuite[1]/@time)')).toBe('4.700')
    expect(xpath(xml, 'q7.xml', 'string(//testsuite[2]/@timestamp)')).toBe(junitTimestamp(T0 + 5000))
    expect(
      xpath(xml, 'q8.xml', 'string(//testsuite[1]/properties/property[@name="contract.deadlineSeconds"]/@value)'),
    ).toBe('2')
    expect(xpath(xml, 'q8b.xml', 'string(//testsuite[2]/properties/property[@name="params"]/@value)')).toBe('{"gpu":2}')
  })

  it('escapes markup and drops control characters: the failing rid round-trips through a real XML parser', () => {
    const xml = renderJUnit(syntheticRun({failing: true}))
    expect(xml).not.toContain('<script>')
    expect(xml).not.toContain('\u0001')
    const name = xpath(xml, 'r1.xml', 'string(//testcase[failure]/@name)')
    expect(name).toBe(`eviction ${NASTY.replace('\u0001', '')}`)
    // The failure carries the summary as its message and the evidence as pretty JSON text.
    const message = xpath(xml, 'r2.xml', 'string(//failure/@message)')
    expect(message).toMatch(/^never evicted: still held after/)
    const evidence = JSON.parse(xpath(xml, 'r3.xml', 'string(//failure)')) as Record<string, unknown>
    expect(evidence.contract).toEqual({scope: 'all', deadlineSeconds: 2, pollSeconds: 0.5})
    expect(evidence.leftIn).toEqual({queue: 'bootstrap', kvPoll: 'Bootstrapping'})
  })

  it('a passing run has no failure elements and still validates', () => {
    const xml = renderJUnit(syntheticRun({failing: false}))
    expect(validate(xml, 'pass.xml').code).toBe(0)
    expect(xpath(xml, 'p1.xml', 'count(//failure)')).toBe('0')
    expect(xpath(xml, 'p2.xml', 'string(/testsuites/@tests)')).toBe('15')
  })

  it('a stopped run and a scenario that errored: <skipped> and <error>, still valid', () => {
    const base = syntheticRun({failing: false})
    const run: SuiteRun = {
      ...base,
      stopped: {reason: 'router health failing for 12 s (limit 10 s)'},
      scenarios: [
        base.scenarios[0],
        {
          ...base.scenarios[1],
          verdicts: [],
          pins: [],
          error: 'prefill unreachable: connect ECONNREFUSED 127.0.0.1:30000',
        },
        {...base.scenarios[2], verdicts: [], pins: []},
      ],
    }
    const xml = renderJUnit(run)
    expect(validate(xml, 'stopped.xml').code).toBe(0)
    expect(xpath(xml, 's1.xml', 'string(/testsuites/@errors)')).toBe('1')
    expect(xpath(xml, 's2.xml', 'string(/testsuites/@skipped)')).toBe('1')
    expect(xpath(xml, 's3.xml', 'string(//error/@message)')).toContain('ECONNREFUSED')
    expect(xpath(xml, 's4.xml', 'string(//skipped/@message)')).toContain('run stopped: router health failing')
  })

  it('the validator rejects malformed documents, so the checks above can fail', () => {
    const xml = renderJUnit(syntheticRun({failing: true}))
    const noName = xml.replace('<testcase name="eviction pin-d1" ', '<testcase ')
    expect(noName).not.toBe(xml)
    const r1 = validate(noName, 'bad1.xml')
    expect(r1.code).not.toBe(0)
    expect(r1.stderr).toMatch(/name.*required|required.*name/i)
    const zoned = xml.replace(/timestamp="([0-9T:-]+)"/, 'timestamp="$1Z"')
    expect(validate(zoned, 'bad2.xml').code).not.toBe(0)
    const noTime = xml.replace(/(<testcase name="eviction pin-d2" classname="[^"]+") time="[^"]+"/, '$1')
    expect(noTime).not.toBe(xml)
    expect(validate(noTime, 'bad3.xml').code).not.toBe(0)
  })

  it('escape helpers: attributes keep newlines and quotes as references, text drops invalid characters', () => {
    expect(escapeXml('a<b>&c\u0000\u001f\ud800z')).toBe('a&lt;b&gt;&amp;cz')
    expect(escapeXml('emoji \ud83d\ude00 ok')).toBe('emoji \ud83d\ude00 ok')
    expect(escapeAttr('x "y"\n\'z\'\t')).toBe('x &quot;y&quot;&#10;&apos;z&apos;&#9;')
  })
})
