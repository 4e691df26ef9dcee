import {mkdirSync, writeFileSync} from 'node:fs'
import {dirname, join} from 'node:path'

/** Deployment, suite and fleet files for the fleet tests: a deployment file as a user writes one, on its own host. */

export function deploymentYaml(
  name: string,
  o: {port?: number; stateDir?: string; labels?: Record<string, string>} = {},
): string {
  const port = o.port ?? 30_000
  return [
    `name: ${name}`,
    ...(o.labels ? [`labels: ${JSON.stringify(o.labels)}`] : []),
    'host: {kind: local}',
    `stateDir: ${o.stateDir ?? `/tmp/pdchaos-fleet-test/${name}`}`,
    'backend: nixl',
    'services:',
    `  prefill: {url: "http://127.0.0.1:${port}", bootstrapPort: 8998}`,
    `  decode: {url: "http://127.0.0.1:${port + 1}"}`,
    `  router: {url: "http://127.0.0.1:${port + 2}"}`,
    'watchdog: {scope: all, deadlineSeconds: 2, pollSeconds: 0.5}',
    '',
  ].join('\n')
}

export const SUITE_YAML =
  'name: nightly\nscenarios:\n  - {name: dd, fault: drop-dest-info, pins: 2, repetitions: 2}\n  - {name: ' +
  'co-restart, restart: {services: [router]}}\n'

/** Write files under dir (parents created); returns dir. */
export function writeTree(dir: string, files: Record<string, string>): string {
  for (const [path, text] of Object.entries(files)) {
    mkdirSync(dirname(join(dir, path)), {recursive: true})
    writeFileSync(join(dir, path), text)
  }
  return dir
}
