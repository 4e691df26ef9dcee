import {existsSync} from 'node:fs'

/**
 * Test levels and skips (see vitest.config.ts).
 *
 * - `npm test` runs the unit project with PDCHAOS_TEST_LEVEL=unit: the harness then refuses to create a namespace,
 *   start sshd, start a test host or run the CLI, so a file that needs the system level fails at once and says where
 *   to list it, instead of quietly slowing the unit run down or failing for want of root.
 * - A test that cannot run on this machine (not root, a tool missing) may skip locally, and is counted as skipped in
 *   the closing line; under CI (CI=true) nothing may skip: it fails instead, naming what is missing.
 */

export const IN_CI = process.env.CI === 'true' || process.env.CI === '1'

/** Throw when running at the unit level: `what` needs the system level. */
export function requireSystemLevel(what: string): void {
  if (process.env.PDCHAOS_TEST_LEVEL === 'unit') {
    throw new Error(
      `${what}: this test needs the system level (root, namespaces, sshd, the twin or the CLI as a subprocess), ` +
        'but this is a unit run (npm test); name its file *.system.test.ts (vitest.config.ts)',
    )
  }
}

/** Why this process cannot do what needs root, or undefined when it is root. */
export function missingRoot(): string | undefined {
  const uid = process.getuid?.()
  return uid === 0 ? undefined : `root (running as uid ${uid ?? 'unknown'})`
}

/** Why a tool is unavailable (its path and the Debian package that has it), or undefined when it is there. */
export function missingTool(path: string, debianPackage: string): string | undefined {
  return existsSync(path)
    ? undefined
    : `${path} (Debian package ${debianPackage}; scripts/install-test-deps.sh installs it)`
}

/**
 * For `describe.skipIf(...)` / `it.skipIf(...)`: given what is missing (undefined entries are met), true to skip.
 * Locally the skip is reported on stderr and counted by scripts/test-summary.mjs; under CI=true it throws instead,
 * which fails the file with the list of what is missing.
 */
export function skipWithout(what: string, ...missing: Array<string | undefined>): boolean {
  const unmet = missing.filter((m): m is string => m !== undefined)
  if (unmet.length === 0) return false
  const text = `${what} needs ${unmet.join(', ')}`
  if (IN_CI) throw new Error(`CI=true, and nothing may skip under CI: ${text}`)
  process.stderr.write(`SKIPPED: ${text}\n`)
  return true
}
