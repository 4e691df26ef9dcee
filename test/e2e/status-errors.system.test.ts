import {readFileSync, writeFileSync} from 'node:fs'
import {createServer, type Server} from 'node:http'
import {join} from 'node:path'

import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {parse as parseYaml, stringify} from 'yaml'

import {createTestHost, type TestHost} from '../harness/test-host.js'
import {runCli} from './cli.js'

// What a user sees when the deployment cannot be reached or answers nonsense: one line naming what failed, a
// suggestion, the README's exit code, no stack trace, and never a hang.
let host: TestHost
let garbage: Server
let garbagePort = 0

beforeAll(async () => {
  host = await createTestHost({sshd: true})
  // A "service" on the root side's loopback that answers garbage everywhere.
  garbage = createServer((_req, res) => {
    res.writeHead(200, {'content-type': 'text/plain'})
    res.end('{{{ not json or metrics')
  })
  await new Promise<void>(r => garbage.listen(0, '127.0.0.1', r))
  garbagePort = (garbage.address() as {port: number}).port
}, 60_000)

afterAll(async () => {
  garbage?.close()
  await host?.destroy()
}, 60_000)

function variant(name: string, edit: (d: Record<string, any>) => void): string {
  const d = parseYaml(readFileSync(host.deploymentFile, 'utf8')) as Record<string, any>
  edit(d)
  const file = join(host.dir, `${name}.yaml`)
  writeFileSync(file, stringify(d))
  return file
}

const noStack = (s: string) => expect(s).not.toMatch(/\n\s+at [\w.<]+ \(/)

describe('status: bad input and unreachable targets', () => {
  it('a malformed deployment file: exit 2 naming the file and the path inside it', async () => {
    const file = join(host.dir, 'bad.yaml')
    writeFileSync(file, 'host: {kind: ssh}\nservices: {}\nwatchdog: {deadlineSeconds: -1, pollSeconds: 1}\n')
    const r = await runCli(['status', '-c', file])
    expect(r.code).toBe(2)
    expect(r.stderr).toMatch(/bad\.yaml/)
    expect(r.stderr).toMatch(/watchdog\.deadlineSeconds|services\.prefill/)
    noStack(r.stderr)
  })

  it('an unreachable ssh port: exit 5 naming the host, quickly', async () => {
    const file = variant('closed', d => {
      d.host.port = 2
    })
    const r = await runCli(['status', '-c', file, '--json'], {timeoutMs: 60_000})
    expect(r.code).toBe(5)
    const e = JSON.parse(r.stdout).error
    expect(e.message).toMatch(new RegExp(`cannot reach ssh root@${host.netns.address.replace(/\./g, '\\.')}:2`))
    expect(r.ms).toBeLessThan(30_000)
  })

  it('a wrong host key: exit 5, refused, with the fingerprint shown', async () => {
    const wrong = join(host.dir, 'wrong_known_hosts')
    // Another host's key under this host's name.
    const other = await createTestHost({sshd: true})
    try {
      writeFileSync(wrong, readFileSync(other.ssh.knownHosts, 'utf8').replace(other.netns.address, host.netns.address))
    } finally {
      await other.destroy()
    }
    const file = variant('wrongkey', d => {
      d.host.knownHosts = wrong
      delete d.host.fingerprint
    })
    const r = await runCli(['status', '-c', file])
    expect(r.code).toBe(5)
    expect(r.stderr).toMatch(/SHA256:/)
    expect(r.stderr).toMatch(/changed|does not match|refus/i)
    noStack(r.stderr)
  })

  it('services that refuse, and one that answers garbage: exit 5, each named, within the probe timeout', async () => {
    const file = variant('garbage', d => {
      d.services.prefill.url = `http://127.0.0.1:${garbagePort}`
    })
    const r = await runCli(['status', '-c', file, '--json', '--timeout', '2'], {timeoutMs: 60_000})
    expect(r.code).toBe(5)
    const s = JSON.parse(r.stdout)
    expect(s.services.decode.health.ok).toBe(false)
    expect(s.services.decode.health.error).toMatch(
      /decode at http:\/\/10\.231\.\d+\.2:\d+\/health refused the connection|decode .* (refused|did not answer)/,
    )
    expect(s.warnings.join('\n')).toMatch(/prefill (server_info|metrics): .*answered garbage|prefill metrics: .*line 1/)
  })
})
