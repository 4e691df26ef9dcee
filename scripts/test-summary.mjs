// Prints the closing line CI reads ("N passed, N failed") from vitest's JSON report.
import {readFileSync} from 'node:fs'

const file = process.argv[2] ?? 'test-results/vitest.json'
let report
try {
  report = JSON.parse(readFileSync(file, 'utf8'))
} catch (error) {
  console.log(`no test report at ${file}: ${error.message}`)
  console.log('0 passed, 1 failed')
  process.exit(1)
}
const failedSuites = (report.testResults ?? []).filter((r) => r.status === 'failed' && (r.assertionResults ?? []).length === 0).length
const failed = report.numFailedTests + failedSuites
const skipped = (report.numPendingTests ?? 0) + (report.numTodoTests ?? 0)
console.log(`${report.numPassedTests} passed, ${failed} failed` + (skipped ? `, ${skipped} skipped` : ''))
process.exit(failed > 0 || report.numTotalTests === 0 ? 1 : 0)
