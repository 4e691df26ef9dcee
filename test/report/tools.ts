import {execFileSync, spawnSync} from 'node:child_process'
import {existsSync} from 'node:fs'

/** A Debian tool the test needs: installed with apt-get when missing (as root), else a clear failure. */
export function ensureTool(bin: string, pkg: string): string {
  const path = `/usr/bin/${bin}`
  if (existsSync(path)) return path
  if (process.getuid?.() !== 0)
    throw new Error(`${bin} is missing: install the Debian package ${pkg} (scripts/install-test-deps.sh)`)
  const env = {...process.env, DEBIAN_FRONTEND: 'noninteractive'}
  let r = spawnSync('apt-get', ['install', '-y', '-q', '--no-install-recommends', pkg], {
    env,
    timeout: 180_000,
    encoding: 'utf8',
  })
  if (r.status !== 0) {
    execFileSync('apt-get', ['update', '-q'], {env, timeout: 180_000, stdio: 'ignore'})
    r = spawnSync('apt-get', ['install', '-y', '-q', '--no-install-recommends', pkg], {
      env,
      timeout: 180_000,
      encoding: 'utf8',
    })
  }
  if (!existsSync(path)) throw new Error(`apt-get install ${pkg} did not give ${path}: ${r.stderr}`)
  return path
}
