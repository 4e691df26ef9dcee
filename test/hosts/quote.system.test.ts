import {execa} from 'execa'
import {writeFileSync} from 'node:fs'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {PdError} from '../../src/errors.js'
import {SshHost, resolveSshEndpoint} from '../../src/hosts/ssh-host.js'
import {anyShellCommand, describeArgv, shellCommand, shellQuote} from '../../src/hosts/quote.js'
import {missingTool, skipWithout} from '../harness/level.js'
import {startSshd, type Sshd} from '../harness/sshd.js'

/** Deterministic PRNG (mulberry32) so a failing case can be reproduced from the printed seed. */
function rng(seed: number): () => number {
  let a = seed >>> 0
  return () => {
    a = (a + 0x6d2b79f5) >>> 0
    let t = a
    t = Math.imul(t ^ (t >>> 15), t | 1)
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61)
    return ((t ^ (t >>> 14)) >>> 0) / 4_294_967_296
  }
}

const NASTY = [
  "'",
  '"',
  '$',
  '`',
  '\\',
  '\n',
  ' ',
  '\t',
  '-',
  '--',
  '!',
  '*',
  '?',
  '~',
  '#',
  '&',
  ';',
  '|',
  '<',
  '>',
  '(',
  ')',
  '{',
  '}',
  '[',
  ']',
  '=',
  '%',
  '$(id)',
  '${HOME}',
  "'\\''",
  '\r',
  '\u00a0',
  'é',
  '日本',
  '🙂',
]

function randomString(r: () => number): string {
  const len = Math.floor(r() * 24)
  let s = r() < 0.2 ? '-' : ''
  for (let i = 0; i < len; i++) {
    const pick = r()
    if (pick < 0.45) s += NASTY[Math.floor(r() * NASTY.length)]
    else if (pick < 0.7) s += String.fromCharCode(0x20 + Math.floor(r() * 95))
    else {
      // Any Unicode scalar value except NUL and the surrogates (which UTF-8 cannot carry).
      let cp = 1 + Math.floor(r() * 0x10ffff)
      if (cp >= 0xd800 && cp <= 0xdfff) cp -= 0x800
      s += String.fromCodePoint(cp)
    }
  }
  return s
}

const SEED = Number(process.env.PDCHAOS_QUOTE_SEED ?? 20_240_601)
const COUNT = 300
const cases = (() => {
  const r = rng(SEED)
  const out = ['', "'", "''", '\n', '-n', '-e', '--', ' leading', 'trailing ', '$(touch /tmp/pdchaos-pwned)', '`id`']
  while (out.length < COUNT) out.push(randomString(r))
  return out
})()
const batches = (size: number): string[][] => {
  const out: string[][] = []
  for (let i = 0; i < cases.length; i += size) out.push(cases.slice(i, i + size))
  return out
}
const expectedBytes = (args: string[]): Buffer => Buffer.concat(args.map(a => Buffer.from(a + '\0', 'utf8')))

