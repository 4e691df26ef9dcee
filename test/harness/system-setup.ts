import {existsSync, readdirSync, statSync} from 'node:fs'
import {delimiter, join} from 'node:path'

import {IN_CI, missingRoot} from './level.js'

/**
 * Global setup of the system project (vitest.config.ts): says up front what this machine lacks for the system tests.
 * Under CI=true a lack fails the run before any test starts (nothing may skip or half-run there); locally it is a
 * warning, and the tests that need the missing piece skip (counted) or fail with their own message.
 * scripts/install-test-deps.sh installs all of it.
 */

const TOOLS: Array<[bin: string, pkg: string]> = [
  ['sshd', 'openssh-server'],
  ['ssh', 'openssh-client'],
  ['ssh-keygen', 'openssh-client'],
  ['ip', 'iproute2'],
  ['ss', 'iproute2'],
  ['nft', 'nftables'],
  ['iptables', 'iptables'],
  ['chromium', 'chromium'],
  ['xmllint', 'libxml2-utils'],
  ['prometheus-pushgateway', 'prometheus-pushgateway'],
  ['ps', 'procps'],
]

function onPath(bin: string): boolean {
  const dirs = [...(process.env.PATH ?? '').split(delimiter), '/usr/sbin', '/sbin', '/usr/bin', '/bin']
  return dirs.some(d => d !== '' && existsSync(join(d, bin)))
}

export function systemLacks(): string[] {
  const lacks: string[] = []
  const root = missingRoot()
  if (root) lacks.push(root)
  for (const [bin, pkg] of TOOLS) if (!onPath(bin)) lacks.push(`${bin} (Debian package ${pkg})`)
  return lacks
}

/**
 * src/ files newer than their compiled dist/ files, and a manifest older than a command (system tests run the build).
 */
export function staleBuild(root = process.cwd()): string[] {
  const out: string[] = []
  const walk = (dir: string): void => {
    for (const e of readdirSync(join(root, dir), {withFileTypes: true})) {
      const rel = join(dir, e.name)
      if (e.isDirectory()) walk(rel)
      else if (rel.endsWith('.ts') && !rel.endsWith('.d.ts')) {
        const js = join(root, 'dist', rel.slice('src/'.length, -3) + '.js')
        if (!existsSync(js) || statSync(js).mtimeMs < statSync(join(root, rel)).mtimeMs) out.push(rel)
      }
    }
  }
  walk('src')
  // oclif finds the commands through the manifest only: one older than a command's source hides a new command.
  const manifest = join(root, 'oclif.manifest.json')
  const commands = join(root, 'src', 'commands')
  const newest = (dir: string): number =>
    Math.max(
      0,
      ...readdirSync(dir, {withFileTypes: true}).map(e =>
        e.isDirectory() ? newest(join(dir, e.name)) : statSync(join(dir, e.name)).mtimeMs,
      ),
    )
  if (existsSync(commands) && (!existsSync(manifest) || statSync(manifest).mtimeMs < newest(commands)))
    out.push('oclif.manifest.json')
  return out
}

export default function setup(): void {
  const stale = staleBuild()
  if (stale.length > 0) {
    const text =
      `dist/ is older than ${stale.length} source file(s) ` +
      `(${stale.slice(0, 3).join(', ')}${stale.length > 3 ? ', …' : ''}): run npm run build (the system tests run ` +
      `the built CLI and twin)`
    if (IN_CI) throw new Error(text)
    process.stderr.write(`WARNING: ${text}.\n`)
  }
  const lacks = systemLacks()
  if (lacks.length === 0) return
  const text = `the system tests need ${lacks.join(', ')}; scripts/install-test-deps.sh installs the packages (as root)`
  if (IN_CI) throw new Error(`CI=true, and nothing may skip under CI: ${text}`)
  process.stderr.write(`WARNING: ${text}. Tests that need them will skip or fail.\n`)
}
