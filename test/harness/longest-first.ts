import {relative} from 'node:path'

import {BaseSequencer, type TestSpecification} from 'vitest/node'

/**
 * When the system level runs files side by side (vitest.config.ts: two at a time), the longest must start
 * first: on a fresh clone vitest knows no durations and starts the largest files, which put the longest runs (small
 * files that run for minutes) at the end, one lane working alone. Seconds per file at 2 workers: BENCHMARKS.md.
 */
export const LONGEST_FIRST = [
  'test/e2e/mutation-matrix.system.test.ts', // ~160 s (ci33)
  'test/e2e/mutation-defects.system.test.ts', // ~140 s
  'test/e2e/mutation-defects-recovery.system.test.ts', // ~130 s
  'test/e2e/lease-survival.system.test.ts', // ~90 s
  'test/e2e/two-nodes.system.test.ts', // ~90 s
  'test/suite/suite-over-ssh.system.test.ts', // ~75 s
  'test/cli/bad-input.system.test.ts', // ~48 s
  'test/e2e/over-ssh.system.test.ts',
  'test/sim/server-faults.system.test.ts',
  'test/sim/server-watchdog.system.test.ts',
  'test/sim/lifecycle-twin.system.test.ts',
  'test/faults/lease-local.system.test.ts',
  'test/e2e/rail-path.system.test.ts',
  'test/faults/lease-kill.system.test.ts',
  'test/e2e/discovery-layouts.system.test.ts',
  'test/e2e/twin-failpoint.system.test.ts',
  'test/e2e/pin-path.system.test.ts',
  'test/sim/server-basic.system.test.ts',
  'test/faults/lease-ssh.system.test.ts',
  'test/faults/mechanism-packet-filter.system.test.ts',
  'test/e2e/fleet.system.test.ts',
]

export default class LongestFirst extends BaseSequencer {
  override async sort(files: TestSpecification[]): Promise<TestSpecification[]> {
    const sorted = await super.sort(files)
    // Projects keep vitest's order (group order, then name); within one, the known-long files lead.
    const projectAt = new Map<string, number>()
    sorted.forEach((f, i) => {
      if (!projectAt.has(f.project.name)) projectAt.set(f.project.name, i)
    })
    const rank = (f: TestSpecification): number => {
      const i = LONGEST_FIRST.indexOf(relative(f.project.config.root, f.moduleId))
      return i < 0 ? LONGEST_FIRST.length : i
    }
    return sorted
      .map((f, i) => ({f, i}))
      .sort(
        (a, b) =>
          projectAt.get(a.f.project.name)! - projectAt.get(b.f.project.name)! || rank(a.f) - rank(b.f) || a.i - b.i,
      )
      .map(({f}) => f)
  }
}
