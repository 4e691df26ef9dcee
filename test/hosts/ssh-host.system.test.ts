import {execFileSync, spawn} from 'node:child_process'
import {existsSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {afterAll, afterEach, beforeAll, describe, expect, it} from 'vitest'

import type {SshHostConfig} from '../../src/deployment/config.js'
import {PdError} from '../../src/errors.js'
import {hashedToken} from '../../src/hosts/known-hosts.js'
import {openHost} from '../../src/hosts/open-host.js'
import {type SshHost, openSshHost, type SshHostOptions} from '../../src/hosts/ssh-host.js'
import {descendants, freePort, startSshd, type Sshd} from '../harness/sshd.js'
import {alive, eventually, killAll, marker, pidsMatching} from './proc.js'

const dir = mkdtempSync(join(tmpdir(), 'pdchaos-ssh-'))
let sshd: Sshd
let knownHosts: string
const hosts: SshHost[] = []
const extraSshds: Sshd[] = []
const strays: string[] = []

function cfg(over: Partial<SshHostConfig> = {}): SshHostConfig {
  return {
    kind: 'ssh',
    hostname: sshd.host,
    port: sshd.port,
    user: 'root',
    identityFile: sshd.clientKeyPath,
    knownHosts,
    connectTimeoutSeconds: 5,
    ...over,
  } as SshHostConfig
}
async function open(over: Partial<SshHostConfig> = {}, opts: SshHostOptions = {}): Promise<SshHost> {
  const h = await openSshHost(cfg(over), {sshConfigPath: join(dir, 'no-config'), ...opts})
  hosts.push(h)
  return h
}
async function failure(p: Promise<unknown>): Promise<PdError> {
  const err = await p.then(
    () => undefined,
    (e: unknown) => e,
  )
  expect(err, 'expected a PdError').toBeInstanceOf(PdError)
  return err as PdError
}
const logins = (s: Sshd): number => (readFileSync(s.logPath, 'utf8').match(/Accepted publickey/g) ?? []).length

beforeAll(async () => {
  sshd = await startSshd()
  knownHosts = join(dir, 'known_hosts')
  writeFileSync(knownHosts, sshd.knownHostsLine)
})
afterEach(async () => {
  await Promise.all(hosts.splice(0).map(h => h.close()))
  for (const m of strays.splice(0)) killAll(pidsMatching(m))
})
afterAll(async () => {
  await Promise.all(extraSshds.map(s => s.stop()))
  await sshd?.stop()
  rmSync(dir, {recursive: true, force: true})
})

describe('SshHost against a real sshd', () => {
  it('runs argv: exit code, stdout, stderr, binary stdin, env; describes itself', async () => {
    const h = await open()
    expect(h.describe()).toBe(`ssh root@127.0.0.1:${sshd.port}`)
    const res = await h.run(['sh', '-c', 'echo out; echo err >&2; echo "[$V]"; exit 7'], {
      timeoutMs: 10_000,
      env: {V: "it's $HOME"},
    })
    expect(res).toMatchObject({code: 7, stdout: "out\n[it's $HOME]\n", stderr: 'err\n'})
    const bytes = Buffer.from([0, 1, 2, 0xff, 0x0a, 0x27, 0x80])
    const echoed = await h.run(['od', '-An', '-v', '-tx1'], {timeoutMs: 10_000, stdin: bytes})
    expect(echoed.stdout.replace(/\s+/g, '')).toBe(bytes.toString('hex'))
    expect(await h.run(['sh', '-c', 'kill -TERM $$'], {timeoutMs: 10_000})).toMatchObject({
      code: null,
      signal: 'SIGTERM',
    })
    expect((await h.run(['/nonexistent/pdchaos'], {timeoutMs: 10_000})).code).toBe(127)
  })

  it('a timeout returns fast with exit 5 naming host and command, and kills the remote process group', async () => {
    const h = await open()
    await h.connect()
    const m = marker()
    strays.push(`sleep ${m}`)
    const t0 = performance.now()
    const err = await failure(h.run(['sh', '-c', `sleep ${m} & sleep ${m}; wait`], {timeoutMs: 500}))
    const elapsed = performance.now() - t0
    expect(err.exitCode).toBe(5)
    expect(err.message).toContain(`timed out after 500 ms on ssh root@127.0.0.1:${sshd.port}`)
    expect(err.message).toContain(`sleep ${m}`)
    expect(elapsed).toBeLessThan(5000)
    expect(await eventually(() => pidsMatching(`sleep ${m}`).length === 0, 3000)).toBe(true)
    // The connection is still good afterwards.
    expect((await h.run(['echo', 'ok'], {timeoutMs: 10_000})).stdout).toBe('ok\n')
  })

  it(
    "a stop (the run's signal) returns at once with exit 3 and kills the remote process group " + '(issue 28)',
    async () => {
      const h = await open()
      await h.connect()
      const m = marker()
      strays.push(`sleep ${m}`)
      const stop = new AbortController()
      const running = failure(
        h.run(['sh', '-c', `sleep ${m} & sleep ${m}; wait`], {timeoutMs: 60_000, signal: stop.signal}),
      )
      await eventually(() => pidsMatching(`sleep ${m}`).length >= 3, 5000)
      const t0 = performance.now()
      stop.abort('interrupted (SIGINT)')
      const err = await running
      expect(err.exitCode).toBe(3)
      expect(err.message).toMatch(
        /^interrupted \(SIGINT\) during `sh -c .*` on ssh root@127\.0\.0\.1:\d+ \(the remote command was killed\)/,
      )
      expect(performance.now() - t0).toBeLessThan(1000)
      expect(await eventually(() => pidsMatching(`sleep ${m}`).length === 0, 3000)).toBe(true)
      expect((await h.run(['echo', 'ok'], {timeoutMs: 10_000})).stdout).toBe('ok\n')
    },
  )

  it(
    'multiplexes 100 sequential and 20 concurrent commands over one connection (queued under ' + 'MaxSessions)',
    async () => {
      const h = await open()
      const before = logins(sshd)
      for (let i = 0; i < 100; i++) {
        const res = await h.run(['echo', `n${i}`], {timeoutMs: 10_000})
        expect(res.stdout).toBe(`n${i}\n`)
      }
      // 20 at once is more than sshd's MaxSessions (10): without the queue some channel opens would fail.
      const results = await Promise.all(
        Array.from({length: 20}, (_, i) => h.run(['sh', '-c', `sleep 0.2; echo c${i}`], {timeoutMs: 20_000})),
      )
      expect(results.map(r => r.stdout)).toEqual(Array.from({length: 20}, (_, i) => `c${i}\n`))
      expect(logins(sshd) - before).toBe(1)
    },
  )

  it('uploads a file atomically with its mode, and reports an unwritable path as exit 5', async () => {
    const h = await open()
    const path = join(dir, "up load's.bin")
    const content = Buffer.concat([Buffer.from([0, 255, 39, 10]), Buffer.alloc(300_000, 7)])
    await h.upload(path, content, 0o600)
    expect(readFileSync(path).equals(content)).toBe(true)
    expect(statSync(path).mode & 0o777).toBe(0o600)
    const err = await failure(h.upload(join(dir, 'no-such-dir', 'f'), 'x'))
    expect(err.exitCode).toBe(5)
    expect(err.message).toContain('cannot write')
  })

  it('startDetached: the process survives the connection closing', async () => {
    const h = await open()
    const m = marker()
    strays.push(`sleep ${m}`)
    const log = join(dir, 'detached.log')
    const {pid} = await h.startDetached(['sh', '-c', `echo "up $1"; exec sleep ${m}`, 'sh', 'a b'], {logFile: log})
    await h.close()
    await new Promise(r => setTimeout(r, 300))
    expect(alive(pid)).toBe(true)
    expect(pidsMatching(`sleep ${m}`)).toContain(pid)
    expect(await eventually(() => readFileSync(log, 'utf8') === 'up a b\n', 3000)).toBe(true)
  })
})

describe('host keys', () => {
  it('refuses an unknown host with its fingerprint, and --accept-new-host-key records it', async () => {
    const kh = join(dir, 'kh-new')
    const err = await failure((await open({knownHosts: kh})).run(['true'], {timeoutMs: 10_000}))
    expect(err.exitCode).toBe(5)
    expect(err.message).toContain(sshd.hostKeyFingerprint)
    expect(err.message).toMatch(/unknown/)
    expect(err.suggestion).toContain('--accept-new-host-key')
    const h = await open({knownHosts: kh}, {acceptNewHostKey: true})
    expect((await h.run(['echo', 'hi'], {timeoutMs: 10_000})).stdout).toBe('hi\n')
    expect(readFileSync(kh, 'utf8')).toBe(sshd.knownHostsLine)
    expect((await (await open({knownHosts: kh})).run(['true'], {timeoutMs: 10_000})).code).toBe(0)
  })

  it(
    'refuses a changed key even with acceptNewHostKey, naming both fingerprints, and leaves known_hosts ' + 'alone',
    async () => {
      const other = await startSshd({port: sshd.port === 65_535 ? 1024 : undefined})
      extraSshds.push(other)
      const kh = join(dir, 'kh-changed')
      // The file knows a different key for this [host]:port.
      const stale = other.knownHostsLine.replace(`[127.0.0.1]:${other.port}`, `[127.0.0.1]:${sshd.port}`)
      writeFileSync(kh, stale)
      const err = await failure(
        (await open({knownHosts: kh}, {acceptNewHostKey: true})).run(['true'], {timeoutMs: 10_000}),
      )
      expect(err.exitCode).toBe(5)
      expect(err.message).toContain('CHANGED')
      expect(err.message).toContain(sshd.hostKeyFingerprint)
      expect(err.message).toContain(other.hostKeyFingerprint)
      expect(err.message.includes('\n')).toBe(false)
      expect(readFileSync(kh, 'utf8')).toBe(stale)
    },
  )

  it('accepts a hashed known_hosts entry', async () => {
    const kh = join(dir, 'kh-hashed')
    writeFileSync(kh, sshd.knownHostsLine.replace(`[127.0.0.1]:${sshd.port}`, hashedToken('127.0.0.1', sshd.port)))
    expect((await (await open({knownHosts: kh})).run(['true'], {timeoutMs: 10_000})).code).toBe(0)
    // ssh-keygen agrees the entry is for this host.
    expect(execFileSync('ssh-keygen', ['-F', `[127.0.0.1]:${sshd.port}`, '-f', kh], {encoding: 'utf8'})).toContain(
      '|1|',
    )
  })

  it('a pinned fingerprint is enough; a wrong pin is refused with the real fingerprint', async () => {
    const nowhere = join(dir, 'kh-none')
    expect(
      (
        await (
          await open({knownHosts: nowhere, fingerprint: sshd.hostKeyFingerprint})
        ).run(['true'], {timeoutMs: 10_000})
      ).code,
    ).toBe(0)
    const wrong = 'SHA256:' + 'A'.repeat(43)
    const err = await failure(
      (await open({knownHosts: nowhere, fingerprint: wrong})).run(['true'], {timeoutMs: 10_000}),
    )
    expect(err.exitCode).toBe(5)
    expect(err.message).toContain(sshd.hostKeyFingerprint)
    expect(err.suggestion).toContain(`fingerprint: ${sshd.hostKeyFingerprint}`)
  })
})

describe('reaching the host', () => {
  it('resolves a ~/.ssh/config alias (HostName, Port, User, IdentityFile) and connects', async () => {
    const config = join(dir, 'ssh_config')
    writeFileSync(
      config,
      `Host pd-*\n  User root\nHost pd-gpu\n  HostName 127.0.0.1\n  Port ${sshd.port}\n  ` +
        `IdentityFile ${sshd.clientKeyPath}\n`,
    )
    const h = (await openHost(
      {kind: 'ssh', alias: 'pd-gpu', knownHosts, connectTimeoutSeconds: 5},
      {sshConfigPath: config},
    )) as SshHost
    hosts.push(h)
    expect(h.describe()).toBe(`ssh root@127.0.0.1:${sshd.port}`)
    expect((await h.run(['echo', 'via alias'], {timeoutMs: 10_000})).stdout).toBe('via alias\n')
  })

  it('goes through a ProxyJump host (a second sshd) with one hop', async () => {
    const jump = await startSshd({clientKeyPath: sshd.clientKeyPath, extraConfig: ['LogLevel DEBUG1']})
    extraSshds.push(jump)
    const kh = join(dir, 'kh-jump')
    writeFileSync(kh, sshd.knownHostsLine + jump.knownHostsLine)
    const h = await open({knownHosts: kh, proxyJump: `root@127.0.0.1:${jump.port}`})
    expect((await h.run(['echo', 'jumped'], {timeoutMs: 10_000})).stdout).toBe('jumped\n')
    expect(readFileSync(jump.logPath, 'utf8')).toMatch(
      new RegExp(`direct-tcpip.*127\\.0\\.0\\.1 port ${sshd.port}|target 127\\.0\\.0\\.1 port ${sshd.port}`),
    )
  })

  it('authenticates through ssh-agent (SSH_AUTH_SOCK) when no key file is named', async () => {
    const sock = join(dir, 'agent.sock')
    const agent = spawn('ssh-agent', ['-D', '-a', sock], {stdio: 'ignore'})
    const saved = process.env.SSH_AUTH_SOCK
    try {
      expect(await eventually(() => existsSync(sock), 5000)).toBe(true)
      execFileSync('ssh-add', ['-q', sshd.clientKeyPath], {
        env: {...process.env, SSH_AUTH_SOCK: sock},
        stdio: 'ignore',
        timeout: 10_000,
      })
      process.env.SSH_AUTH_SOCK = sock
      const emptyHome = mkdtempSync(join(dir, 'home-'))
      const h = await open({identityFile: undefined, agent: true}, {home: emptyHome})
      expect(h.endpoint.agentSocket).toBe(sock)
      expect((await h.run(['echo', 'agent'], {timeoutMs: 10_000})).stdout).toBe('agent\n')
      expect(readFileSync(sshd.logPath, 'utf8')).toContain('Accepted publickey')
    } finally {
      if (saved === undefined) delete process.env.SSH_AUTH_SOCK
      else process.env.SSH_AUTH_SOCK = saved
      agent.kill('SIGKILL')
    }
  })

  it('with no key file and no agent, says so as bad input (exit 2)', async () => {
    const saved = process.env.SSH_AUTH_SOCK
    delete process.env.SSH_AUTH_SOCK
    try {
      const h = await open({identityFile: undefined}, {home: mkdtempSync(join(dir, 'home-'))})
      const err = await failure(h.run(['true'], {timeoutMs: 10_000}))
      expect(err.exitCode).toBe(2)
      expect(err.message).toMatch(/no key to log in/)
    } finally {
      if (saved !== undefined) process.env.SSH_AUTH_SOCK = saved
    }
  })

  it('an unreachable port fails fast with exit 5 "cannot reach"', async () => {
    const port = await freePort()
    const t0 = performance.now()
    const err = await failure((await open({port})).run(['true'], {timeoutMs: 10_000}))
    expect(performance.now() - t0).toBeLessThan(3000)
    expect(err.exitCode).toBe(5)
    expect(err.message).toBe(`cannot reach ssh root@127.0.0.1:${port}: ECONNREFUSED`)
  })

  it('a key the host does not accept gives exit 5 "refused the key" with a suggestion', async () => {
    const key = join(dir, 'stranger_ed25519')
    execFileSync('ssh-keygen', ['-q', '-t', 'ed25519', '-N', '', '-f', key])
    const err = await failure((await open({identityFile: key})).run(['true'], {timeoutMs: 10_000}))
    expect(err.exitCode).toBe(5)
    expect(err.message).toContain('refused the key')
    expect(err.message).toContain(key)
    expect(err.suggestion).toContain('authorized_keys')
  })

  it('sshd killed mid-command: exit 5 well within the timeout, never a hang', async () => {
    const victim = await startSshd({clientKeyPath: sshd.clientKeyPath})
    extraSshds.push(victim)
    const kh = join(dir, 'kh-victim')
    writeFileSync(kh, victim.knownHostsLine)
    const h = await open({port: victim.port, knownHosts: kh})
    await h.connect()
    const m = marker()
    strays.push(`sleep ${m}`)
    const t0 = performance.now()
    const running = failure(h.run(['sleep', m], {timeoutMs: 20_000}))
    await eventually(() => pidsMatching(`sleep ${m}`).length > 0, 3000)
    await victim.killAll()
    const err = await running
    expect(performance.now() - t0).toBeLessThan(8000)
    expect(err.exitCode).toBe(5)
    expect(err.message).toMatch(/lost the connection to ssh root@127\.0\.0\.1:\d+/)
    expect(err.message).toContain(`sleep ${m}`)
    // The listener is gone too: the next command fails fast instead of hanging.
    const next = await failure(h.run(['true'], {timeoutMs: 10_000}))
    expect(next.message).toMatch(/cannot reach/)
  })

  it('reconnects for the next command after the connection drops', async () => {
    const h = await open()
    expect((await h.run(['echo', '1'], {timeoutMs: 10_000})).stdout).toBe('1\n')
    const before = logins(sshd)
    // Kill only the session processes: the listener stays, as after a network blip.
    killAll(descendants(sshd.pid))
    await new Promise(r => setTimeout(r, 200))
    expect((await h.run(['echo', '2'], {timeoutMs: 10_000})).stdout).toBe('2\n')
    expect(logins(sshd) - before).toBe(1)
  })
})
