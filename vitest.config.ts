import {defineConfig} from 'vitest/config'

export default defineConfig({
  test: {
    disableConsoleIntercept: true,
    include: ['test/**/*.test.ts'],
    testTimeout: 60_000,
    hookTimeout: 120_000,
    // Real processes, sockets and namespaces: files run one at a time so they never fight over ports or CPU.
    fileParallelism: false,
    pool: 'forks',
  },
})
