import {existsSync, mkdtempSync, readFileSync, rmSync, writeFileSync} from 'node:fs'
import {createServer} from 'node:net'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import type {Config} from '@oclif/core'
import {afterAll, describe, expect, it} from 'vitest'

import {TargetCommand} from '../../src/cli/target-command.js'
import type {SuiteRun} from '../../src/model/run.js'
import {syntheticRun} from '../report/synthetic-run.js'

const dir = mkdtempSync(join(tmpdir(), 'pdchaos-run-outputs-'))
afterAll(() => rmSync(dir, {recursive: true, force: true}))

/** The outputs and the exit-code policy of TargetCommand, without a target: just the two methods a run ends with. */
class Probe extends TargetCommand<typeof Probe> {
  async run(): Promise<void> {}
  decide(run: SuiteRun): void {
    this.setRunExitCode(run)
  }
  write(run: SuiteRun, files: Record<string, string>): ReturnType<TargetCommand<typeof Probe>['writeRunOutputs']> {
    return this.writeRunOutputs(run, 'suite', files)
  }
}

async function deadPort(): Promise<number> {
  const s = createServer()
  await new Promise<void>(resolve => s.listen(0, '127.0.0.1', resolve))
  const port = (s.address() as {port: number}).port
  await new Promise<void>(resolve => s.close(() => resolve()))
  return port
}

describe('a run ends: verdict first, outputs after (issue 12)', () => {
  it(
    'a gate that passed keeps exit 0 when the Pushgateway is dead and a file cannot be written; each failure is ' +
      'reported, the rest written',
    async () => {
      const probe = new Probe([], {scopedEnvVar: () => undefined} as unknown as Config)
      const run: SuiteRun = {
        ...syntheticRun({failing: false}),
        gate: {passed: true, reasons: []} as unknown as SuiteRun['gate'],
      }
      const before = process.exitCode
      const stderr: string[] = []
      const write = process.stderr.write.bind(process.stderr)
      process.stderr.write = ((chunk: string) => {
        stderr.push(String(chunk))
        return true
      }) as typeof process.stderr.write
      try {
        probe.decide(run)
        expect(process.exitCode ?? 0).toBe(0)
        writeFileSync(join(dir, 'a-file'), 'x')
        const out = await probe.write(run, {
          push: `http://127.0.0.1:${await deadPort()}`,
          junit: join(dir, 'junit.xml'),
          journal: join(dir, 'a-file', 'run.json'),
        })
        expect(process.exitCode ?? 0).toBe(0)
        expect(out.outputErrors).toHaveLength(2)
        expect(out.outputErrors!.join('\n')).toMatch(/could not write the journal to .*a-file\/run\.json/)
        expect(out.outputErrors!.join('\n')).toMatch(
          /could not write metrics to the Pushgateway at http:\/\/127\.0\.0\.1:\d+/,
        )
        expect(existsSync(join(dir, 'junit.xml'))).toBe(true)
        expect(readFileSync(join(dir, 'junit.xml'), 'utf8')).toContain('<testsuites')
        expect(stderr.filter(l => l.startsWith('Error: could not write'))).toHaveLength(2)
      } finally {
        process.stderr.write = write
        process.exitCode = before
      }
    },
  )
})
