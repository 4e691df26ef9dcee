import {spawnSync} from 'node:child_process'
import {copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {parseAllDocuments} from 'yaml'

import {ensureTool} from '../report/tools.js'

// Issue 32 item 4: the nightly examples under docs/nightly/ are valid (systemd-analyze verify, YAML) and run pdchaos
// exactly as the README's "Run it every night" commands do, so that neither can drift from the other.

const ROOT = join(import.meta.dirname, '../..')
const NIGHTLY = join(ROOT, 'docs/nightly')
const read = (file: string) => readFileSync(file, 'utf8')

/** The lines of a text that run pdchaos (leading blanks dropped). */
const pdchaosLines = (text: string) =>
  text
    .split('\n')
    .map(l => l.trim())
    .filter(l => l.startsWith('pdchaos '))

/** The README's "Run it every night" commands: the pdchaos lines of its code blocks. */
function readmeCommands(): string[] {
  const readme = read(join(ROOT, 'README.md'))
  const start = readme.indexOf('## Run it every night')
  expect(start).toBeGreaterThan(0)
  const end = readme.indexOf('\n## ', start + 5)
  const section = readme.slice(start, end < 0 ? undefined : end)
  const blocks = [...section.matchAll(/```[a-z]*\n([\s\S]*?)```/g)].map(m => m[1]!)
  return blocks.flatMap(pdchaosLines)
}

/** Every string of every YAML document, depth first. */
function yamlStrings(v: unknown): string[] {
  if (typeof v === 'string') return [v]
  if (Array.isArray(v)) return v.flatMap(yamlStrings)
  if (v && typeof v === 'object') return Object.values(v).flatMap(yamlStrings)
  return []
}

function yamlDocs(file: string): unknown[] {
  const docs = parseAllDocuments(read(file))
  for (const d of docs)
    expect(
      d.errors.map(e => e.message),
      file,
    ).toEqual([])
  return docs.map(d => d.toJS() as unknown)
}

let dir: string
let analyze: string
beforeAll(() => {
  analyze = ensureTool('systemd-analyze', 'systemd')
  dir = mkdtempSync(join(tmpdir(), 'pdchaos-nightly-'))
})
afterAll(() => {
  if (dir) rmSync(dir, {recursive: true, force: true})
})

function verify(files: string[]): {status: number | null; out: string} {
  const r = spawnSync(analyze, ['verify', ...files], {
    encoding: 'utf8',
    timeout: 60_000,
    env: {...process.env, SYSTEMD_LOG_COLOR: '0'},
  })
  return {status: r.status, out: (r.stdout + r.stderr).trim()}
}

describe('Run it every night', () => {
  const commands = readmeCommands()

  it('the README names the suite, the combined report, the trend and the gate', () => {
    expect(commands).toHaveLength(4)
    expect(commands.filter(c => c.startsWith('pdchaos suite ') && c.includes('--gate'))).toHaveLength(1)
    expect(commands.filter(c => c.startsWith('pdchaos report --trend '))).toHaveLength(1)
  })

  it('the systemd service and timer verify cleanly (systemd-analyze), and a broken unit does not', () => {
    const units = ['pdchaos-nightly.service', 'pdchaos-nightly.timer'].map(u => {
      copyFileSync(join(NIGHTLY, u), join(dir, u))
      return join(dir, u)
    })
    const ok = verify(units)
    expect(ok, ok.out).toEqual({status: 0, out: ''})
    // The check has teeth: a typo in a key or a calendar is reported.
    const timer = read(join(NIGHTLY, 'pdchaos-nightly.timer'))
    const badTimer = timer.replace('OnCalendar=*-*-* 02:30:00 UTC', 'OnCalendar=nightly at 2')
    writeFileSync(join(dir, 'pdchaos-nightly.timer'), badTimer)
    const service = read(join(NIGHTLY, 'pdchaos-nightly.service'))
    writeFileSync(join(dir, 'pdchaos-nightly.service'), service.replace('TimeoutStartSec=', 'TimeoutStartSecs='))
    const bad = verify(units)
    expect(bad.status).not.toBe(0)
    expect(bad.out).toMatch(/OnCalendar|calendar/i)
    expect(bad.out).toMatch(/TimeoutStartSecs/)
    // The service runs the script the README says to install, and the script runs the README's commands.
    expect(service).toMatch(/^ExecStart=\/bin\/sh \/usr\/local\/lib\/pdchaos\/pdchaos-nightly\.sh$/m)
    const script = pdchaosLines(read(join(NIGHTLY, 'pdchaos-nightly.sh')))
    expect(script).toEqual([commands[0], commands[1], commands[2]])
    const sh = spawnSync('sh', ['-n', join(NIGHTLY, 'pdchaos-nightly.sh')], {encoding: 'utf8'})
    expect(sh.status, sh.stderr).toBe(0)
  })

  it('the CronJobs are valid YAML: one suite per indexed job, then the report combining them and the trend', () => {
    const docs = yamlDocs(join(NIGHTLY, 'cronjob.yaml')) as Array<Record<string, any>>
    expect(docs.map(d => [d.apiVersion, d.kind, d.metadata.name])).toEqual([
      ['batch/v1', 'CronJob', 'pdchaos-nightly'],
      ['batch/v1', 'CronJob', 'pdchaos-report'],
    ])
    const job = docs[0]!.spec.jobTemplate.spec
    expect(job.completionMode).toBe('Indexed')
    const env = job.template.spec.containers[0].env as Array<{name: string; value: string}>
    const names = env.find(e => e.name === 'DEPLOYMENTS')!.value.split(' ')
    expect(job.completions).toBe(names.length)
    const scripts = docs.map(d =>
      (d.spec.jobTemplate.spec.template.spec.containers as Array<Record<string, unknown>>)
        .flatMap(c => yamlStrings(c.args))
        .join('\n'),
    )
    expect(pdchaosLines(scripts[0]!)).toEqual([commands[0]])
    expect(pdchaosLines(scripts[1]!)).toEqual([commands[1], commands[2]])
    for (const s of scripts) expect(spawnSync('sh', ['-n', '-c', s], {encoding: 'utf8'}).status).toBe(0)
  })

  it("the CI workflow is valid YAML: the gate's exit code fails the job, the JUnit is published always", () => {
    const [wf] = yamlDocs(join(NIGHTLY, 'release-gate.yml')) as Array<Record<string, any>>
    const steps = wf!.jobs['release-gate'].steps as Array<Record<string, any>>
    const gate = steps.find(s => typeof s.run === 'string' && s.run.includes('pdchaos '))!
    expect(pdchaosLines(gate.run)).toEqual([commands[3]])
    // No `|| true`, no continue-on-error: the exit code is the verdict.
    expect(gate.run).not.toMatch(/\|\||;\s*true|set \+e/)
    expect(gate['continue-on-error']).toBeUndefined()
    const junit = steps.find(s => String(s.uses ?? '').includes('junit'))!
    expect(junit.if).toBe('always()')
    expect(junit.with.report_paths).toBe('junit.xml')
    expect(commands[3]).toContain('--junit junit.xml')
  })

  it('every README command is run by an example, and no example runs pdchaos otherwise', () => {
    const files = ['pdchaos-nightly.sh', 'cronjob.yaml', 'release-gate.yml']
    const used = files.flatMap(f => pdchaosLines(read(join(NIGHTLY, f))))
    for (const line of used) expect(commands).toContain(line)
    expect(new Set(used)).toEqual(new Set(commands))
  })
})
