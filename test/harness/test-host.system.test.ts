import {execFileSync, spawnSync} from 'node:child_process'
import {existsSync, mkdirSync, readFileSync, writeFileSync} from 'node:fs'
import {join} from 'node:path'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {parse as parseYaml} from 'yaml'

import {DeploymentSchema} from '../../src/deployment/config.js'
import {runCommand} from './netns.js'
import {createTestHost, type TestHost} from './test-host.js'

const netnsList = (): string => execFileSync('ip', ['netns', 'list'], {encoding: 'utf8'})

describe('createTestHost (sshd in a namespace, no twin)', () => {
  let host: TestHost

  beforeAll(async () => {
    host = await createTestHost({sshd: true})
  })
  afterAll(async () => {
    await host?.destroy()
  })

  it('answers an SSH exec with the right exit code, stdout and stderr, inside the namespace', async () => {
    const r = await host.sshRun(['sh', '-c', 'echo out; echo err >&2; exit 7'])
    expect(r).toMatchObject({code: 7, stdout: 'out\n', stderr: 'err\n'})
    // The login runs in the namespace: its interfaces are the namespace's.
    const addr = await host.sshRun(['ip', '-o', '-4', 'addr', 'show'])
    expect(addr.code).toBe(0)
    expect(addr.stdout).toContain(`${host.ssh.host}/24`)
    expect(addr.stdout).not.toContain(`${host.netns.hostAddress}/24`)
    // The login PATH has the twin's bin/ ahead of the system dirs, so its nvidia-smi resolves over SSH.
    mkdirSync(join(host.stateDir, 'bin'), {recursive: true})
    writeFileSync(join(host.stateDir, 'bin', 'nvidia-smi'), '#!/bin/sh\necho stand-in\n', {mode: 0o755})
    const which = await host.sshRun(['sh', '-c', 'command -v nvidia-smi && nvidia-smi'])
    expect(which.stdout.trim().split('\n')).toEqual([join(host.stateDir, 'bin', 'nvidia-smi'), 'stand-in'])
    const path = (await host.sshRun(['sh', '-c', 'echo "$PATH"'])).stdout.trim().split(':')
    expect(path.indexOf(join(host.stateDir, 'bin'))).toBeGreaterThanOrEqual(0)
    expect(path.indexOf(join(host.stateDir, 'bin'))).toBeLessThan(path.indexOf('/usr/bin'))
  })

  it('arguments arrive verbatim through the quoting function', async () => {
    const args = ["it's", 'a b', '$HOME', '`id`', 'new\nline', '', '--dash', '"q"\\']
    const r = await host.sshRun(['printf', '%s\\0', ...args])
    expect(r.code).toBe(0)
    expect(r.stdout.split('\0').slice(0, -1)).toEqual(args)
  })

  it('the host key is pinned: a known_hosts with another key is refused', async () => {
    expect(host.ssh.fingerprint).toMatch(/^SHA256:[A-Za-z0-9+/]{43}$/)
    const keygen = spawnSync('ssh-keygen', ['-l', '-E', 'sha256', '-f', host.ssh.knownHosts], {encoding: 'utf8'})
    expect(keygen.stdout).toContain(host.ssh.fingerprint)
    const wrong = join(host.dir, 'wrong_known_hosts')
    // Any other ed25519 key under the same host name.
    execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', join(host.dir, 'other')])
    const otherPub = readFileSync(join(host.dir, 'other.pub'), 'utf8').split(' ')
    writeFileSync(wrong, `${host.ssh.host} ${otherPub[0]} ${otherPub[1]}\n`)
    const r = await runCommand(
      [
        'ssh',
        '-F',
        '/dev/null',
        '-i',
        host.ssh.identityFile,
        '-o',
        'BatchMode=yes',
        '-o',
        'StrictHostKeyChecking=yes',
        '-o',
        `UserKnownHostsFile=${wrong}`,
        '-o',
        'ConnectTimeout=5',
        `root@${host.ssh.host}`,
        'true',
      ],
      {reject: false},
    )
    expect(r.code).toBe(255)
    expect(r.stderr).toMatch(/HOST IDENTIFICATION HAS CHANGED|Host key verification failed/)
  })

  it('writes a valid deployment file pointing at the namespace over ssh', () => {
    const doc = DeploymentSchema.parse(parseYaml(readFileSync(host.deploymentFile, 'utf8')))
    expect(doc.host).toMatchObject({
      kind: 'ssh',
      hostname: host.ssh.host,
      port: 22,
      user: 'root',
      identityFile: host.ssh.identityFile,
      knownHosts: host.ssh.knownHosts,
      fingerprint: host.ssh.fingerprint,
    })
    expect(doc.services.router.url).toContain(host.ssh.host)
    expect(doc.stateDir.startsWith(host.dir)).toBe(true)
  })

  it('destroy() leaves no namespace, sshd or temp dir behind, and may be called twice', async () => {
    const other = await createTestHost({sshd: true})
    const sshdPids = await other.netns.pids()
    expect(sshdPids.length).toBeGreaterThan(0)
    // A login session still open when destroy runs.
    const held = other.sshRun(['sleep', '1000'], {timeoutMs: 30_000})
    await new Promise(r => setTimeout(r, 300))
    await other.destroy()
    await other.destroy()
    const r = await held
    expect(r.code).not.toBe(0)
    expect(netnsList()).not.toContain(other.netns.name)
    expect(existsSync(other.dir)).toBe(false)
    for (const pid of sshdPids) expect(existsSync(`/proc/${pid}`)).toBe(false)
  })
})
