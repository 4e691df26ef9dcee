#!/usr/bin/env bash
# Install everything the tests need (Debian packages, npm packages), build, run every test, and end with
# the line "N passed, N failed". Safe to run again; cleans up namespaces and processes on every exit path.
set -uo pipefail
cd "$(dirname "$0")/.."
export OCLIF_SKIP_NEW_VERSION_CHECK=1

cleanup() { bash scripts/cleanup-test-hosts.sh >/dev/null 2>&1 || true; }
trap cleanup EXIT
trap 'cleanup; exit 130' INT TERM

bash scripts/install-test-deps.sh || { echo "install of test dependencies failed"; echo "0 passed, 1 failed"; exit 1; }
npm run --silent build || { echo "build failed"; echo "0 passed, 1 failed"; exit 1; }
cleanup
mkdir -p test-results
npx vitest run --reporter=default --reporter=json --outputFile.json=test-results/vitest.json
rc=$?
node scripts/test-summary.mjs test-results/vitest.json || rc=1
exit $rc
