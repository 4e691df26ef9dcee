#!/usr/bin/env bash
# Install everything the tests need (Debian packages, npm packages), build, run every test (both levels: unit,
# then system; see vitest.config.ts), and end with the line "N passed, N failed, N skipped" (under CI=true nothing
# may skip: a skip counts as a failure). Safe to run again; cleans up namespaces and processes on every exit path.
set -uo pipefail
cd "$(dirname "$0")/.."
export OCLIF_SKIP_NEW_VERSION_CHECK=1

cleanup() { bash scripts/cleanup-test-hosts.sh >/dev/null 2>&1 || true; }
trap cleanup EXIT
trap 'cleanup; exit 130' INT TERM

bash scripts/install-test-deps.sh || { echo "install of test dependencies failed"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
npm run --silent lint || { echo "lint failed (npm run lint)"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
npm run --silent build || { echo "build failed"; echo "0 passed, 1 failed, 0 skipped"; exit 1; }
cleanup
mkdir -p test-results
rm -f test-results/vitest.json test-results/durations.json
PDCHAOS_DURATIONS_FILE=test-results/durations.json npx vitest run --reporter=default --reporter=json \
  --reporter=./test/harness/durations-reporter.ts --outputFile.json=test-results/vitest.json
rc=$?
node scripts/test-summary.mjs test-results/vitest.json test-results/durations.json || rc=1
exit $rc
