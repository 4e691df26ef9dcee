// Prints the closing line CI reads ("N passed, N failed, N skipped") from vitest's JSON report, after the list of
// skipped tests and the slowest test files (from test/harness/durations-reporter.ts, when its file exists).
// Under CI (CI=true) nothing may skip: a skipped test is counted as failed, and named.
//   usage: node scripts/test-summary.mjs [REPORT.json] [DURATIONS.json]
import {existsSync, readFileSync} from 'node:fs'
import {relative} from 'node:path'

const file = process.argv[2] ?? 'test-results/vitest.json'
const durationsFile = process.argv[3] ?? 'test-results/durations.json'
const inCi = process.env.CI === 'true' || process.env.CI === '1'

let report
try {
  report = JSON.parse(readFileSync(file, 'utf8'))
} catch (error) {
  console.log(`no test report at ${file}: ${error.message}`)
  console.log('0 passed, 1 failed, 0 skipped')
  process.exit(1)
}

const results = report.testResults ?? []
// A file that failed before any test ran (an import error, a throw while collecting) has no test results.
const failedFiles = results.filter(r => r.status === 'failed' && (r.assertionResults ?? []).length === 0)
for (const r of failedFiles)
  console.log(`FAILED FILE ${relative(process.cwd(), r.name)}: ${(r.message ?? '').split('\n')[0]}`)

const skippedTests = results.flatMap(r =>
  (r.assertionResults ?? [])
    .filter(a => a.status === 'pending' || a.status === 'skipped' || a.status === 'todo')
    .map(a => `${relative(process.cwd(), r.name)} > ${a.fullName}`),
)
if (skippedTests.length > 0) {
  console.log(
    inCi
      ? `CI=true, and nothing may skip under CI: ${skippedTests.length} skipped test(s) counted as failed:`
      : `${skippedTests.length} skipped test(s):`,
  )
  for (const t of skippedTests) console.log(`  ${t}`)
}

if (existsSync(durationsFile)) {
  try {
    const rows = JSON.parse(readFileSync(durationsFile, 'utf8'))
    const total = rows.reduce((s, r) => s + r.ms, 0)
    console.log(`slowest test files (of ${rows.length}, ${(total / 1000).toFixed(0)} s in all):`)
    for (const r of rows.slice(0, 10))
      console.log(`  ${(r.ms / 1000).toFixed(1).padStart(6)} s  ${r.project.padEnd(6)} ${r.file}`)
  } catch (error) {
    console.log(`cannot read ${durationsFile}: ${error.message}`)
  }
}

const passed = report.numPassedTests ?? 0
const skipped = skippedTests.length
const failed = (report.numFailedTests ?? 0) + failedFiles.length + (inCi ? skipped : 0)
console.log(`${passed} passed, ${failed} failed, ${inCi ? 0 : skipped} skipped`)
process.exit(failed > 0 || (report.numTotalTests ?? 0) === 0 ? 1 : 0)
