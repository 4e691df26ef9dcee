import {execFileSync} from 'node:child_process'
import {existsSync, lstatSync, mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync} from 'node:fs'
import {createServer, type Server, type Socket} from 'node:net'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {afterAll, beforeAll, describe, expect, it} from 'vitest'

import {runCli} from '../e2e/cli.js'
import {runCliInProcess} from './in-process-cli.js'

/**
 * Issue 12's probe as a table: bad inputs a skeptical SRE tries, and the good ones that must keep working. Each runs
 * the built CLI as a user does (a subprocess), with --json and without. A bad input must exit with the README's code,
 * say its cause in one line (and at most one suggestion line), print no stack trace, and under --json print exactly
 * one JSON document with an error code. Targets are loopback ports nothing listens on, and a loopback server that
 * accepts connections and never answers (bounded by probeTimeoutSeconds in its deployment file).
 */

interface Case {
  name: string
  /** argv after `pdchaos`; {dir} is replaced by this file's temp dir. */
  args: string[]
  exit: number
  /** The cause the one-line message must name (bad inputs only). */
  cause?: RegExp
  /** Only with --json, or only without (default: see modesOf). */
  modes?: Array<'json' | 'text'>
  /** The most this case may take, ms (the hang cases are bounded by their probe timeout; generous: a loaded 2-core
   * machine takes seconds just to start the CLI). */
  withinMs?: number
  /** The suggestion (`Try this:` line, or the JSON document's suggestions) must say this. */
  suggestion?: RegExp
}

const dir = mkdtempSync(join(tmpdir(), 'pdchaos-bad-input-'))
const at = (name: string): string => join(dir, name)
const servers: Server[] = []
const sockets = new Set<Socket>()
let deadPorts: number[] = []
let hangPort = 0

async function freePort(): Promise<number> {
  const s = createServer()
  await new Promise<void>(resolve => s.listen(0, '127.0.0.1', resolve))
  const port = (s.address() as {port: number}).port
  await new Promise<void>(resolve => s.close(() => resolve()))
  return port
}

function deployment(
  o: {ports?: number[]; watchdog?: string; extra?: string; prefillUrl?: string; metricsUrl?: string} = {},
): string {
  const [p, d, r] = o.ports ?? deadPorts
  return [
    'host: {kind: local}',
    `stateDir: ${at('host-state')}`,
    'services:',
    `  prefill: {url: "${o.prefillUrl ?? `http://127.0.0.1:${p}`}"}`,
    `  decode: {url: "http://127.0.0.1:${d}"}`,
    `  router: {url: "http://127.0.0.1:${r}"${o.metricsUrl ? `, metricsUrl: "${o.metricsUrl}"` : ''}}`,
    `watchdog: ${o.watchdog ?? '{deadlineSeconds: 2, pollSeconds: 0.5}'}`,
    'probeTimeoutSeconds: 0.5',
    o.extra ?? '',
  ].join('\n')
}

/** Deployment files with one thing wrong each (or nothing: good.yaml, hang.yaml), written once the ports are known. */
function writeFixtures(): void {
  const files: Record<string, string> = {
    'good.yaml': deployment(),
    'hang.yaml': deployment({ports: [hangPort, hangPort, hangPort]}),
    'poll-over-deadline.yaml': deployment({watchdog: '{deadlineSeconds: 2, pollSeconds: 5}'}),
    'deadline-huge.yaml': deployment({watchdog: '{deadlineSeconds: 86400, pollSeconds: 1}'}),
    'deadline-zero.yaml': deployment({watchdog: '{deadlineSeconds: 0, pollSeconds: 0.5}'}),
    'poll-negative.yaml': deployment({watchdog: '{deadlineSeconds: 2, pollSeconds: -1}'}),
    'poll-huge.yaml': deployment({watchdog: '{deadlineSeconds: 1000, pollSeconds: 900}'}),
    'scope-bogus.yaml': deployment({watchdog: '{scope: sometimes, deadlineSeconds: 2, pollSeconds: 0.5}'}),
    'url-ftp.yaml': deployment({prefillUrl: 'ftp://127.0.0.1:21'}),
    'url-file.yaml': deployment({prefillUrl: 'file:///etc/passwd'}),
    'url-javascript.yaml': deployment({prefillUrl: 'javascript:alert(1)'}),
    'url-port0.yaml': deployment({prefillUrl: 'http://127.0.0.1:0'}),
    'url-port-huge.yaml': deployment({prefillUrl: 'http://127.0.0.1:70000'}),
    'url-not-a-url.yaml': deployment({prefillUrl: 'not a url'}),
    'metrics-ftp.yaml': deployment({metricsUrl: 'ftp://127.0.0.1:9'}),
    'probe-timeout-zero.yaml': deployment({extra: 'probeTimeoutSeconds: 0'}).replace('probeTimeoutSeconds: 0.5\n', ''),
    'probe-timeout-huge.yaml': deployment({extra: 'probeTimeoutSeconds: 100000'}).replace(
      'probeTimeoutSeconds: 0.5\n',
      '',
    ),
    'unknown-key.yaml': deployment({extra: 'colour: blue'}),
    'version-2.yaml': deployment({extra: 'version: 2'}),
    'sudo-bogus.yaml': deployment({extra: 'sudo: always'}),
    'backend-bogus.yaml': deployment({extra: 'backend: rdma'}),
    'statedir-relative.yaml': deployment().replace(/^stateDir: .*$/m, 'stateDir: relative/dir'),
    'host-kind.yaml': deployment().replace('host: {kind: local}', 'host: {kind: telnet}'),
    'ssh-no-host.yaml': deployment().replace('host: {kind: local}', 'host: {kind: ssh}'),
    'ssh-port0.yaml': deployment().replace('host: {kind: local}', 'host: {kind: ssh, hostname: 127.0.0.1, port: 0}'),
    'ssh-fingerprint.yaml': deployment().replace(
      'host: {kind: local}',
      'host: {kind: ssh, hostname: 127.0.0.1, fingerprint: MD5:aa}',
    ),
    'bootstrap-port0.yaml': deployment().replace(
      /prefill: \{url: "([^"]+)"\}/,
      'prefill: {url: "$1", bootstrapPort: 0}',
    ),
    'health-path.yaml': deployment().replace(/decode: \{url: "([^"]+)"\}/, 'decode: {url: "$1", healthPath: health}'),
    'restart-string.yaml': deployment().replace(
      /decode: \{url: "([^"]+)"\}/,
      'decode: {url: "$1", restart: "systemctl restart x"}',
    ),
    'no-services.yaml': 'host: {kind: local}\nwatchdog: {deadlineSeconds: 2, pollSeconds: 0.5}\n',
    'no-watchdog.yaml': deployment().replace(/^watchdog: .*$/m, ''),
    'syntax.yaml': 'host: {kind: local\nservices: [\n',
    'duplicate-key.yaml': deployment() + '\nhost: {kind: local}\n',
    'empty.yaml': '# nothing here\n',
    'alias-dangling.yaml': 'host: *nowhere\n',
    'alias-bomb.yaml': aliasBomb(),
    'labels-20k.yaml': deployment({
      extra: 'labels:\n' + Array.from({length: 20_000}, (_, i) => `  k${i}: v`).join('\n'),
    }),
    'a-file': 'not a directory\n',
    // Suite files.
    'suite-good.yaml': 'scenarios:\n  - {name: one, fault: drop-dest-info, params: {rank: 0}}\n',
    'suite-param-other-fault.yaml': 'scenarios:\n  - {name: one, fault: stall-kv, params: {gpu: 1, rank: 2}}\n',
    'suite-param-unknown.yaml': 'scenarios:\n  - {name: one, fault: drop-dest-info, params: {colour: blue}}\n',
    'suite-param-bounds.yaml': 'scenarios:\n  - {name: one, fault: stall-kv, params: {gpu: 99999999}}\n',
    'suite-widen.yaml': 'scenarios:\n  - {name: one, fault: drop-dest-info, params: {widenKBytesPerSecond: 5}}\n',
    'suite-unknown-fault.yaml': 'scenarios:\n  - {name: one, fault: melt-gpu}\n',
    'suite-both.yaml': 'scenarios:\n  - {name: one, fault: drop-dest-info, restart: {}}\n',
    'suite-neither.yaml': 'scenarios:\n  - {name: one}\n',
    'suite-dup-names.yaml':
      'scenarios:\n  - {name: one, fault: drop-dest-info}\n  - {name: one, fault: drop-dest-info}\n',
    'suite-pins0.yaml': 'scenarios:\n  - {name: one, fault: drop-dest-info, pins: 0}\n',
    'suite-empty-list.yaml': 'scenarios: []\n',
    'suite-load-interval.yaml':
      'scenarios:\n  - {name: one, fault: drop-dest-info}\nload: {intervalMs: 999999999999}\n',
    'suite-gate-check.yaml': 'scenarios:\n  - {name: one, fault: drop-dest-info}\ngate: {requiredChecks: [vibes]}\n',
    'suite-name-chars.yaml': 'scenarios:\n  - {name: "a;rm -rf /", fault: drop-dest-info}\n',
    // Issue 28 (items 4, 5): confusable labels and values out of range.
    'label-zwsp.yaml': deployment({extra: 'labels: {environment: "production\\u200b"}'}),
    'label-fullwidth.yaml': deployment({
      extra: 'labels: {environment: "\uff50\uff52\uff4f\uff44\uff55\uff43\uff54\uff49\uff4f\uff4e"}',
    }),
    'label-key-confusable.yaml': deployment({extra: 'labels: {" Environment\\u2060": "\\u00adPRODUCTION "}'}),
    'poll-1e-300.yaml': deployment({watchdog: '{deadlineSeconds: 2, pollSeconds: 1e-300}'}),
    'deadline-1e-300.yaml': deployment({watchdog: '{deadlineSeconds: 1e-300, pollSeconds: 1e-300}'}),
    'poll-5ms.yaml': deployment({watchdog: '{deadlineSeconds: 2, pollSeconds: 0.005}'}),
    'probe-timeout-1e-300.yaml': deployment({extra: 'probeTimeoutSeconds: 1e-300'}).replace(
      'probeTimeoutSeconds: 0.5\n',
      '',
    ),
    'suite-trailing-space.yaml':
      'scenarios:\n  - {name: one, fault: drop-dest-info}\n  - {name: "one ", fault: drop-dest-info}\n',
    'suite-double-space.yaml':
      'scenarios:\n  - {name: "a b", fault: drop-dest-info}\n  - {name: "a  b", fault: drop-dest-info}\n',
    // Hostile YAML within the 256 KiB cap: over 4 KiB it parses in a worker (src/deployment/yaml-file.ts).
    'hostile-errors.yaml': 'host: {kind: local}\nservices:\n' + '\t- ]\n'.repeat(10_000),
    'hostile-deep.yaml': `services: ${'['.repeat(20_000)}${']'.repeat(20_000)}\n`,
    'suite-hostile-keys.yaml': Array.from({length: 5000}, (_, i) => `k${i}: 1`).join('\n') + '\n',
    'suite-too-many.yaml':
      'scenarios:\n' +
      Array.from({length: 11}, (_, i) => `  - {name: s${i}, fault: drop-dest-info, repetitions: 100}`).join('\n') +
      '\n',
  }
  for (const [name, text] of Object.entries(files)) writeFileSync(at(name), text)
  // 8 MB and 400k keys: refused at the 256 KiB cap before any parsing.
  writeFileSync(
    at('huge-8mb.yaml'),
    'labels:\n' + Array.from({length: 400_000}, (_, i) => `  key${i}: value${i}`).join('\n') + '\n',
  )
  mkdirSync(at('a-dir'), {recursive: true})
  mkdirSync(at('empty-state'), {recursive: true})
  writeNotFiles()
}

