import {mkdtempSync, rmSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {afterAll, describe, expect, it} from 'vitest'

import {runCli} from '../e2e/cli.js'

const dir = mkdtempSync(join(tmpdir(), 'pdchaos-suite-cli-'))
afterAll(() => rmSync(dir, {recursive: true, force: true}))

describe('pdchaos suite: input errors and the schema, from the CLI', () => {
  it('a bad suite file is exit 2 naming the file and the path, before any target is reached', async () => {
    const file = join(dir, 'bad.yaml')
    writeFileSync(file, 'scenarios:\n  - {name: a, fault: stall-kv, pins: 0}\n')
    // -c points nowhere: the suite file is validated first, so the error is about it.
    const r = await runCli(['suite', file, '-c', join(dir, 'none.yaml'), '--json'])
    expect(r.code).toBe(2)
    const e = JSON.parse(r.stdout) as {error: {message: string}}
    expect(e.error.message).toContain(`${file}: scenarios[0].pins`)
    expect(e.error.message).toContain('scenarios[0].params.gpu: stall-kv needs params.gpu')
  })

  it('`pdchaos schema suite` prints the suite file JSON Schema', async () => {
    const r = await runCli(['schema', 'suite', '--json'])
    expect(r.code).toBe(0)
    const j = JSON.parse(r.stdout) as {title: string; properties: Record<string, unknown>}
    expect(j.title).toBe('pdchaos suite file')
    expect(Object.keys(j.properties)).toEqual(expect.arrayContaining(['scenarios', 'stop', 'gate', 'load']))
  })
})
