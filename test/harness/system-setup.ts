import {existsSync} from 'node:fs'
import {delimiter, join} from 'node:path'

import {IN_CI, missingRoot} from './level.js'

/**
 * Global setup of the system project (vitest.config.ts): says up front what this machine lacks for the system tests.
 * Under CI=true a lack fails the run before any test starts (nothing may skip or half-run there); locally it is a
 * warning, and the tests that need the missing piece skip (counted) or fail with their own message.
 * scripts/install-test-deps.sh installs all of it.
 */

const TOOLS: Array<[bin: string, pkg: string]> = [
  ['sshd', 'openssh-server'], ['ssh', 'openssh-client'], ['ssh-keygen', 'openssh-client'],
  ['ip', 'iproute2'], ['ss', 'iproute2'], ['nft', 'nftables'], ['iptables', 'iptables'],
  ['chromium', 'chromium'], ['xmllint', 'libxml2-utils'], ['prometheus-pushgateway', 'prometheus-pushgateway'], ['ps', 'procps'],
]

function onPath(bin: string): boolean {
  const dirs = [...(process.env.PATH ?? '').split(delimiter), '/usr/sbin', '/sbin', '/usr/bin', '/bin']
  return dirs.some((d) => d !== '' && existsSync(join(d, bin)))
}

export function systemLacks(): string[] {
  const lacks: string[] = []
  const root = missingRoot()
  if (root) lacks.push(root)
  for (const [bin, pkg] of TOOLS) if (!onPath(bin)) lacks.push(`${bin} (Debian package ${pkg})`)
  return lacks
}

export default function setup(): void {
  const lacks = systemLacks()
  if (lacks.length === 0) return
  const text = `the system tests need ${lacks.join(', ')}; scripts/install-test-deps.sh installs the packages (as root)`
  if (IN_CI) throw new Error(`CI=true, and nothing may skip under CI: ${text}`)
  process.stderr.write(`WARNING: ${text}. Tests that need them will skip or fail.\n`)
}
