import {createHash, createHmac, randomBytes} from 'node:crypto'
import {closeSync, constants, fstatSync, mkdirSync, openSync, writeSync} from 'node:fs'
import {dirname} from 'node:path'

import {badInput, PdError} from '../errors.js'
import {errnoText, readInputFile} from '../util/safe-file.js'

/**
 * known_hosts as OpenSSH writes it: plain names, wildcard patterns, `[host]:port` for ports other than 22,
 * hashed `|1|salt|hmac` entries, and the @revoked / @cert-authority markers.
 */

export type HostKeyStatus =
  | {status: 'known'}
  | {status: 'unknown'}
  | {status: 'changed'; knownFingerprints: string[]}
  | {status: 'revoked'}

/** "SHA256:..." exactly as `ssh-keygen -l` prints it (base64 without padding). */
export function fingerprintOf(keyBlob: Buffer): string {
  return 'SHA256:' + createHash('sha256').update(keyBlob).digest('base64').replace(/=+$/, '')
}

/** The key type named inside an SSH public key blob (e.g. ssh-ed25519). */
export function keyTypeOf(keyBlob: Buffer): string {
  if (keyBlob.length < 4) return 'unknown'
  const len = keyBlob.readUInt32BE(0)
  return keyBlob.subarray(4, 4 + len).toString('latin1')
}

/** The name a host is filed under: bare for port 22, `[host]:port` otherwise. */
export function knownHostsToken(host: string, port: number): string {
  return port === 22 ? host : `[${host}]:${port}`
}

export function knownHostsLine(host: string, port: number, keyBlob: Buffer): string {
  return `${knownHostsToken(host, port)} ${keyTypeOf(keyBlob)} ${keyBlob.toString('base64')}`
}

/** A hashed entry for a host, as `ssh-keygen -H` writes it (used by tests and for users who hash). */
export function hashedToken(host: string, port: number, salt: Buffer = randomBytes(20)): string {
  const mac = createHmac('sha1', salt).update(knownHostsToken(host, port)).digest('base64')
  return `|1|${salt.toString('base64')}|${mac}`
}

function globToRegExp(pattern: string): RegExp {
  const body = pattern
    .replace(/[.+^${}()|[\]\\]/g, '\\$&')
    .replaceAll('*', '.*')
    .replaceAll('?', '.')
  return new RegExp(`^${body}$`, 'i')
}

/** One comma-separated host field against a host token; negated patterns veto a match. */
function hostFieldMatches(field: string, token: string): boolean {
  if (field.startsWith('|1|')) {
    const [, , salt, mac] = field.split('|')
    if (!salt || !mac) return false
    const want = createHmac('sha1', Buffer.from(salt, 'base64')).update(token).digest('base64')
    return want === mac
  }
  let matched = false
  for (const raw of field.split(',')) {
    const negated = raw.startsWith('!')
    const pat = negated ? raw.slice(1) : raw
    if (pat === '') continue
    if (globToRegExp(pat).test(token)) {
      if (negated) return false
      matched = true
    }
  }
  return matched
}

/** Judge a presented host key against the text of a known_hosts file. */
export function checkKnownHosts(text: string, host: string, port: number, keyBlob: Buffer): HostKeyStatus {
  const token = knownHostsToken(host, port)
  const presented = keyBlob.toString('base64')
  const others: string[] = []
  let known = false
  for (const rawLine of text.split('\n')) {
    const line = rawLine.trim()
    if (line === '' || line.startsWith('#')) continue
    const fields = line.split(/\s+/)
    let marker: string | undefined
    if (fields[0]!.startsWith('@')) marker = fields.shift()
    if (marker === '@cert-authority') continue // certificates are not supported; such lines never vouch for a plain key
    const [hosts, , b64] = fields
    if (!hosts || !b64) continue
    if (!hostFieldMatches(hosts, token)) continue
    if (marker === '@revoked') {
      if (b64 === presented) return {status: 'revoked'}
      continue
    }
    if (b64 === presented) known = true
    else {
      try {
        others.push(fingerprintOf(Buffer.from(b64, 'base64')))
      } catch {
        /* unparsable line */
      }
    }
  }
  // @revoked anywhere beats a positive match, so the loop finishes before answering.
  if (known) return {status: 'known'}
  if (others.length > 0) return {status: 'changed', knownFingerprints: others}
  return {status: 'unknown'}
}

/** known_hosts files of thousands of hosts are a few MB; more is not one. */
export const MAX_KNOWN_HOSTS_BYTES = 16 * 1024 * 1024

/** The file's text ('' when it does not exist); anything but a readable regular file is exit 2 naming it. */
export async function readKnownHosts(path: string): Promise<string> {
  const bytes = readInputFile(path, {
    what: 'known_hosts file',
    maxBytes: MAX_KNOWN_HOSTS_BYTES,
    notAFile: 'give knownHosts the path of a known_hosts file (a regular file, or one that does not exist yet)',
  })
  return bytes === undefined ? '' : bytes.toString('utf8')
}

/** Append a newly accepted key (never called for a changed key), only to a regular file, never blocking. */
export async function appendKnownHost(path: string, host: string, port: number, keyBlob: Buffer): Promise<void> {
  const existing = await readKnownHosts(path)
  const sep = existing === '' || existing.endsWith('\n') ? '' : '\n'
  let fd: number | undefined
  try {
    mkdirSync(dirname(path), {recursive: true, mode: 0o700})
    fd = openSync(
      path,
      constants.O_WRONLY | constants.O_APPEND | constants.O_CREAT | constants.O_NONBLOCK | constants.O_NOCTTY,
      0o600,
    )
    if (!fstatSync(fd).isFile())
      throw badInput(
        `${path} is not a regular file, not a known_hosts file`,
        'give knownHosts the path of a known_hosts file',
      )
    writeSync(fd, `${sep}${knownHostsLine(host, port, keyBlob)}\n`)
  } catch (error) {
    if (error instanceof PdError) throw error
    throw badInput(
      `cannot add the host key to ${path}: ${errnoText(error)}`,
      'give knownHosts a path in a directory you can write',
    )
  } finally {
    if (fd !== undefined) closeSync(fd)
  }
}
