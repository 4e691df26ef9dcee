import {mkdirSync, writeFileSync} from 'node:fs'
import {dirname} from 'node:path'

import type {Reporter, TestModule} from 'vitest/node'

/**
 * Writes how long each test file took, hooks included (vitest's JSON report starts a file's clock at its first test,
 * after beforeAll), to PDCHAOS_DURATIONS_FILE (default test-results/durations.json). scripts/test-summary.mjs prints
 * the slowest files from it. Used by scripts/test-all.sh: `--reporter=./test/harness/durations-reporter.ts`.
 */
export default class DurationsReporter implements Reporter {
  onTestRunEnd(modules: ReadonlyArray<TestModule>): void {
    const file = process.env.PDCHAOS_DURATIONS_FILE ?? 'test-results/durations.json'
    const rows = modules
      .map(m => {
        const d = m.diagnostic()
        return {
          file: m.relativeModuleId,
          project: m.project.name,
          state: m.state(),
          // import + collection + every test and hook: the file's share of the run's wall time.
          ms: Math.round(d.collectDuration + d.setupDuration + d.prepareDuration + d.duration),
        }
      })
      .sort((a, b) => b.ms - a.ms)
    mkdirSync(dirname(file), {recursive: true})
    writeFileSync(file, JSON.stringify(rows, null, 1) + '\n')
  }
}