describe('shellQuote', () => {
  it('leaves plain words bare and single-quotes everything else', () => {
    expect(shellQuote('abc-1.2/x')).toBe('abc-1.2/x')
    expect(shellQuote('')).toBe("''")
    expect(shellQuote('a b')).toBe("'a b'")
    expect(shellQuote("it's")).toBe("'it'\\''s'")
    expect(shellQuote('$HOME')).toBe("'$HOME'")
    expect(shellCommand(['echo', 'a b', ''])).toBe("echo 'a b' ''")
  })

  it('rejects NUL and empty argv as bad input (exit 2)', () => {
    for (const bad of [() => shellQuote('a\0b'), () => shellCommand([])]) {
      expect(bad).toThrow(PdError)
      try {
        bad()
      } catch (err) {
        expect((err as PdError).exitCode).toBe(2)
      }
    }
  })

  it('describes a command on one line', () => {
    expect(describeArgv(['printf', 'a\nb'])).toBe("printf $'a\\nb'")
    expect(describeArgv(['x'.repeat(300)]).length).toBeLessThanOrEqual(120)
  })

  it(`${COUNT} random strings arrive verbatim through anyShellCommand and sh (seed ${SEED})`, async () => {
    for (const batch of batches(30)) {
      const line = anyShellCommand(shellCommand(['printf', '%s\\0', ...batch]))
      // Outside its fixed frame only plain characters and octal escapes: nothing tcsh, fish or printf would read.
      const format = /^exec sh -c 'eval "\$\(printf "(.*)"\)"'$/s.exec(line)?.[1]
      expect(format?.replace(/\\[0-7]{3}/g, '')).toMatch(/^[^\\!%\n\r'"$`]*$/)
      const res = await execa('sh', ['-c', line], {encoding: 'buffer', timeout: 10_000})
      expect(Buffer.compare(Buffer.from(res.stdout), expectedBytes(batch)), JSON.stringify(batch)).toBe(0)
    }
  })

  it(`${COUNT} random strings arrive verbatim through a real sh -c (seed ${SEED})`, async () => {
    for (const batch of batches(30)) {
      const res = await execa('sh', ['-c', shellCommand(['printf', '%s\\0', ...batch])], {
        encoding: 'buffer',
        timeout: 10_000,
      })
      expect(Buffer.compare(Buffer.from(res.stdout), expectedBytes(batch)), JSON.stringify(batch)).toBe(0)
    }
  })
})

// The login shell sshd runs commands through: the machine's (bash for root), then the non-POSIX ones Debian
// offers (issue 12, S6). scripts/install-test-deps.sh installs tcsh and fish.
const LOGIN_SHELLS: Array<{name: string; shell?: string; missing?: string}> = [
  {name: 'the default login shell'},
  {name: 'tcsh as the login shell', shell: '/usr/bin/tcsh', missing: missingTool('/usr/bin/tcsh', 'tcsh')},
  {name: 'fish as the login shell', shell: '/usr/bin/fish', missing: missingTool('/usr/bin/fish', 'fish')},
]

describe.each(LOGIN_SHELLS)('shellQuote through a real sshd, $name', ({name, shell, missing}) => {
  const skip = skipWithout(`the quoting test with ${name}`, missing)
  let sshd: Sshd
  let host: SshHost
  beforeAll(async () => {
    if (skip) return
    sshd = await startSshd(shell ? {loginShell: shell} : {})
    writeFileSync(`${sshd.dir}/known_hosts`, sshd.knownHostsLine)
    host = new SshHost(
      await resolveSshEndpoint(
        {
          kind: 'ssh',
          hostname: sshd.host,
          port: sshd.port,
          user: 'root',
          identityFile: sshd.clientKeyPath,
          knownHosts: `${sshd.dir}/known_hosts`,
          connectTimeoutSeconds: 10,
        },
        {sshConfigPath: '/nonexistent'},
      ),
    )
  })
  afterAll(async () => {
    await host?.close()
    await sshd?.stop()
  })

  // Only for a shell set here: the machine's default has nothing to compare with (and a skip fails CI).
  if (shell)
    it.skipIf(skip)('sshd really runs commands through that shell', async () => {
      // OpenSSH's own client, so the command reaches the login shell as typed; `; true` keeps the shell alive as ps's
      // parent.
      const res = await execa(
        'ssh',
        [
          '-i',
          sshd.clientKeyPath,
          '-p',
          String(sshd.port),
          '-o',
          'BatchMode=yes',
          '-o',
          'StrictHostKeyChecking=no',
          '-o',
          'UserKnownHostsFile=/dev/null',
          '-o',
          'LogLevel=ERROR',
          `root@${sshd.host}`,
          "sh -c 'ps -o comm= -p $PPID'; true",
        ],
        {timeout: 20_000, reject: false},
      )
      expect(res.stdout.trim(), res.stderr).toBe(shell!.slice(shell!.lastIndexOf('/') + 1))
    })

  it.skipIf(skip)(`${COUNT} random strings arrive byte for byte via the login shell (seed ${SEED})`, async () => {
    for (const batch of batches(30)) {
      // printf's bytes are shown as hex on the host, so no decoding on the way back can hide a difference.
      const res = await host.run(['sh', '-c', 'printf "%s\\0" "$@" | od -An -v -tx1', 'sh', ...batch], {
        timeoutMs: 10_000,
      })
      expect(res.code).toBe(0)
      expect(res.stdout.replace(/\s+/g, ''), JSON.stringify(batch)).toBe(expectedBytes(batch).toString('hex'))
      const direct = await host.run(['printf', '%s\\0', ...batch], {timeoutMs: 10_000})
      expect(direct.stdout).toBe(expectedBytes(batch).toString('utf8'))
    }
  })

  it.skipIf(skip)('a timed-out command is killed on the host, whatever the login shell', async () => {
    const marker = `pdchaos-quote-sleep-${process.pid}-${Math.random().toString(36).slice(2)}`
    const err = await host.run(['sh', '-c', 'exec sleep 30', marker], {timeoutMs: 1000}).catch((e: unknown) => e)
    expect(err).toBeInstanceOf(PdError)
    const left = await execa('pgrep', ['-f', marker], {reject: false})
    expect(left.stdout.trim()).toBe('')
  })
})
