import {readInputFile} from '../util/safe-file.js'
import {homedir, userInfo} from 'node:os'

import {badInput} from '../errors.js'

/**
 * The subset of ~/.ssh/config pdchaos honours: Host blocks (patterns with * and ?, !negation) and the
 * HostName, User, Port, IdentityFile, ProxyJump options. As in OpenSSH the first value found wins
 * (IdentityFile accumulates). Match blocks are skipped: their conditions need ssh itself to evaluate.
 */

export interface SshConfigBlock {
  /** null for a Match block, which never applies here. */
  patterns: string[] | null
  options: Array<[key: string, value: string]>
}

export interface SshConfigResult {
  hostname?: string
  user?: string
  port?: number
  identityFiles: string[]
  proxyJump?: string
}

function splitValue(rest: string): string {
  const v = rest.trim()
  if (v.startsWith('"') && v.endsWith('"') && v.length >= 2) return v.slice(1, -1)
  return v
}

export function parseSshConfig(text: string): SshConfigBlock[] {
  const blocks: SshConfigBlock[] = [{patterns: ['*'], options: []}] // options before any Host line apply to all
  for (const raw of text.split('\n')) {
    const line = raw.trim()
    if (line === '' || line.startsWith('#')) continue
    const m = /^(\S+?)(?:\s*=\s*|\s+)(.*)$/.exec(line)
    if (!m) continue
    const key = m[1]!.toLowerCase()
    const value = splitValue(m[2]!)
    if (key === 'host')
      blocks.push({
        patterns: value
          .split(/\s+/)
          .filter(Boolean)
          .map(p => p.replace(/^"|"$/g, '')),
        options: [],
      })
    else if (key === 'match') blocks.push({patterns: null, options: []})
    else blocks.at(-1)!.options.push([key, value])
  }
  return blocks
}

function globMatch(pattern: string, name: string): boolean {
  const body = pattern
    .replace(/[.+^${}()|[\]\\]/g, '\\$&')
    .replaceAll('*', '.*')
    .replaceAll('?', '.')
  return new RegExp(`^${body}$`, 'i').test(name)
}

export function hostMatches(patterns: string[], name: string): boolean {
  let matched = false
  for (const p of patterns) {
    if (p.startsWith('!')) {
      if (globMatch(p.slice(1), name)) return false
    } else if (globMatch(p, name)) matched = true
  }
  return matched
}

export function expandTilde(path: string, home = homedir()): string {
  if (path === '~') return home
  if (path.startsWith('~/')) return home + path.slice(1)
  return path
}

/** The options that apply to `name`, with %-tokens and ~ expanded as ssh does for these keywords. */
export function resolveSshConfig(
  text: string,
  name: string,
  env: {home?: string; localUser?: string} = {},
): SshConfigResult {
  const home = env.home ?? homedir()
  const localUser = env.localUser ?? userInfo().username
  const found = new Map<string, string>()
  const identities: string[] = []
  for (const block of parseSshConfig(text)) {
    if (block.patterns === null || !hostMatches(block.patterns, name)) continue
    for (const [key, value] of block.options) {
      if (key === 'identityfile') identities.push(value)
      else if (!found.has(key)) found.set(key, value)
    }
  }
  const hostname = found.get('hostname')?.replaceAll('%h', name).replaceAll('%%', '%')
  const user = found.get('user')
  const portText = found.get('port')
  let port: number | undefined
  if (portText !== undefined) {
    port = Number(portText)
    if (!Number.isInteger(port) || port < 1 || port > 65_535)
      throw badInput(
        `ssh config: Port ${JSON.stringify(portText)} for ${name} is not a port`,
        'fix the Port line in the ssh config',
      )
  }
  const tokens = (s: string): string =>
    s.replace(/%([%dhurp])/g, (_, t: string) => {
      switch (t) {
        case '%':
          return '%'
        case 'd':
          return home
        case 'h':
          return hostname ?? name
        case 'u':
          return localUser
        case 'r':
          return user ?? localUser
        case 'p':
          return String(port ?? 22)
        default:
          return t
      }
    })
  const proxyJump = found.get('proxyjump')
  return {
    ...(hostname === undefined ? {} : {hostname}),
    ...(user === undefined ? {} : {user}),
    ...(port === undefined ? {} : {port}),
    identityFiles: identities.filter(f => f.toLowerCase() !== 'none').map(f => expandTilde(tokens(f), home)),
    ...(proxyJump === undefined || proxyJump.toLowerCase() === 'none' ? {} : {proxyJump}),
  }
}

export async function readSshConfigFile(path: string): Promise<string> {
  const bytes = readInputFile(path, {
    what: 'ssh config file',
    maxBytes: 16 * 1024 * 1024,
    notAFile: `give the path of an ssh config file (a regular file)`,
  })
  return bytes === undefined ? '' : bytes.toString('utf8')
}

/** "user@host:port" (ssh -J form; also ssh://user@host:port and [v6]:port). One hop only. */
export function parseJumpSpec(spec: string): {user?: string; host: string; port?: number} {
  if (spec.includes(','))
    throw badInput(
      `ProxyJump ${JSON.stringify(spec)} has more than one hop`,
      "pdchaos supports a single jump host; chain the rest in the jump host's own ssh config",
    )
  let s = spec.trim().replace(/^ssh:\/\//, '')
  let user: string | undefined
  const at = s.lastIndexOf('@')
  if (at >= 0) {
    user = s.slice(0, at)
    s = s.slice(at + 1)
  }
  let host = s
  let port: number | undefined
  const v6 = /^\[([^\]]+)\](?::(\d+))?$/.exec(s)
  const plain = /^([^:]+):(\d+)$/.exec(s)
  if (v6) {
    host = v6[1]!
    port = v6[2] ? Number(v6[2]) : undefined
  } else if (plain) {
    host = plain[1]!
    port = Number(plain[2])
  }
  if (host === '' || (port !== undefined && (port < 1 || port > 65_535)))
    throw badInput(`ProxyJump ${JSON.stringify(spec)} is not user@host:port`, 'write the jump host as user@host:port')
  return {...(user ? {user} : {}), host, ...(port === undefined ? {} : {port})}
}
