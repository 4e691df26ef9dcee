import {mkdtempSync, rmSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {afterAll, describe, expect, it} from 'vitest'

import {PdError} from '../../src/errors.js'
import {buildArgv, envPrefix, sudoPrefix} from '../../src/hosts/host.js'
import {checkKnownHosts, fingerprintOf, hashedToken, knownHostsLine, keyTypeOf} from '../../src/hosts/known-hosts.js'
import {parseJumpSpec, resolveSshConfig} from '../../src/hosts/ssh-config.js'
import {resolveSshEndpoint} from '../../src/hosts/ssh-host.js'

const CONFIG = `
# global defaults come last in a real file, but first-match-wins means order matters
Host gpu-*  !gpu-skip
  User ops
  IdentityFile ~/.ssh/gpu_%h
  IdentityFile %d/.ssh/second

Host gpu-a
  HostName 10.231.0.2
  Port 2222
  User root

Host gpu-b gpu-c
  HostName=%h.lab.internal
  ProxyJump jumper@bastion:2200

Host "quoted"
  HostName 10.231.9.9

Match host foo
  User nobody-from-match

Host bastion
  User jumpuser
  IdentityFile ~/.ssh/bastion_key

Host *
  User fallback
  Port 22
  ProxyJump none
`

describe('ssh config aliases', () => {
  const env = {home: '/home/tester', localUser: 'tester'}

  it('first match wins per option, IdentityFile accumulates, tokens and ~ expand', () => {
    expect(resolveSshConfig(CONFIG, 'gpu-a', env)).toEqual({
      hostname: '10.231.0.2',
      user: 'ops',
      port: 2222,
      identityFiles: ['/home/tester/.ssh/gpu_10.231.0.2', '/home/tester/.ssh/second'],
    })
  })

  it('expands %h in HostName, reads key=value, and keeps the ProxyJump of the first block naming one', () => {
    expect(resolveSshConfig(CONFIG, 'gpu-c', env)).toMatchObject({
      hostname: 'gpu-c.lab.internal',
      user: 'ops',
      port: 22,
      proxyJump: 'jumper@bastion:2200',
    })
  })

  it('honours negated patterns, quoted patterns, and skips Match blocks', () => {
    expect(resolveSshConfig(CONFIG, 'gpu-skip', env)).toEqual({user: 'fallback', port: 22, identityFiles: []})
    expect(resolveSshConfig(CONFIG, 'quoted', env).hostname).toBe('10.231.9.9')
    expect(resolveSshConfig(CONFIG, 'foo', env).user).toBe('fallback')
  })

  it('? matches one character; an unknown host gets only the catch-all', () => {
    expect(resolveSshConfig('Host h?\n User q\n', 'h1', env).user).toBe('q')
    expect(resolveSshConfig('Host h?\n User q\n', 'h10', env).user).toBeUndefined()
  })

  it('rejects a bad Port and multi-hop ProxyJump as bad input', () => {
    expect(() => resolveSshConfig('Host x\n Port 99999\n', 'x', env)).toThrow(/not a port/)
    expect(() => parseJumpSpec('a@b:1,c@d:2')).toThrow(PdError)
    expect(parseJumpSpec('u@h:2200')).toEqual({user: 'u', host: 'h', port: 2200})
    expect(parseJumpSpec('ssh://[fe80::1]:22')).toEqual({host: 'fe80::1', port: 22})
    expect(parseJumpSpec('bastion')).toEqual({host: 'bastion'})
  })

  describe('merged with the deployment file', () => {
    const dir = mkdtempSync(join(tmpdir(), 'pdchaos-sshcfg-'))
    afterAll(() => rmSync(dir, {recursive: true, force: true}))
    const cfgPath = join(dir, 'config')
    writeFileSync(cfgPath, CONFIG)

    it('resolves an alias, lets explicit fields win, and resolves the jump host through the same file', async () => {
      const e = await resolveSshEndpoint(
        {kind: 'ssh', alias: 'gpu-b', user: 'root', connectTimeoutSeconds: 3},
        {sshConfigPath: cfgPath, home: '/home/tester'},
      )
      expect(e).toMatchObject({
        host: 'gpu-b.lab.internal',
        port: 22,
        user: 'root',
        connectTimeoutMs: 3000,
        knownHostsPath: '/home/tester/.ssh/known_hosts',
      })
      expect(e.identityFiles).toEqual(['/home/tester/.ssh/gpu_gpu-b.lab.internal', '/home/tester/.ssh/second'])
      expect(e.jump).toMatchObject({
        host: 'bastion',
        port: 2200,
        user: 'jumper',
        identityFiles: ['/home/tester/.ssh/bastion_key'],
      })
    })

    it('an explicit proxyJump and identityFile override the file', async () => {
      const e = await resolveSshEndpoint(
        {kind: 'ssh', alias: 'gpu-a', identityFile: '~/k', proxyJump: 'j@10.0.0.1:22', connectTimeoutSeconds: 10},
        {sshConfigPath: cfgPath, home: '/home/tester'},
      )
      expect(e).toMatchObject({host: '10.231.0.2', port: 2222, user: 'ops', identityFiles: ['/home/tester/k']})
      expect(e.jump).toMatchObject({host: '10.0.0.1', port: 22, user: 'j', identityFiles: ['/home/tester/k']})
    })
  })
})

describe('known_hosts', () => {
  // Two distinct ed25519 public key blobs (type string + 32 bytes).
  const blob = (fill: number): Buffer => {
    const type = Buffer.from('ssh-ed25519')
    const head = Buffer.alloc(4)
    head.writeUInt32BE(type.length)
    const klen = Buffer.alloc(4)
    klen.writeUInt32BE(32)
    return Buffer.concat([head, type, klen, Buffer.alloc(32, fill)])
  }
  const key = blob(1)
  const other = blob(2)

  it('writes [host]:port lines for non-22 ports and bare hosts for 22', () => {
    expect(knownHostsLine('10.0.0.1', 22, key)).toBe(`10.0.0.1 ssh-ed25519 ${key.toString('base64')}`)
    expect(knownHostsLine('10.0.0.1', 2222, key).startsWith('[10.0.0.1]:2222 ssh-ed25519 ')).toBe(true)
    expect(keyTypeOf(key)).toBe('ssh-ed25519')
    expect(fingerprintOf(key)).toMatch(/^SHA256:[A-Za-z0-9+/]{43}$/)
  })

  it('finds plain, pattern, and hashed entries; port matters', () => {
    expect(checkKnownHosts(knownHostsLine('h', 2222, key), 'h', 2222, key)).toEqual({status: 'known'})
    expect(checkKnownHosts(knownHostsLine('h', 2222, key), 'h', 22, key)).toEqual({status: 'unknown'})
    expect(checkKnownHosts(`a,*.lab,!bad.lab ssh-ed25519 ${key.toString('base64')}`, 'x.lab', 22, key)).toEqual({
      status: 'known',
    })
    expect(checkKnownHosts(`a,*.lab,!bad.lab ssh-ed25519 ${key.toString('base64')}`, 'bad.lab', 22, key)).toEqual({
      status: 'unknown',
    })
    expect(
      checkKnownHosts(
        `${hashedToken('10.231.0.2', 2222)} ssh-ed25519 ${key.toString('base64')}`,
        '10.231.0.2',
        2222,
        key,
      ),
    ).toEqual({status: 'known'})
    expect(
      checkKnownHosts(
        `${hashedToken('10.231.0.2', 2222)} ssh-ed25519 ${key.toString('base64')}`,
        '10.231.0.3',
        2222,
        key,
      ),
    ).toEqual({status: 'unknown'})
  })

  it('reports a changed key with the known fingerprints, and @revoked wins', () => {
    expect(checkKnownHosts(knownHostsLine('h', 22, other), 'h', 22, key)).toEqual({
      status: 'changed',
      knownFingerprints: [fingerprintOf(other)],
    })
    const text = `${knownHostsLine('h', 22, key)}\n@revoked * ssh-ed25519 ${key.toString('base64')}\n`
    expect(checkKnownHosts(text, 'h', 22, key)).toEqual({status: 'revoked'})
  })
})

describe('command prefixes', () => {
  it('sudo -n -- only when asked, the policy allows it, and the user is not root', () => {
    expect(sudoPrefix(true, 'passwordless', false)).toEqual(['sudo', '-n', '--'])
    expect(sudoPrefix(true, 'passwordless', true)).toEqual([])
    expect(sudoPrefix(true, 'never', false)).toEqual([])
    expect(sudoPrefix(false, 'passwordless', false)).toEqual([])
    expect(buildArgv(['id'], {sudo: true, env: {A: '1 2'}}, 'passwordless', false)).toEqual([
      'sudo',
      '-n',
      '--',
      'env',
      '--',
      'A=1 2',
      'id',
    ])
  })

  it('rejects invalid environment names as bad input', () => {
    expect(() => envPrefix({'A B': 'x'})).toThrow(/invalid environment variable name/)
    expect(envPrefix({})).toEqual([])
  })
})