/**
 * Issue 28: paths that are not regular files, for inputs and outputs alike. Private nodes only, made here: a
 * character device with /dev/full's numbers (1,7), one with /dev/zero's (1,5), a FIFO, a socket and links; no
 * test ever names a node of the system's /dev. Their type and device numbers are checked again after the table ran.
 */
const NODES: Record<string, {type: 'char' | 'fifo' | 'socket'; rdev?: number}> = {}
function writeNotFiles(): void {
  execFileSync('mknod', [at('dev-full'), 'c', '1', '7'])
  execFileSync('mknod', [at('dev-zero'), 'c', '1', '5'])
  execFileSync('mkfifo', [at('fifo')])
  for (const n of ['dev-full', 'dev-zero']) NODES[n] = {type: 'char', rdev: lstatSync(at(n)).rdev}
  NODES.fifo = {type: 'fifo'}
  symlinkSync(at('dev-full'), at('link-to-dev-full'))
  symlinkSync(at('nowhere'), at('link-to-nothing'))
  const sshWith = (extra: string) =>
    deployment().replace(
      'host: {kind: local}',
      `host: {kind: ssh, hostname: 127.0.0.1, port: ${deadPorts[0]}, user: root, ${extra}}`,
    )
  const files: Record<string, string> = {
    'ssh-identity-fifo.yaml': sshWith(`identityFile: ${at('fifo')}`),
    'ssh-identity-zero.yaml': sshWith(`identityFile: ${at('dev-zero')}`),
    'ssh-known-hosts-dir.yaml': sshWith(`identityFile: ${at('good.yaml')}, knownHosts: ${at('a-dir')}`),
    'ssh-known-hosts-under-file.yaml': sshWith(
      `identityFile: ${at('good.yaml')}, knownHosts: ${at('a-file')}/known_hosts`,
    ),
    'ssh-known-hosts-fifo.yaml': sshWith(`identityFile: ${at('good.yaml')}, knownHosts: ${at('fifo')}`),
    'fleet-fifo-member.yaml': `deployments:\n  - {name: one, deployment: fifo}\n`,
    'fleet-device-member.yaml': `deployments:\n  - {name: one, deployment: dev-zero}\n`,
    'ssh-known-hosts-device.yaml': sshWith(`identityFile: ${at('good.yaml')}, knownHosts: ${at('dev-zero')}`),
    'journal-time-out-of-range.json': JSON.stringify({
      pdchaos: 1,
      command: 'inject',
      startedAt: 1e300,
      finishedAt: 1e300,
      error: {code: 'E_UNREACHABLE', exitCode: 5, message: 'down'},
    }),
  }
  for (const [name, text] of Object.entries(files)) writeFileSync(at(name), text)
  // Latin-1 bytes (é as 0xe9) in a label and in a scenario name: refused, never turned into U+FFFD.
  writeFileSync(
    at('latin1.yaml'),
    Buffer.concat([Buffer.from(deployment({extra: 'labels: {team: caf'})), Buffer.from([0xe9]), Buffer.from('}\n')]),
  )
  writeFileSync(
    at('suite-latin1.yaml'),
    Buffer.concat([
      Buffer.from('scenarios:\n  - {name: caf'),
      Buffer.from([0xe9]),
      Buffer.from(', fault: drop-dest-info}\n'),
    ]),
  )
}

/** Every private node is still what it was made as: no run replaced, wrote or removed one. */
function assertNodesUnchanged(): void {
  for (const [name, want] of Object.entries(NODES)) {
    const s = lstatSync(at(name))
    const type = s.isCharacterDevice()
      ? 'char'
      : s.isFIFO()
        ? 'fifo'
        : s.isSocket()
          ? 'socket'
          : s.isFile()
            ? 'file'
            : 'other'
    expect(type, `${name} is still a ${want.type}`).toBe(want.type)
    if (want.rdev !== undefined) expect(s.rdev, `${name} keeps its device numbers`).toBe(want.rdev)
  }
  expect(lstatSync(at('link-to-dev-full')).isSymbolicLink()).toBe(true)
}

/** Nine levels of nine aliases each: 9^9 nodes if expanded. */
function aliasBomb(): string {
  const lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
  for (let i = 1; i <= 9; i++) lines.push(`a${i}: &a${i} [${Array.from({length: 9}, () => `*a${i - 1}`).join(',')}]`)
  return lines.join('\n') + '\n'
}

const c = (f: string): string[] => ['-c', `{dir}/${f}`]
const DEAD = /127\.0\.0\.1:\d+\/health refused the connection/

