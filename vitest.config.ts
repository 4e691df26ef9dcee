import {configDefaults, defineConfig} from 'vitest/config'

import LongestFirst from './test/harness/longest-first.js'

/**
 * Two levels of tests, told apart by the file's name.
 *
 * - unit (`npm test`), `*.test.ts`: pure code, fake servers on loopback inside the test process, short helper
 *   processes (sh, sleep). No root, no network namespace, no sshd, no twin, no pdchaos subprocess, no Debian tool.
 *   Under 60 s.
 * - system (`npm run test:all`, which runs both levels, and .ci/run), `*.system.test.ts`: everything that needs root,
 *   a network namespace, a real sshd, the twin's processes, the built CLI as a subprocess, a Debian tool (chromium,
 *   xmllint, Pushgateway, prometheus, systemd-analyze), or real processes killed and waited for (leases).
 *
 * The test harness refuses, in a unit run, to create a namespace, start sshd, start a test host or run the CLI
 * (test/harness/level.ts), so a file that needs the system level and is not named so fails at once with a message
 * that says so.
 */
export const SYSTEM_TESTS = ['test/**/*.system.test.ts']

export default defineConfig({
  test: {
    disableConsoleIntercept: true,
    // The system level's longest files first (test/harness/longest-first.ts).
    sequence: {sequencer: LongestFirst},
    pool: 'forks',
    projects: [
      {
        extends: true,
        test: {
          name: 'unit',
          include: ['test/**/*.test.ts'],
          exclude: [...configDefaults.exclude, ...SYSTEM_TESTS],
          env: {PDCHAOS_TEST_LEVEL: 'unit'},
          // Generous for a loaded 2-core machine; a unit test near this is a system test in disguise.
          testTimeout: 30_000,
          hookTimeout: 30_000,
          // Pure code: files may run side by side. Runs first, so a broken unit fails fast.
          maxWorkers: 2,
          // One module graph per worker, not per file: the files share nothing but modules without state between
          // tests (no mocks, no module state a file leaves behind). The level: 53 s -> 34 s, mostly imports.
          isolate: false,
          sequence: {groupOrder: 0},
        },
      },
      {
        extends: true,
        test: {
          name: 'system',
          include: SYSTEM_TESTS,
          // The twin's processes run from dist/ (test-all builds first; system-setup warns when dist/ is older than src/).
          env: {PDCHAOS_TEST_LEVEL: 'system', PDCHAOS_TWIN_FROM_DIST: '1'},
          globalSetup: ['test/harness/system-setup.ts'],
          testTimeout: 60_000,
          hookTimeout: 120_000,
          // Two files at a time: 785 s against about 1,250 one at a time (the 2 cores 82 % busy); three saturated them
          // (817 s, 99 % busy) and slowed every file. Files keep to their own namespaces, state dirs and ports and kill
          // only what they started.
          maxWorkers: 2,
          // As the unit level: the harness and src modules load once per worker (every file restores what it changes
          // of the process: env, exit code, listeners).
          isolate: false,
          sequence: {groupOrder: 1},
        },
      },
    ],
  },
})
