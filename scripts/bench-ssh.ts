/**
 * Per-command latency: one multiplexed ssh2 connection (SshHost) vs spawning the OpenSSH client per command,
 * both against the same real sshd on loopback with the same key. Writes the `## SSH` section of BENCHMARKS.md.
 * Run: node --import tsx scripts/bench-ssh.ts [--count 100]
 */
import {execa} from 'execa'
import {writeFileSync} from 'node:fs'
import {join} from 'node:path'

import {SshHost, resolveSshEndpoint} from '../src/hosts/ssh-host.js'
import {startSshd, type Sshd} from '../test/harness/sshd.js'
import {writeSection} from './bench-common.js'

const countArg = process.argv.indexOf('--count')
const COUNT = countArg > 0 ? Number(process.argv[countArg + 1]) : 100
const TIMEOUT_MS = 10_000

interface Stats {
  median: number
  p99: number
  mean: number
  min: number
  max: number
}
function stats(xs: number[]): Stats {
  const s = [...xs].sort((a, b) => a - b)
  const q = (p: number): number => s[Math.min(s.length - 1, Math.ceil(p * s.length) - 1)]!
  return {median: q(0.5), p99: q(0.99), mean: xs.reduce((a, b) => a + b, 0) / xs.length, min: s[0]!, max: s.at(-1)!}
}
const ms = (x: number): string => `${x.toFixed(1)} ms`

async function measure(sshd: Sshd, count: number): Promise<{ssh2: Stats; ssh2ConnectMs: number; spawn: Stats}> {
  const kh = join(sshd.dir, 'bench_known_hosts')
  writeFileSync(kh, sshd.knownHostsLine)
  const host = new SshHost(
    await resolveSshEndpoint(
      {
        kind: 'ssh',
        hostname: sshd.host,
        port: sshd.port,
        user: 'root',
        identityFile: sshd.clientKeyPath,
        knownHosts: kh,
        connectTimeoutSeconds: 10,
      },
      {sshConfigPath: '/nonexistent'},
    ),
  )
  const ssh2: number[] = []
  let ssh2ConnectMs: number
  try {
    const c0 = performance.now()
    await host.connect()
    ssh2ConnectMs = performance.now() - c0
    for (let i = 0; i < count; i++) {
      const t0 = performance.now()
      const res = await host.run(['true'], {timeoutMs: TIMEOUT_MS})
      ssh2.push(performance.now() - t0)
      if (res.code !== 0) throw new Error(`ssh2 command failed: ${res.stderr}`)
    }
  } finally {
    await host.close()
  }
  const spawn: number[] = []
  const args = [
    '-F',
    '/dev/null',
    '-i',
    sshd.clientKeyPath,
    '-p',
    String(sshd.port),
    '-o',
    'BatchMode=yes',
    '-o',
    'IdentitiesOnly=yes',
    '-o',
    `UserKnownHostsFile=${kh}`,
    '-o',
    'StrictHostKeyChecking=yes',
    '-o',
    'ControlMaster=no',
    '-o',
    'ControlPath=none',
    `root@${sshd.host}`,
    'true',
  ]
  for (let i = 0; i < count; i++) {
    const t0 = performance.now()
    const res = await execa('ssh', args, {reject: false, timeout: TIMEOUT_MS})
    spawn.push(performance.now() - t0)
    if (res.exitCode !== 0) throw new Error(`ssh client failed: ${res.stderr}`)
  }
  return {ssh2: stats(ssh2), ssh2ConnectMs, spawn: stats(spawn)}
}

function row(name: string, s: Stats): string {
  return `| ${name} | ${ms(s.median)} | ${ms(s.p99)} | ${ms(s.mean)} | ${ms(s.min)} | ${ms(s.max)} |`
}

async function main(): Promise<void> {
  const ver = (await execa('ssh', ['-V'], {reject: false})).stderr.trim()
  const clean = await startSshd()
  let primary: Awaited<ReturnType<typeof measure>>
  try {
    primary = await measure(clean, COUNT)
  } finally {
    await clean.stop()
  }
  // The same with the machine's own root dotfiles (bash sources ~/.bashrc for every ssh command).
  const dotCount = Math.min(COUNT, 20)
  const dotted = await startSshd({home: null})
  let withRc: Awaited<ReturnType<typeof measure>>
  try {
    withRc = await measure(dotted, dotCount)
  } finally {
    await dotted.stop()
  }

  const ratio = primary.spawn.median / primary.ssh2.median
  const body = [
    `Per-command latency of \`true\` over ${COUNT} sequential commands against a real OpenSSH sshd on loopback ` +
      `(${ver}), same ed25519 key.`,
    'ssh2: one multiplexed connection (SshHost, a channel per command, connect excluded). ssh: the OpenSSH client ' +
      'spawned per command',
    '(BatchMode, no ControlMaster). Login sessions get a clean HOME (the test harness default). `node --import tsx ' +
      'scripts/bench-ssh.ts`.',
    `Measured ${new Date().toISOString().slice(0, 10)} on a 2-core machine with other work running.`,
    '',
    '| method | median | p99 | mean | min | max |',
    '|---|---|---|---|---|---|',
    row('ssh2 multiplexed (SshHost.run)', primary.ssh2),
    row('ssh client spawned per command', primary.spawn),
    '',
    `- Ratio of medians: **${ratio.toFixed(1)}x** lower per command with ssh2 (goal >= ` +
      `10x: ${ratio >= 10 ? 'met' : 'NOT met'}).`,
    `- ssh2 connection setup (handshake + auth, pure-JS crypto) once: ${ms(primary.ssh2ConnectMs)}.`,
    `- With this machine's root ~/.bashrc sourced by every command (${dotCount} commands each): ssh2 ` +
      `median ${ms(withRc.ssh2.median)},`,
    `  ssh client median ${ms(withRc.spawn.median)} ` +
      `(ratio ${(withRc.spawn.median / withRc.ssh2.median).toFixed(1)}x): a heavy login shell rc file`,
    "  costs every command the same, whichever transport; keep the GPU host's rc files light.",
    '',
  ].join('\n')

  process.stdout.write(writeSection('SSH', body) + '\n')
}

await main()