const CASES: Case[] = [
  // The deployment file: read, parse, validate (exit 2 naming the file and the path), before anything is reached.
  {
    name: '8 MB deployment file with 400k keys',
    args: ['status', ...c('huge-8mb.yaml')],
    exit: 2,
    cause: /huge-8mb\.yaml is larger than 256 KiB/,
    withinMs: 45_000,
  },
  {
    name: '20k label keys (linear duplicate-key check)',
    args: ['inject', 'drop-dest-info', '--dry-run', ...c('labels-20k.yaml')],
    exit: 5,
    cause: DEAD,
  },
  {
    name: 'YAML alias bomb',
    args: ['status', ...c('alias-bomb.yaml')],
    exit: 2,
    cause: /alias-bomb\.yaml: YAML cannot be resolved/,
  },
  {name: 'dangling alias', args: ['status', ...c('alias-dangling.yaml')], exit: 2, cause: /alias-dangling\.yaml/},
  {
    name: 'YAML syntax error',
    args: ['status', ...c('syntax.yaml')],
    exit: 2,
    cause: /syntax\.yaml:\d+:\d+: YAML syntax error/,
  },
  {
    name: 'duplicate key',
    args: ['status', ...c('duplicate-key.yaml')],
    exit: 2,
    cause: /duplicate-key\.yaml:\d+:\d+: YAML syntax error: .*unique/i,
  },
  {name: 'empty deployment file', args: ['status', ...c('empty.yaml')], exit: 2, cause: /empty\.yaml is empty/},
  {
    name: 'missing deployment file',
    args: ['status', ...c('nope.yaml')],
    exit: 2,
    cause: /no deployment file at .*nope\.yaml/,
  },
  {name: 'a directory as the deployment file', args: ['status', ...c('a-dir')], exit: 2, cause: /a-dir is a directory/},
  {
    name: 'poll longer than the deadline',
    args: ['status', ...c('poll-over-deadline.yaml')],
    exit: 2,
    cause: /pollSeconds \(5\) is longer than watchdog\.deadlineSeconds \(2\)/,
  },
  {
    name: 'deadline beyond what a lease covers',
    args: ['status', ...c('deadline-huge.yaml')],
    exit: 2,
    cause: /watchdog\.deadlineSeconds/,
  },
  {name: 'deadline 0', args: ['status', ...c('deadline-zero.yaml')], exit: 2, cause: /watchdog\.deadlineSeconds/},
  {name: 'negative poll', args: ['status', ...c('poll-negative.yaml')], exit: 2, cause: /watchdog\.pollSeconds/},
  {name: 'poll above its maximum', args: ['status', ...c('poll-huge.yaml')], exit: 2, cause: /watchdog\.pollSeconds/},
  {name: 'unknown watchdog scope', args: ['status', ...c('scope-bogus.yaml')], exit: 2, cause: /watchdog\.scope/},
  {
    name: 'service URL ftp://',
    args: ['status', ...c('url-ftp.yaml')],
    exit: 2,
    cause: /services\.prefill\.url: url must be an http:\/\/ or https:\/\/ URL/,
  },
  {
    name: 'service URL file:///etc/passwd',
    args: ['status', ...c('url-file.yaml')],
    exit: 2,
    cause: /services\.prefill\.url: url must be an http/,
  },
  {
    name: 'service URL javascript:',
    args: ['status', ...c('url-javascript.yaml')],
    exit: 2,
    cause: /services\.prefill\.url: url must be an http/,
  },
  {
    name: 'service URL with port 0',
    args: ['status', ...c('url-port0.yaml')],
    exit: 2,
    cause: /services\.prefill\.url: url must have a port from 1 to 65535/,
  },
  {
    name: 'service URL with port 70000',
    args: ['status', ...c('url-port-huge.yaml')],
    exit: 2,
    cause: /services\.prefill\.url/,
  },
  {
    name: 'service URL that is not a URL',
    args: ['status', ...c('url-not-a-url.yaml')],
    exit: 2,
    cause: /services\.prefill\.url/,
  },
  {
    name: 'router metricsUrl ftp://',
    args: ['status', ...c('metrics-ftp.yaml')],
    exit: 2,
    cause: /services\.router\.metricsUrl: metricsUrl must be an http/,
  },
  {
    name: 'probeTimeoutSeconds 0',
    args: ['status', ...c('probe-timeout-zero.yaml')],
    exit: 2,
    cause: /probeTimeoutSeconds/,
  },
  {
    name: 'probeTimeoutSeconds unbounded',
    args: ['status', ...c('probe-timeout-huge.yaml')],
    exit: 2,
    cause: /probeTimeoutSeconds/,
  },
  {name: 'unknown top-level key', args: ['status', ...c('unknown-key.yaml')], exit: 2, cause: /colour/},
  {name: 'version 2', args: ['status', ...c('version-2.yaml')], exit: 2, cause: /version/},
  {name: 'unknown sudo policy', args: ['status', ...c('sudo-bogus.yaml')], exit: 2, cause: /sudo/},
  {name: 'unknown backend', args: ['status', ...c('backend-bogus.yaml')], exit: 2, cause: /backend/},
  {name: 'relative stateDir', args: ['status', ...c('statedir-relative.yaml')], exit: 2, cause: /stateDir/},
  {name: 'unknown host kind', args: ['status', ...c('host-kind.yaml')], exit: 2, cause: /host/},
  {
    name: 'ssh host without a hostname',
    args: ['status', ...c('ssh-no-host.yaml')],
    exit: 2,
    cause: /an ssh host needs alias or hostname/,
  },
  {name: 'ssh port 0', args: ['status', ...c('ssh-port0.yaml')], exit: 2, cause: /host\.port/},
  {name: 'malformed fingerprint', args: ['status', ...c('ssh-fingerprint.yaml')], exit: 2, cause: /host\.fingerprint/},
  {
    name: 'bootstrapPort 0',
    args: ['status', ...c('bootstrap-port0.yaml')],
    exit: 2,
    cause: /services\.prefill\.bootstrapPort/,
  },
  {
    name: 'healthPath without a slash',
    args: ['status', ...c('health-path.yaml')],
    exit: 2,
    cause: /services\.decode\.healthPath/,
  },
  {
    name: 'restart command as a string',
    args: ['status', ...c('restart-string.yaml')],
    exit: 2,
    cause: /services\.decode\.restart/,
  },
  {name: 'no services', args: ['status', ...c('no-services.yaml')], exit: 2, cause: /services/},
  {name: 'no watchdog', args: ['status', ...c('no-watchdog.yaml')], exit: 2, cause: /watchdog/},

  // Dead and hung targets: exit 5 naming what did not answer, within the deployment's probe timeout.
  {
    name: 'inject --dry-run against a dead target',
    args: ['inject', 'drop-dest-info', '--dry-run', ...c('good.yaml')],
    exit: 5,
    cause: DEAD,
  },
  {name: 'inject against a dead target', args: ['inject', 'drop-dest-info', ...c('good.yaml')], exit: 5, cause: DEAD},
  {
    name: 'inject stall-kv against a dead target',
    args: ['inject', 'stall-kv', '--gpu', '1', ...c('good.yaml')],
    exit: 5,
    cause: DEAD,
  },
  {
    name: 'inject --hold against a dead target',
    args: ['inject', 'drop-dest-info', '--hold', ...c('good.yaml')],
    exit: 5,
    cause: DEAD,
  },
  {
    name: 'inject when HTTP accepts but never answers',
    args: ['inject', 'drop-dest-info', ...c('hang.yaml')],
    exit: 5,
    cause: /prefill at http:\/\/127\.0\.0\.1:\d+\/health did not answer within 0\.5 s/,
    withinMs: 45_000,
  },
  {
    name: 'inject --dry-run when HTTP never answers',
    args: ['inject', 'drop-dest-info', '--dry-run', ...c('hang.yaml')],
    exit: 5,
    cause: /did not answer within 0\.5 s/,
    withinMs: 45_000,
  },
  {name: 'suite against a dead target', args: ['suite', ...c('good.yaml')], exit: 5, cause: DEAD},
  {
    name: 'suite file against a dead target',
    args: ['suite', '{dir}/suite-good.yaml', ...c('good.yaml')],
    exit: 5,
    cause: DEAD,
  },
  {name: 'suite --gate against a dead target', args: ['suite', '--gate', ...c('good.yaml')], exit: 5, cause: DEAD},
  {
    name: 'suite when HTTP never answers',
    args: ['suite', ...c('hang.yaml')],
    exit: 5,
    cause: /did not answer within 0\.5 s/,
    withinMs: 45_000,
  },

  // inject's flags.
  {name: 'inject without a fault', args: ['inject', ...c('good.yaml')], exit: 2, cause: /Missing 1 required arg/},
  {
    name: 'inject a vLLM-only fault into an SGLang deployment',
    args: ['inject', 'kill-decode', '--dry-run', ...c('good.yaml')],
    exit: 2,
    cause: /kill-decode is a vLLM fault, and this target is an SGLang deployment/,
    suggestion: /engine: vllm/,
  },
  {
    name: 'inject an unknown fault',
    args: ['inject', 'melt-gpu', ...c('good.yaml')],
    exit: 2,
    cause: /Expected melt-gpu to be one of/,
  },
  {name: 'stall-kv without --gpu', args: ['inject', 'stall-kv', ...c('good.yaml')], exit: 2, cause: /stall-kv.*gpu/},
  {
    name: 'stall-kv --gpu 99999999',
    args: ['inject', 'stall-kv', '--gpu', '99999999', ...c('good.yaml')],
    exit: 2,
    cause: /stall-kv: --gpu must be an integer from 0 to 1023/,
  },
  {
    name: 'stall-kv --gpu -1',
    args: ['inject', 'stall-kv', '--gpu=-1', ...c('good.yaml')],
    exit: 2,
    cause: /--gpu must be an integer from 0 to 1023/,
  },
  {
    name: 'stall-kv --gpu abc',
    args: ['inject', 'stall-kv', '--gpu', 'abc', ...c('good.yaml')],
    exit: 2,
    cause: /--gpu must be an integer/,
  },
  {
    name: 'stall-kv --gpu 1.5',
    args: ['inject', 'stall-kv', '--gpu', '1.5', ...c('good.yaml')],
    exit: 2,
    cause: /--gpu must be an integer/,
  },
  {
    name: 'stall-kv --rank',
    args: ['inject', 'stall-kv', '--gpu', '1', '--rank', '2', ...c('good.yaml')],
    exit: 2,
    cause: /stall-kv takes no --rank/,
  },
  {
    name: 'stall-kv --side (no sigstop any more)',
    args: ['inject', 'stall-kv', '--gpu', '1', '--side', 'decode', ...c('good.yaml')],
    exit: 2,
    cause: /stall-kv takes no --side/,
  },
  {
    name: 'stall-kv --trials',
    args: ['inject', 'stall-kv', '--gpu', '1', '--trials', '3', ...c('good.yaml')],
    exit: 2,
    cause: /stall-kv takes no --trials/,
  },
  {
    name: 'drop-dest-info --trials',
    args: ['inject', 'drop-dest-info', '--trials', '3', ...c('good.yaml')],
    exit: 2,
    cause: /drop-dest-info takes no --trials/,
  },
  {
    name: 'drop-dest-info --widen-kbytes',
    args: ['inject', 'drop-dest-info', '--widen-kbytes', '3', ...c('good.yaml')],
    exit: 2,
    cause: /drop-dest-info takes no --widen-kbytes/,
  },
  {
    name: 'drop-dest-info --gpu',
    args: ['inject', 'drop-dest-info', '--gpu', '1', ...c('good.yaml')],
    exit: 2,
    cause: /drop-dest-info takes no --gpu/,
  },
  {
    name: 'drop-dest-info --allow-link-down',
    args: ['inject', 'drop-dest-info', '--allow-link-down', ...c('good.yaml')],
    exit: 2,
    cause: /drop-dest-info takes no --allow-link-down/,
  },
  {
    name: 'drop-dest-info --rank 5000',
    args: ['inject', 'drop-dest-info', '--rank', '5000', ...c('good.yaml')],
    exit: 2,
    cause: /--rank must be an integer from 0 to 1023/,
  },
  {
    name: 'abort-mid-transfer --trials 0',
    args: ['inject', 'abort-mid-transfer', '--trials', '0', ...c('good.yaml')],
    exit: 2,
    cause: /--trials must be an integer from 1 to 200/,
  },
  {
    name: 'abort-mid-transfer --trials 100000',
    args: ['inject', 'abort-mid-transfer', '--trials', '100000', ...c('good.yaml')],
    exit: 2,
    cause: /--trials must be an integer from 1 to 200/,
  },
  {
    name: 'abort-mid-transfer --widen-kbytes unbounded',
    args: ['inject', 'abort-mid-transfer', '--widen-kbytes', '999999999999', ...c('good.yaml')],
    exit: 2,
    cause: /--widen-kbytes must be an integer from 0 to 10000000/,
  },
  {
    name: 'abort-mid-transfer --rank',
    args: ['inject', 'abort-mid-transfer', '--rank', '0', ...c('good.yaml')],
    exit: 2,
    cause: /abort-mid-transfer takes no --rank/,
  },
  {
    name: 'unknown --mechanism',
    args: ['inject', 'drop-dest-info', '--mechanism', 'voodoo', ...c('good.yaml')],
    exit: 2,
    cause: /--mechanism/,
  },
  {
    name: 'a mechanism of another fault',
    args: ['inject', 'drop-dest-info', '--mechanism', 'sigstop', ...c('good.yaml')],
    exit: 2,
    cause: /drop-dest-info: --mechanism must be one of/,
  },
  {
    name: '--hold --dry-run',
    args: ['inject', 'drop-dest-info', '--hold', '--dry-run', ...c('good.yaml')],
    exit: 2,
    cause:
      /--dry-run=true cannot also be provided when using --hold|--hold=true cannot also be provided when using --dry-run/,
  },
  {
    name: '--ttl 1 with deadline 2 s',
    args: ['inject', 'drop-dest-info', '--ttl', '1', ...c('good.yaml')],
    exit: 2,
    cause: /--ttl 1 is shorter than the run needs: 8 s \(watchdog deadline 2 s \+ poll 0\.5 s/,
  },
  {name: '--ttl 0', args: ['inject', 'drop-dest-info', '--ttl', '0', ...c('good.yaml')], exit: 2, cause: /--ttl/},
  {
    name: '--ttl beyond the lease cap',
    args: ['inject', 'drop-dest-info', '--ttl', '99999', ...c('good.yaml')],
    exit: 2,
    cause: /--ttl Expected an integer less than or equal to 3600/,
  },
  {
    name: '--load-interval 999999999999',
    args: ['inject', 'drop-dest-info', '--load-interval', '999999999999', ...c('good.yaml')],
    exit: 2,
    cause: /--load-interval Expected an integer less than or equal to 60000/,
  },
  {
    name: '--load-interval -1',
    args: ['inject', 'drop-dest-info', '--load-interval=-1', ...c('good.yaml')],
    exit: 2,
    cause: /--load-interval/,
  },
  {name: '--pins 0', args: ['inject', 'drop-dest-info', '--pins', '0', ...c('good.yaml')], exit: 2, cause: /--pins/},
  {
    name: '--pins 100000',
    args: ['inject', 'drop-dest-info', '--pins', '100000', ...c('good.yaml')],
    exit: 2,
    cause: /--pins/,
  },
  {
    name: '--pin-interval 99999999',
    args: ['inject', 'drop-dest-info', '--pin-interval', '99999999', ...c('good.yaml')],
    exit: 2,
    cause: /--pin-interval/,
  },
  {
    name: '--prompt-tokens 0',
    args: ['inject', 'drop-dest-info', '--prompt-tokens', '0', ...c('good.yaml')],
    exit: 2,
    cause: /--prompt-tokens/,
  },
  {
    name: '--canaries 1000',
    args: ['inject', 'drop-dest-info', '--canaries', '1000', ...c('good.yaml')],
    exit: 2,
    cause: /--canaries/,
  },
  {
    name: '--pin-path bogus',
    args: ['inject', 'drop-dest-info', '--pin-path', 'bogus', ...c('good.yaml')],
    exit: 2,
    cause: /--pin-path/,
  },
  {
    name: 'inject --journal under a regular file',
    args: ['inject', 'drop-dest-info', '--journal', '{dir}/a-file/j.json', ...c('good.yaml')],
    exit: 2,
    cause: /--journal .*a-file\/j\.json cannot be written: a part of its path is a file/,
  },
  {
    name: 'inject --journal /proc/nope/x',
    args: ['inject', 'drop-dest-info', '--journal', '/proc/nope/x', ...c('good.yaml')],
    exit: 2,
    cause: /--journal \/proc\/nope\/x cannot be written/,
    withinMs: 45_000,
  },
  {
    name: 'inject --journal a directory',
    args: ['inject', 'drop-dest-info', '--journal', '{dir}/a-dir', ...c('good.yaml')],
    exit: 2,
    cause: /--journal .*a-dir is a directory/,
  },
  {
    name: 'inject an unknown flag',
    args: ['inject', 'drop-dest-info', '--bogus', ...c('good.yaml')],
    exit: 2,
    cause: /Nonexistent flag: --bogus/,
  },
  {
    name: 'inject --state-dir without --sim',
    args: ['inject', 'drop-dest-info', '--state-dir', '{dir}/empty-state', ...c('good.yaml')],
    exit: 2,
    cause: /--state-dir applies only with --sim/,
  },

  // suite's file and outputs: checked before the run.
  {
    name: 'missing suite file',
    args: ['suite', '{dir}/nope-suite.yaml', ...c('good.yaml')],
    exit: 2,
    cause: /no suite file at/,
  },
  {
    name: 'suite params of another fault',
    args: ['suite', '{dir}/suite-param-other-fault.yaml', ...c('good.yaml')],
    exit: 2,
    cause: /scenarios\[0\]\.params\.rank: stall-kv takes no params\.rank/,
  },
  {
    name: 'suite params that no fault takes',
    args: ['suite', '{dir}/suite-param-unknown.yaml', ...c('good.yaml')],
    exit: 2,
    cause: /drop-dest-info takes no params\.colour/,
  },
  {
    name: 'suite params out of bounds',
    args: ['suite', '{dir}/suite-param-bounds.yaml', ...c('good.yaml')],
    exit: 2,
    cause: /params\.gpu must be an integer from 0 to 1023/,
  },
  {
    name: 'suite widen param on drop-dest-info',
    args: ['suite', '{dir}/suite-widen.yaml', ...c('good.yaml')],
    exit: 2,
    cause: /drop-dest-info takes no params\.widenKBytesPerSecond/,
  },
  {
    name: 'suite unknown fault',
    args: ['suite', '{dir}/suite-unknown-fault.yaml', ...c('good.yaml')],
    exit: 2,
    cause: /scenarios\[0\]\.fault/,
  },
  {
    name: 'suite scenario with fault and restart',
    args: ['suite', '{dir}/suite-both.yaml', ...c('good.yaml')],
    exit: 2,
    cause: /exactly one of fault or restart/,
  },
  {
    name: 'suite scenario with neither',
    args: ['suite', '{dir}/suite-neither.yaml', ...c('good.yaml')],
    exit: 2,
    cause: /exactly one of fault or restart/,
  },
  {
    name: 'suite duplicate scenario names',
    args: ['suite', '{dir}/suite-dup-names.yaml', ...c('good.yaml')],
    exit: 2,
    cause: /duplicate scenario name "one"/,
  },
  {
    name: 'suite pins 0',
    args: ['suite', '{dir}/suite-pins0.yaml', ...c('good.yaml')],
    exit: 2,
    cause: /scenarios\[0\]\.pins/,
  },
  {
    name: 'suite with no scenarios',
    args: ['suite', '{dir}/suite-empty-list.yaml', ...c('good.yaml')],
    exit: 2,
    cause: /scenarios/,
  },
  {
    name: 'suite load interval unbounded',
    args: ['suite', '{dir}/suite-load-interval.yaml', ...c('good.yaml')],
    exit: 2,
    cause: /load\.intervalMs/,
  },
  {
    name: 'suite gate with an unknown check',
    args: ['suite', '{dir}/suite-gate-check.yaml', ...c('good.yaml')],
    exit: 2,
    cause: /gate\.requiredChecks/,
  },
  {
    name: 'suite scenario name with shell characters',
    args: ['suite', '{dir}/suite-name-chars.yaml', ...c('good.yaml')],
    exit: 2,
    cause: /scenarios\[0\]\.name/,
  },
  {
    name: 'suite 8 MB file',
    args: ['suite', '{dir}/huge-8mb.yaml', ...c('good.yaml')],
    exit: 2,
    cause: /huge-8mb\.yaml is larger than 256 KiB/,
  },
  {
    name: 'suite file alias bomb',
    args: ['suite', '{dir}/alias-bomb.yaml', ...c('good.yaml')],
    exit: 2,
    cause: /alias-bomb\.yaml: YAML cannot be resolved/,
  },
  {
    name: 'suite --junit under a regular file',
    args: ['suite', '--junit', '{dir}/a-file/junit.xml', ...c('good.yaml')],
    exit: 2,
    cause: /--junit .*a-file\/junit\.xml cannot be written: a part of its path is a file/,
  },
  {
    name: 'suite --junit /proc/nope/x',
    args: ['suite', '--junit', '/proc/nope/x', ...c('good.yaml')],
    exit: 2,
    cause: /--junit \/proc\/nope\/x cannot be written/,
    withinMs: 45_000,
  },
  {
    name: 'suite --html a directory',
    args: ['suite', '--html', '{dir}/a-dir', ...c('good.yaml')],
    exit: 2,
    cause: /--html .*a-dir is a directory/,
  },
  {
    name: 'suite --journal under a regular file',
    args: ['suite', '--journal', '{dir}/a-file/run.json', ...c('good.yaml')],
    exit: 2,
    cause: /--journal .*cannot be written/,
  },
  {
    name: "suite --push 'not a url'",
    args: ['suite', '--push', 'not a url', ...c('good.yaml')],
    exit: 2,
    cause: /--push "not a url" is not a URL/,
  },
  {
    name: 'suite --push ftp://',
    args: ['suite', '--push', 'ftp://127.0.0.1:9091', ...c('good.yaml')],
    exit: 2,
    cause: /--push must be an http:\/\/ or https:\/\/ URL/,
  },
  {
    name: 'suite --push with a password is not echoed',
    args: ['suite', '--push', 'gopher://admin:S3cretToken@127.0.0.1:9091', ...c('good.yaml')],
    exit: 2,
    cause: /--push must be an http/,
  },
  {
    name: '--sim-deadline without --sim',
    args: ['suite', '--sim-deadline', '5', ...c('good.yaml')],
    exit: 2,
    cause: /--sim-deadline applies only with --sim/,
  },
  {
    name: '--sim-poll not a number',
    args: ['suite', '--sim', '--state-dir', '{dir}/empty-state', '--sim-poll', 'abc'],
    exit: 2,
    cause: /--sim-poll must be a number of seconds/,
  },
  {
    name: '--sim-poll longer than --sim-deadline',
    args: ['suite', '--sim', '--state-dir', '{dir}/empty-state', '--sim-deadline', '1', '--sim-poll', '5'],
    exit: 2,
    cause: /--sim-poll \(5 s\) is longer than --sim-deadline \(1 s\)/,
  },
  {
    name: 'suite --state-dir without --sim',
    args: ['suite', '--state-dir', '{dir}/empty-state', ...c('good.yaml')],
    exit: 2,
    cause: /--state-dir applies only with --sim/,
  },

  // status, restart, recover, schema.
  {
    name: 'status --state-dir without --sim',
    args: ['status', '--state-dir', '{dir}/empty-state', ...c('good.yaml')],
    exit: 2,
    cause: /--state-dir applies only with --sim/,
  },
  {name: 'status --timeout 0', args: ['status', '--timeout', '0', ...c('good.yaml')], exit: 2, cause: /--timeout/},
  {
    name: 'status --timeout abc',
    args: ['status', '--timeout', 'abc', ...c('good.yaml')],
    exit: 2,
    cause: /Parsing --timeout Expected an integer but received: abc/,
  },
  {
    name: 'status --timeout 100000',
    args: ['status', '--timeout', '100000', ...c('good.yaml')],
    exit: 2,
    cause: /--timeout/,
  },
  {
    name: 'status with an extra argument',
    args: ['status', 'extra', ...c('good.yaml')],
    exit: 2,
    cause: /command status:extra not found|Unexpected argument: extra/,
  },
  {
    name: 'restart --service bogus',
    args: ['restart', '--service', 'bogus', ...c('good.yaml')],
    exit: 2,
    cause: /--service/,
  },
  {
    name: 'restart --health-timeout 0',
    args: ['restart', '--health-timeout', '0', ...c('good.yaml')],
    exit: 2,
    cause: /--health-timeout/,
  },
  {
    name: 'restart --health-timeout unbounded',
    args: ['restart', '--health-timeout', '99999999', ...c('good.yaml')],
    exit: 2,
    cause: /--health-timeout/,
  },
  {
    name: 'restart --command-timeout unbounded',
    args: ['restart', '--command-timeout', '99999999', ...c('good.yaml')],
    exit: 2,
    cause: /--command-timeout/,
  },
  {
    name: 'restart --journal under a regular file',
    args: ['restart', '--journal', '{dir}/a-file/r.json', ...c('good.yaml')],
    exit: 2,
    cause: /--journal .*cannot be written/,
  },
  {
    name: 'recover --state-dir without --sim',
    args: ['recover', '--state-dir', '{dir}/empty-state', ...c('good.yaml')],
    exit: 2,
    cause: /--state-dir applies only with --sim/,
  },
  {
    name: 'recover with a bad deployment file',
    args: ['recover', ...c('url-ftp.yaml')],
    exit: 2,
    cause: /services\.prefill\.url/,
  },
  {
    name: 'schema of an unknown kind',
    args: ['schema', 'bogus'],
    exit: 2,
    cause: /Expected bogus to be one of: deployment, suite/,
  },

  // Before any command: unknown commands, flags before the command.
  {name: 'bogus-command', args: ['bogus-command'], exit: 2, cause: /command bogus-command not found/},
  {
    name: '--json status',
    args: ['--json', 'status'],
    exit: 2,
    cause: /--json comes before the command/,
    modes: ['json'],
  },
  {name: '--sim status', args: ['--sim', 'status'], exit: 2, cause: /--sim comes before the command/, modes: ['text']},
  {name: '-c FILE status', args: ['-c', '{dir}/good.yaml', 'status'], exit: 2, cause: /-c comes before the command/},
  {
    name: 'sim with an unknown subcommand',
    args: ['sim', 'explode'],
    exit: 2,
    cause: /command sim:explode not found|command sim explode not found/,
  },

  // The twin's commands: the state dir and the watchdog it would write.
  {
    name: 'sim status --state-dir FILE',
    args: ['sim', 'status', '--state-dir', '{dir}/a-file'],
    exit: 2,
    cause: /--state-dir .*a-file is not a directory/,
  },
  {
    name: 'sim down --state-dir FILE',
    args: ['sim', 'down', '--state-dir', '{dir}/a-file'],
    exit: 2,
    cause: /--state-dir .*a-file is not a directory/,
  },
  {
    name: 'sim restart --state-dir FILE',
    args: ['sim', 'restart', 'prefill', '--state-dir', '{dir}/a-file'],
    exit: 2,
    cause: /--state-dir .*a-file is not a directory/,
  },
  {
    name: 'sim restart an unknown service',
    args: ['sim', 'restart', 'gpu', '--state-dir', '{dir}/empty-state'],
    exit: 2,
    cause: /Expected gpu to be one of/,
  },
  {
    name: 'sim up --state-dir FILE',
    args: ['sim', 'up', '--state-dir', '{dir}/a-file'],
    exit: 2,
    cause: /--state-dir .*a-file is not a directory/,
  },
  {
    name: 'sim up --deadline beyond a lease',
    args: ['sim', 'up', '--state-dir', '{dir}/twin-a', '--deadline', '99999'],
    exit: 2,
    cause: /--deadline must be at most 1200 seconds/,
  },
  {
    name: 'sim up --poll over --deadline',
    args: ['sim', 'up', '--state-dir', '{dir}/twin-b', '--deadline', '2', '--poll', '5'],
    exit: 2,
    cause: /--poll \(5 s\) is longer than --deadline \(2 s\)/,
  },
  {
    name: 'sim up --deadline abc',
    args: ['sim', 'up', '--state-dir', '{dir}/twin-c', '--deadline', 'abc'],
    exit: 2,
    cause: /--deadline must be a number of seconds/,
  },
  {
    name: 'sim up --gpus 0',
    args: ['sim', 'up', '--state-dir', '{dir}/twin-d', '--gpus', '0'],
    exit: 2,
    cause: /--gpus must be an integer from 2 to 64/,
  },
  {
    name: 'sim up TP sizes beyond the GPUs',
    args: ['sim', 'up', '--state-dir', '{dir}/twin-e', '--prefill-tp', '8', '--decode-tp', '8'],
    exit: 2,
    cause: /needs 16 GPUs but --gpus is 8/,
  },
  {
    name: 'sim up --bug unknown',
    args: ['sim', 'up', '--state-dir', '{dir}/twin-f', '--bug', 'gremlins'],
    exit: 2,
    cause: /--bug/,
  },
  {
    name: 'sim up --host not an address',
    args: ['sim', 'up', '--state-dir', '{dir}/twin-g', '--host', 'example.com'],
    exit: 2,
    cause: /--host must be an IP address/,
  },
  {
    name: 'sim up --heartbeat-interval 1',
    args: ['sim', 'up', '--state-dir', '{dir}/twin-h', '--heartbeat-interval', '1'],
    exit: 2,
    cause: /--heartbeat-interval must be at least 2 seconds/,
  },
  {
    name: 'sim up --base-port 70000',
    args: ['sim', 'up', '--state-dir', '{dir}/twin-i', '--base-port', '70000'],
    exit: 2,
    cause: /--base-port must be an integer/,
  },

  // Issue 28, inputs that are not files: every file pdchaos reads is a regular file of bounded size, opened without
  // blocking, or exit 2 naming it (within seconds: a FIFO once hung each of these until killed).
  {
    name: 'a FIFO as the deployment file',
    args: ['status', ...c('fifo')],
    exit: 2,
    cause: /fifo is a FIFO \(named pipe\), not a deployment file/,
    withinMs: 30_000,
  },
  {
    name: 'a character device (as /dev/zero) as the deployment file',
    args: ['status', ...c('dev-zero')],
    exit: 2,
    cause: /dev-zero is a character device, not a deployment file/,
    withinMs: 30_000,
  },
  {
    name: 'a FIFO as the suite file',
    args: ['suite', '{dir}/fifo', ...c('good.yaml')],
    exit: 2,
    cause: /fifo is a FIFO \(named pipe\), not a suite file/,
    withinMs: 30_000,
  },
  {
    name: 'a FIFO as the fleet file',
    args: ['suite', '--fleet', '{dir}/fifo'],
    exit: 2,
    cause: /fifo is a FIFO \(named pipe\), not a fleet file/,
    withinMs: 30_000,
  },
  {
    name: "a FIFO as a fleet entry's deployment file",
    args: ['suite', '--fleet', '{dir}/fleet-fifo-member.yaml'],
    exit: 2,
    cause: /fifo is a FIFO \(named pipe\), not a deployment file/,
    withinMs: 30_000,
  },
  {
    name: 'a FIFO as a journal to report',
    args: ['report', '{dir}/fifo'],
    exit: 2,
    cause: /fifo is a FIFO \(named pipe\), not a journal/,
    withinMs: 30_000,
  },
  {
    name: 'a character device as a journal to report',
    args: ['report', '{dir}/dev-zero'],
    exit: 2,
    cause: /dev-zero is a character device, not a journal/,
    withinMs: 30_000,
  },
  {
    name: 'a directory as a journal to report',
    args: ['report', '{dir}/a-dir'],
    exit: 2,
    cause: /a-dir is a directory, not a journal/,
  },
  {
    name: 'ssh identityFile a FIFO',
    args: ['status', ...c('ssh-identity-fifo.yaml')],
    exit: 2,
    cause: /fifo is a FIFO \(named pipe\), not a private key file/,
    withinMs: 30_000,
  },
  {
    name: 'ssh identityFile a character device (as /dev/zero)',
    args: ['status', ...c('ssh-identity-zero.yaml')],
    exit: 2,
    cause: /dev-zero is a character device, not a private key file/,
    withinMs: 30_000,
  },
  {
    name: 'ssh knownHosts a directory',
    args: ['status', ...c('ssh-known-hosts-dir.yaml')],
    exit: 2,
    cause: /a-dir is a directory, not a known_hosts file/,
  },
  {
    name: 'ssh knownHosts under a regular file',
    args: ['status', ...c('ssh-known-hosts-under-file.yaml')],
    exit: 2,
    cause: /known_hosts file .*a-file\/known_hosts: a part of its path is a file/,
  },
  {
    name: 'ssh knownHosts a FIFO',
    args: ['status', ...c('ssh-known-hosts-fifo.yaml')],
    exit: 2,
    cause: /fifo is a FIFO \(named pipe\), not a known_hosts file/,
    withinMs: 30_000,
  },
  {
    name: 'a character device (as /dev/zero) as the suite file',
    args: ['suite', '{dir}/dev-zero', ...c('good.yaml')],
    exit: 2,
    cause: /dev-zero is a character device, not a suite file/,
    withinMs: 30_000,
  },
  {
    name: 'a character device (as /dev/zero) as the fleet file',
    args: ['suite', '--fleet', '{dir}/dev-zero'],
    exit: 2,
    cause: /dev-zero is a character device, not a fleet file/,
    withinMs: 30_000,
  },
  {
    name: "a character device (as /dev/zero) as a fleet entry's deployment file",
    args: ['suite', '--fleet', '{dir}/fleet-device-member.yaml'],
    exit: 2,
    cause: /dev-zero is a character device, not a deployment file/,
    withinMs: 30_000,
  },
  {
    name: 'ssh knownHosts a character device (as /dev/zero)',
    args: ['status', ...c('ssh-known-hosts-device.yaml')],
    exit: 2,
    cause: /dev-zero is a character device, not a known_hosts file/,
    withinMs: 30_000,
  },
  {
    name: 'hostile YAML: 50 kB of lines that are each an error (parsed in a worker)',
    args: ['status', ...c('hostile-errors.yaml')],
    exit: 2,
    cause: /hostile-errors\.yaml:3:1: YAML syntax error: Tabs are not allowed as indentation/,
    withinMs: 45_000,
  },
  {
    name: 'hostile YAML: collections nested 20 000 deep',
    args: ['status', ...c('hostile-deep.yaml')],
    exit: 2,
    cause: /hostile-deep\.yaml:1:\d+: YAML syntax error: collections nested too deeply/,
    withinMs: 45_000,
  },
  {
    name: 'hostile YAML: a suite file of 5000 unknown keys (the message names the first, not all)',
    args: ['suite', '{dir}/suite-hostile-keys.yaml', ...c('good.yaml')],
    exit: 2,
    cause: /suite-hostile-keys\.yaml: \(top level\): Unrecognized keys: "k0", "k1", .{100,400}…; scenarios: /,
    withinMs: 45_000,
  },
  {
    name: 'a deployment file that is not UTF-8',
    args: ['status', ...c('latin1.yaml')],
    exit: 2,
    cause: /latin1\.yaml:\d+:\d+: not UTF-8 \(byte 0xe9/,
  },
  {
    name: 'a suite file that is not UTF-8',
    args: ['suite', '{dir}/suite-latin1.yaml', ...c('good.yaml')],
    exit: 2,
    cause: /suite-latin1\.yaml:2:\d+: not UTF-8 \(byte 0xe9/,
  },
  {
    name: 'a journal with a time out of range',
    args: ['report', '{dir}/journal-time-out-of-range.json'],
    exit: 2,
    cause: /journal-time-out-of-range\.json is not a pdchaos journal: startedAt: /,
  },

  // Issue 28, outputs that are not files: refused before the target is reached (exit 2, not the dead target's 5),
  // never opened, written or replaced (assertNodesUnchanged after the table).
  {
    name: 'inject --journal a character device (as /dev/full)',
    args: ['inject', 'drop-dest-info', '--journal', '{dir}/dev-full', ...c('good.yaml')],
    exit: 2,
    cause: /--journal .*dev-full is a character device, not a regular file/,
  },
  {
    name: 'inject --journal a FIFO',
    args: ['inject', 'drop-dest-info', '--journal', '{dir}/fifo', ...c('good.yaml')],
    exit: 2,
    cause: /--journal .*fifo is a FIFO \(named pipe\), not a regular file/,
    withinMs: 30_000,
  },
  {
    name: 'inject --journal a link to a character device',
    args: ['inject', 'drop-dest-info', '--journal', '{dir}/link-to-dev-full', ...c('good.yaml')],
    exit: 2,
    cause: /--journal .*link-to-dev-full is a character device/,
  },
  {
    name: 'inject --journal a link to nothing',
    args: ['inject', 'drop-dest-info', '--journal', '{dir}/link-to-nothing', ...c('good.yaml')],
    exit: 2,
    cause: /--journal .*link-to-nothing is a symbolic link to nothing/,
  },
  {
    name: 'suite --junit a character device',
    args: ['suite', '--junit', '{dir}/dev-full', ...c('good.yaml')],
    exit: 2,
    cause: /--junit .*dev-full is a character device, not a regular file/,
  },
  {
    name: 'suite --junit a FIFO',
    args: ['suite', '--junit', '{dir}/fifo', ...c('good.yaml')],
    exit: 2,
    cause: /--junit .*fifo is a FIFO/,
    withinMs: 30_000,
  },
  {
    name: 'suite --junit a socket',
    args: ['suite', '--junit', '{dir}/sock', ...c('good.yaml')],
    exit: 2,
    cause: /--junit .*sock is a socket, not a regular file/,
  },
  {
    name: 'suite --html a FIFO',
    args: ['suite', '--html', '{dir}/fifo', ...c('good.yaml')],
    exit: 2,
    cause: /--html .*fifo is a FIFO/,
    withinMs: 30_000,
  },
  {
    name: 'suite --html a character device',
    args: ['suite', '--html', '{dir}/dev-zero', ...c('good.yaml')],
    exit: 2,
    cause: /--html .*dev-zero is a character device/,
  },
  {
    name: 'suite --journal a character device',
    args: ['suite', '--journal', '{dir}/dev-full', ...c('good.yaml')],
    exit: 2,
    cause: /--journal .*dev-full is a character device/,
  },
  {
    name: 'suite --journal a socket',
    args: ['suite', '--journal', '{dir}/sock', ...c('good.yaml')],
    exit: 2,
    cause: /--journal .*sock is a socket, not a regular file/,
  },
  {
    name: 'suite --junit a directory',
    args: ['suite', '--junit', '{dir}/a-dir', ...c('good.yaml')],
    exit: 2,
    cause: /--junit .*a-dir is a directory/,
  },
  {
    name: 'suite --html a socket',
    args: ['suite', '--html', '{dir}/sock', ...c('good.yaml')],
    exit: 2,
    cause: /--html .*sock is a socket, not a regular file/,
  },
  {
    name: 'restart --journal a FIFO',
    args: ['restart', '--journal', '{dir}/fifo', ...c('good.yaml')],
    exit: 2,
    cause: /--journal .*fifo is a FIFO/,
    withinMs: 30_000,
  },
  {
    name: 'report --html a FIFO',
    args: ['report', '--html', '{dir}/fifo', '{dir}/journal-time-out-of-range.json'],
    exit: 2,
    cause: /--html .*fifo is a FIFO/,
    withinMs: 30_000,
  },
  {
    name: 'report --junit a character device',
    args: ['report', '--junit', '{dir}/dev-full', '{dir}/journal-time-out-of-range.json'],
    exit: 2,
    cause: /--junit .*dev-full is a character device/,
  },

  // Issue 28 (p28b): confusable labels, values out of range, and the low items (signals in each phase:
  // signal-phases.system.test.ts).
  {
    name: 'production label with a zero-width space after it',
    args: ['inject', 'drop-dest-info', ...c('label-zwsp.yaml')],
    exit: 2,
    cause: /labelled environment: production/,
  },
  {
    name: 'production label in full-width letters',
    args: ['suite', ...c('label-fullwidth.yaml')],
    exit: 2,
    cause: /labelled environment: production/,
  },
  {
    name: 'production label: key and value with invisible characters and case',
    args: ['restart', ...c('label-key-confusable.yaml')],
    exit: 2,
    cause: /labelled environment: production/,
  },
  {
    name: 'pollSeconds 1e-300',
    args: ['status', ...c('poll-1e-300.yaml')],
    exit: 2,
    cause: /watchdog\.pollSeconds: at least 0\.01 s/,
    suggestion: /./,
  },
  {
    name: 'deadlineSeconds 1e-300',
    args: ['status', ...c('deadline-1e-300.yaml')],
    exit: 2,
    cause: /watchdog\.deadlineSeconds: at least 0\.1 s/,
  },
  {
    name: 'pollSeconds 5 ms',
    args: ['inject', 'drop-dest-info', ...c('poll-5ms.yaml')],
    exit: 2,
    cause: /watchdog\.pollSeconds: at least 0\.01 s \(10 ms\)/,
  },
  {
    name: 'probeTimeoutSeconds 1e-300',
    args: ['status', ...c('probe-timeout-1e-300.yaml')],
    exit: 2,
    cause: /probeTimeoutSeconds: at least 0\.1 s/,
  },
  {
    name: 'sim up --poll 1e-300',
    args: ['sim', 'up', '--state-dir', '{dir}/twin-j', '--poll', '1e-300'],
    exit: 2,
    cause: /--poll must be at least 0\.01 seconds/,
    suggestion: /--poll 1/,
  },
  {
    name: 'sim up --deadline 1e-300',
    args: ['sim', 'up', '--state-dir', '{dir}/twin-k', '--deadline', '1e-300', '--poll', '1e-300'],
    exit: 2,
    cause: /--deadline must be at least 0\.1 seconds/,
  },
  {
    name: 'suite --sim-poll 1e-300',
    args: ['suite', '--sim', '--state-dir', '{dir}/empty-state', '--sim-poll', '1e-300'],
    exit: 2,
    cause: /--sim-poll must be at least 0\.01 seconds/,
  },
  {
    name: 'suite scenario names differing by a trailing space',
    args: ['suite', '{dir}/suite-trailing-space.yaml', ...c('good.yaml')],
    exit: 2,
    cause: /scenarios\[1\]\.name: a scenario name must not end with a space/,
  },
  {
    name: 'suite scenario names differing by a double space',
    args: ['suite', '{dir}/suite-double-space.yaml', ...c('good.yaml')],
    exit: 2,
    cause: /duplicate scenario name "a {2}b" \(reads as "a b"\)/,
  },
  {
    name: 'suite of 1100 scenarios x repetitions',
    args: ['suite', '{dir}/suite-too-many.yaml', ...c('good.yaml')],
    exit: 2,
    cause: /1100 scenarios to plan \(scenarios × repetitions\) is more than the 1000 a run plans/,
  },
  {
    name: 'abort-mid-transfer --trials=-1',
    args: ['inject', 'abort-mid-transfer', '--trials=-1', ...c('good.yaml')],
    exit: 2,
    cause: /--trials must be an integer from 1 to 200/,
    suggestion: /--trials \d+/,
  },
  {
    name: 'restart --service prefill --service prefill',
    args: ['restart', '--service', 'prefill', '--service', 'prefill', ...c('good.yaml')],
    exit: 2,
    cause: /--service prefill is given twice/,
    suggestion: /--service prefill/,
  },
  {
    name: "suite --run-id ''",
    args: ['suite', '--run-id', '', ...c('good.yaml')],
    exit: 2,
    cause: /--run-id is empty/,
    suggestion: /--run-id/,
  },
  {
    name: 'status --sim -c FILE',
    args: ['status', '--sim', '--state-dir', '{dir}/empty-state', ...c('good.yaml')],
    exit: 2,
    cause:
      /--sim=true cannot also be provided when using --config|--config=.* cannot also be provided when using --sim/,
  },
  {
    name: 'good: status --json --help prints the help as one JSON document',
    args: ['status', '--json', '--help'],
    exit: 0,
    modes: ['json'],
  },

  // Good cases from the probe: valid input that must keep working.
  {name: 'good: --help', args: ['--help'], exit: 0, modes: ['text']},
  {name: 'good: --version', args: ['--version'], exit: 0, modes: ['text']},
  {name: 'good: inject --help', args: ['inject', '--help'], exit: 0, modes: ['text']},
  {name: 'good: suite --help', args: ['suite', '--help'], exit: 0, modes: ['text']},
  {name: 'good: schema', args: ['schema'], exit: 0},
  {name: 'good: schema deployment', args: ['schema', 'deployment'], exit: 0},
  {name: 'good: schema suite', args: ['schema', 'suite'], exit: 0},
  {
    name: 'good: sim status of an empty state dir',
    args: ['sim', 'status', '--state-dir', '{dir}/empty-state'],
    exit: 0,
  },
  {name: 'good: sim down when nothing runs', args: ['sim', 'down', '--state-dir', '{dir}/empty-state'], exit: 0},
  {name: 'good: recover a clean state dir', args: ['recover', ...c('good.yaml')], exit: 0},
]

function expand(args: string[]): string[] {
  return args.map(a => a.replaceAll('{dir}', dir))
}

/**
 * Every input runs with --json: that alone asserts all that issue 12 asks of each (exit code, a one-line message
 * naming the cause, no stack trace, one JSON document with an error code). The text rendering is one function for
 * every error, so it runs on the first input of each command and exit code, and on every fourth row besides (a test
 * below holds the spread). Each run is a CLI process of about 0.9 CPU-s on a loaded 2-core machine: both modes for
 * every row cost the test run 100 more of them.
 *
 * The process boundary (bin/run.js, the exit code a shell sees, stdout flushed before exit) is one path for every
 * input: every text run and the first input of each command and exit code run as subprocesses; the other --json runs
 * call the built CLI's main in this process (test/cli/in-process-cli.ts), one at a time, which spares the test run
 * about 130 CLI start-ups.
 */
const commandOf = (k: Case): string => k.args.find(a => !a.startsWith('-')) ?? k.args[0]!
const firstOfItsKind = (k: Case, row: number): boolean =>
  CASES.findIndex(x => commandOf(x) === commandOf(k) && x.exit === k.exit) === row
function modesOf(k: Case, row: number): Array<'json' | 'text'> {
  if (k.modes) return k.modes
  return firstOfItsKind(k, row) || row % 4 === 0 ? ['json', 'text'] : ['json']
}
function viaOf(k: Case, row: number, mode: 'json' | 'text'): 'subprocess' | 'in-process' {
  return mode === 'text' || firstOfItsKind(k, row) || k.modes !== undefined ? 'subprocess' : 'in-process'
}

/** A line of a stack trace, as node prints them. */
const STACK = /^\s+at .+[:(]\d+:\d+\)?$/m

describe('bad input (issue 12): exit code, one line naming the cause, no stack trace, --json error documents', () => {
  beforeAll(async () => {
    deadPorts = [await freePort(), await freePort(), await freePort()]
    // Accepts every connection and never answers: the hung server the probe timeout must bound.
    const hang = createServer(s => {
      sockets.add(s)
      s.on('error', () => {})
      s.on('close', () => sockets.delete(s))
    })
    await new Promise<void>(resolve => hang.listen(0, '127.0.0.1', resolve))
    hangPort = (hang.address() as {port: number}).port
    servers.push(hang)
    writeFixtures()
    const sock = createServer()
    await new Promise<void>(resolve => sock.listen(at('sock'), resolve))
    servers.push(sock)
    NODES.sock = {type: 'socket'}
  })

  afterAll(async () => {
    for (const s of sockets) s.destroy()
    await Promise.all(servers.map(s => new Promise<void>(resolve => s.close(() => resolve()))))
    rmSync(dir, {recursive: true, force: true})
  })

  it('holds at least 100 inputs, each named once', () => {
    expect(CASES.length).toBeGreaterThanOrEqual(100)
    expect(new Set(CASES.map(x => x.name)).size).toBe(CASES.length)
  })

  it('renders text for every exit code and every command the table holds', () => {
    const texted = CASES.filter((k, row) => modesOf(k, row).includes('text'))
    const key = (k: Case) => `${commandOf(k)} exit ${k.exit}`
    const json = CASES.filter((k, row) => modesOf(k, row).includes('json'))
    // Text on every command and exit code the table holds, except where a row is json-only by design.
    expect(new Set(texted.map(key))).toEqual(new Set(CASES.filter(k => k.modes?.includes('text') ?? true).map(key)))
    expect(json.length, 'every input runs with --json unless it is text-only by design').toBe(
      CASES.filter(k => k.modes?.includes('json') ?? true).length,
    )
    expect(texted.length).toBeLessThan(CASES.length * 0.6)
    // Every command and exit code crosses the process boundary at least once under --json too.
    const jsonInAProcess = CASES.filter(
      (k, row) => modesOf(k, row).includes('json') && viaOf(k, row, 'json') === 'subprocess',
    )
    expect(new Set(jsonInAProcess.map(key))).toEqual(new Set(json.map(key)))
  })

  for (const [row, k] of CASES.entries()) {
    for (const mode of modesOf(k, row)) {
      const via = viaOf(k, row, mode)
      it.concurrent(`${k.name} (${mode}${via === 'in-process' ? ', in-process' : ''})`, async () => {
        const args = expand(k.args)
        if (mode === 'json' && !args.includes('--json')) args.push('--json')
        const opts = {timeoutMs: 55_000, env: {PDCHAOS_SIM_DIR: join(dir, 'default-sim'), NO_COLOR: '1'}}
        const r = via === 'subprocess' ? await runCli(args, opts) : await runCliInProcess(args, opts)
        const shown =
          `exit ${r.code} after ${Math.round(r.ms)} ` +
          `ms\nstdout: ${r.stdout.slice(0, 600)}\nstderr: ${r.stderr.slice(0, 600)}`
        expect(r.code, shown).toBe(k.exit)
        if (k.withinMs !== undefined) expect(r.ms, shown).toBeLessThan(k.withinMs)
        expect(r.stdout + r.stderr, shown).not.toMatch(STACK)
        expect(r.stdout + r.stderr, 'a password given on the command line is never echoed').not.toContain('S3cretToken')
        if (k.exit === 0) {
          expect(r.stderr, shown).not.toMatch(/^Error/m)
          if (mode === 'json') JSON.parse(r.stdout)
          return
        }
        if (mode === 'json') {
          // One document, and nothing else, on stdout.
          const doc = JSON.parse(r.stdout) as {error?: {code?: string; exitCode?: number; message?: string}}
          expect(doc.error?.code, shown).toMatch(/^E_[A-Z]+$/)
          expect(doc.error?.exitCode, shown).toBe(k.exit)
          expect(doc.error?.message, shown).toMatch(k.cause!)
          expect(doc.error?.message, shown).not.toContain('\n')
          if (k.suggestion)
            expect((doc.error as {suggestions?: string[]}).suggestions?.join(' '), shown).toMatch(k.suggestion)
        } else {
          expect(r.stdout, shown).toBe('')
          const lines = r.stderr.split('\n').filter(l => l.trim() !== '')
          expect(lines[0], shown).toMatch(/^Error: /)
          expect(lines[0], shown).toMatch(k.cause!)
          expect(lines.length, shown).toBeLessThanOrEqual(2)
          if (lines[1] !== undefined) expect(lines[1], shown).toMatch(/^Try this: /)
          if (k.suggestion) expect(lines[1], shown).toMatch(k.suggestion)
        }
      })
    }
  }

  // After every row above (a test that is not concurrent waits for the concurrent ones before it).
  it('no run opened, wrote, replaced or removed a node that is not a regular file (issue 28)', () => {
    assertNodesUnchanged()
  })

  it(
    'inject --journal against an unreachable target writes the error as its journal and says so ' + '(issue 28)',
    async () => {
      const env = {PDCHAOS_SIM_DIR: join(dir, 'default-sim'), NO_COLOR: '1'}
      const text = await runCli(
        ['inject', 'drop-dest-info', '--journal', `${dir}/failed/inject.json`, '-c', at('good.yaml')],
        {timeoutMs: 55_000, env},
      )
      expect(text.code, text.stderr).toBe(5)
      expect(text.stderr).toMatch(
        new RegExp(`^Note: the error is recorded in the journal ${dir}/failed/inject\\.json$`, 'm'),
      )
      const journal = JSON.parse(readFileSync(at('failed/inject.json'), 'utf8')) as {
        command: string
        error: {exitCode: number; message: string}
      }
      expect(journal.command).toBe('inject')
      expect(journal.error.exitCode).toBe(5)
      expect(journal.error.message).toMatch(DEAD)
      const json = await runCli(
        ['inject', 'drop-dest-info', '--journal', `${dir}/failed/inject-json.json`, '-c', at('good.yaml'), '--json'],
        {timeoutMs: 55_000, env},
      )
      expect((JSON.parse(json.stdout) as {error: {note?: string}}).error.note).toMatch(
        /recorded in the journal .*inject-json\.json/,
      )
      // And `report` reads it back: the deployment is in the combined report with its reason.
      const report = await runCli(['report', at('failed/inject.json'), '--json'], {timeoutMs: 55_000, env})
      expect(report.code, report.stdout).toBe(5)
    },
  )

  it('a run that writes nothing leaves no directory it made for an output (issue 28)', async () => {
    const env = {PDCHAOS_SIM_DIR: join(dir, 'default-sim'), NO_COLOR: '1'}
    const r = await runCli(
      [
        'suite',
        '--junit',
        `${dir}/made-for-junit/deeper/j.xml`,
        '--html',
        `${dir}/made-for-html/h.html`,
        '-c',
        at('good.yaml'),
      ],
      {timeoutMs: 55_000, env},
    )
    expect(r.code, r.stderr).toBe(5)
    expect(existsSync(at('made-for-junit'))).toBe(false)
    expect(existsSync(at('made-for-html'))).toBe(false)
  })
})
