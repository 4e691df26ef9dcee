import {chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {afterAll, describe, expect, it} from 'vitest'

import {PdError} from '../../src/errors.js'
import {haltPresent, readHalt, removeHalt, writeHalt, type HaltHost} from '../../src/halt/host-halt.js'
import {guardRun, watchHalt} from '../../src/halt/watch.js'
import {LocalHost} from '../../src/hosts/local-host.js'
import {
  HALT_REASON_MAX,
  haltLine,
  haltText,
  markHalted,
  newHalt,
  parseHalt,
  type HaltRecord,
} from '../../src/model/halt.js'
import {runExitCode} from '../../src/model/run.js'
import {checkJournal} from '../../src/report/journal-schema.js'
import {runJournal} from '../../src/report/journal-fields.js'
import {renderHtml} from '../../src/report/html.js'
import {renderJUnit} from '../../src/report/junit.js'
import {renderSuite} from '../../src/report/suite-text.js'
import {haltLines} from '../../src/report/status-text.js'
import {syntheticRun} from '../report/synthetic-run.js'

const AT = Date.UTC(2026, 11, 4, 3, 12, 0)
const root = mkdtempSync(join(tmpdir(), 'pdchaos-halt-unit-'))
afterAll(() => rmSync(root, {recursive: true, force: true}))
let n = 0
const hostIn = (): HaltHost => ({name: 'host', host: new LocalHost(), stateDir: join(root, `s${n++}`)})

describe('the halt record (model/halt.ts)', () => {
  it('keeps who, when and why; a reason on one line, bounded; none given is said', () => {
    const h = newHalt('alice@ops1', AT, 'INC-4411:\nprefill\tOOMs\u0007')
    expect(h).toEqual({by: 'alice@ops1', at: AT, reason: 'INC-4411: prefill OOMs'})
    expect(newHalt('a@b', AT, undefined).reason).toBe('no reason given')
    expect(newHalt('a@b', AT, '   ').reason).toBe('no reason given')
    expect(newHalt('a@b', AT, 'x'.repeat(5000)).reason).toHaveLength(HALT_REASON_MAX)
    expect(haltLine(h)).toBe('halted by alice@ops1 at 2026-12-04T03:12:00.000Z: INC-4411: prefill OOMs')
    expect(haltLine({...h, host: 'gpu-b'})).toBe(
      'halted by alice@ops1 at 2026-12-04T03:12:00.000Z (on gpu-b): INC-4411: prefill OOMs',
    )
  })

  it('reads back what it writes; a file it cannot read still halts, saying so', () => {
    const h = newHalt('alice@ops1', AT, 'why')
    expect(parseHalt(haltText(h), 'gpu-a')).toEqual({...h, host: 'gpu-a'})
    for (const text of ['', '{"by":"x"', '[]', '{"by":1,"at":2,"reason":"r"}', 'null']) {
      const bad = parseHalt(text)
      expect(bad.reason).toMatch(/unreadable halt file/)
      expect(haltLine(bad)).toMatch(/^halted by unknown at an unknown time: /)
    }
  })

  it('a halted run: stopped names the halt, unfinished scenarios are halted, finished ones keep their verdicts', () => {
    const run = syntheticRun({failing: false})
    // Noticed while the second scenario ran: the first had finished, the restart never started (errored: not run).
    const [s1, s2, s3] = run.scenarios
    s3!.error = 'not run: the suite was stopped (a stopped run is never resumed)'
    s3!.verdicts = []
    const halt: HaltRecord = {...newHalt('alice@ops1', AT, 'INC'), host: 'host'}
    markHalted(run, halt, s2!.finishedAt - 1)
    expect(run.scenarios.map(s => s.status)).toEqual([undefined, 'halted', 'halted'])
    expect(s1!.verdicts.length).toBeGreaterThan(0)
    expect(run.stopped).toEqual({reason: haltLine(halt), halt})
    expect(runExitCode(run)).toBe(3)
    // Every report says it: the journal (and reads back), the text, JUnit.
    const checked = checkJournal({pdchaos: 1, ...runJournal(run, 'suite')})
    expect(checked.ok).toBe(true)
    if (checked.ok && !checked.value.failure) {
      expect(checked.value.journal.stopped).toMatchObject({halt: {by: 'alice@ops1', reason: 'INC'}})
      expect(checked.value.journal.scenarios.map(s => s.status)).toEqual([undefined, 'halted', 'halted'])
    }
    const text = renderSuite(run, {wallMs: 16_000})
    expect(text).toMatch(/^ {2}HALT {2}stall-kv gpu2: halted before it finished/m)
    expect(text).toMatch(/^STOPPED: halted by alice@ops1 at 2026-12-04T03:12:00.000Z: INC\./m)
    expect(text).toMatch(/^ {2}PASS {2}drop-dest-info/m)
    const junit = renderJUnit(run)
    expect(junit.match(/<skipped message="halted: halted by alice@ops1/g)).toHaveLength(2)
    const html = renderHtml(run)
    expect(html.match(/<span class="badge halted">HALTED<\/span>/g)).toHaveLength(2)
    expect(html).toContain('Stopped: halted by alice@ops1 at 2026-12-04T03:12:00.000Z: INC')
    expect(haltLines({halt})).toEqual([
      '',
      `HALTED    ${haltLine(halt)}`,
      '          no chaos run acts on it until `pdchaos resume`',
    ])
    expect(haltLines({})).toEqual([])
  })
})

describe('the halt file on a host (halt/host-halt.ts, real sh)', () => {
  it('written privately and atomically; a second halt keeps the first; resume removes it; both are safe twice', async () => {
    const h = hostIn()
    expect(await readHalt(h)).toBeUndefined()
    expect(await haltPresent(h)).toBe(false)
    const first = newHalt('alice@ops1', AT, 'first')
    expect(await writeHalt(h, first)).toEqual({written: true, halt: {...first, host: 'host'}})
    const file = join(h.stateDir, 'halt.json')
    expect(statSync(file).mode & 0o777).toBe(0o600)
    expect(statSync(h.stateDir).mode & 0o777).toBe(0o700)
    expect(JSON.parse(readFileSync(file, 'utf8'))).toMatchObject({by: 'alice@ops1', reason: 'first'})
    const again = await writeHalt(h, newHalt('bob@ops2', AT + 1, 'second'))
    expect(again).toEqual({written: false, halt: {...first, host: 'host'}})
    expect(await haltPresent(h)).toBe(true)
    expect(await readHalt(h)).toEqual({...first, host: 'host'})
    expect(await removeHalt(h)).toEqual({...first, host: 'host'})
    expect(await removeHalt(h)).toBeUndefined()
    expect(await readHalt(h)).toBeUndefined()
  })

  it('a halt file another user could write, or one over the size limit, is refused or unread, never trusted', async () => {
    const h = hostIn()
    mkdirSync(h.stateDir, {mode: 0o700})
    const file = join(h.stateDir, 'halt.json')
    writeFileSync(file, haltText(newHalt('mallory@x', AT, 'planted')))
    chmodSync(file, 0o666)
    const refused = await readHalt(h).catch((error: unknown) => error)
    expect(refused).toBeInstanceOf(PdError)
    expect(refused).toMatchObject({exitCode: 2, code: 'E_UNSAFE_STATE_DIR'})
    expect((refused as Error).message).toMatch(/halt\.json .*can be written by group or others/)
    chmodSync(file, 0o600)
    writeFileSync(file, `{"by":"a@b","at":1,"reason":"${'x'.repeat(5000)}"}`)
    expect((await readHalt(h))?.reason).toMatch(/unreadable halt file/)
  })
})

describe('runs and the halt (halt/watch.ts)', () => {
  it('a halted deployment refuses a run: exit 2, who, when, why, and the command that lifts it', async () => {
    const h = hostIn()
    await writeHalt(h, newHalt('alice@ops1', AT, 'INC-4411'))
    const error = await guardRun([h], {resume: 'pdchaos resume -c /d.yaml'}).catch((e: unknown) => e)
    expect(error).toMatchObject({exitCode: 2, code: 'E_HALTED'})
    expect((error as PdError).message).toBe(
      'the deployment is halted by alice@ops1 at 2026-12-04T03:12:00.000Z: INC-4411; no chaos runs until it is resumed',
    )
    expect((error as PdError).suggestion).toMatch(/^pdchaos resume -c \/d\.yaml /)
  })

  it('a halt while a run goes stops it with the halt line, once, and the run model records it', async () => {
    const a = hostIn()
    const b = {...hostIn(), name: 'gpu-b'}
    const reasons: string[] = []
    const guard = await guardRun([a, b], {resume: 'pdchaos resume', stop: r => reasons.push(r)})
    const untouched = syntheticRun({failing: false})
    expect(guard.record(untouched).stopped).toBeUndefined()
    await writeHalt(b, newHalt('alice@ops1', AT, 'INC'))
    for (let i = 0; i < 200 && reasons.length === 0; i++) await new Promise(r => setTimeout(r, 25))
    await guard.close()
    expect(reasons).toEqual(['halted by alice@ops1 at 2026-12-04T03:12:00.000Z (on gpu-b): INC'])
    const run = guard.record(syntheticRun({failing: false}))
    expect(run.stopped?.halt).toMatchObject({by: 'alice@ops1', host: 'gpu-b'})
    // Not a run model (restart's result): passed through as it is.
    expect(guard.record({verdicts: []})).toEqual({verdicts: []})
  })

  it('a watch closed before any halt never stops the run', async () => {
    const h = hostIn()
    const reasons: string[] = []
    const w = watchHalt([h], r => reasons.push(r), {intervalMs: 20})
    await w.close()
    await writeHalt(h, newHalt('a@b', AT, 'late'))
    await new Promise(r => setTimeout(r, 100))
    expect(reasons).toEqual([])
    expect(w.fired()).toBeUndefined()
  })
})
