import {closeSync, existsSync, mkdirSync, openSync, statSync, unlinkSync, writeFileSync} from 'node:fs'
import {dirname, resolve} from 'node:path'

import {badInput, oneLine} from '../errors.js'
import {redactText} from '../util/redact.js'

/**
 * The files and URLs a run writes its results to, checked before the run (exit 2 naming the flag), so a long run
 * never ends in a write that was bound to fail. The check creates missing parent directories, as the write would,
 * and opens the file for appending (then removes it when it did not exist): only an open tells what a write will do
 * (root passes access() on /proc, and a parent may be a regular file).
 */
export function checkOutputFile(flag: string, file: string): void {
  const path = resolve(file)
  const existed = exists(flag, file, path)
  try {
    makeParents(path)
    closeSync(openSync(path, 'a'))
    if (!existed) unlinkSync(path)
  } catch (error) {
    rethrowBad(flag, file, error)
  }
}

/** Whether the output file exists already; a directory there is refused. */
function exists(flag: string, file: string, path: string): boolean {
  let isDir: boolean
  try {
    isDir = statSync(path).isDirectory()
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return false
    rethrowBad(flag, file, error)
  }
  if (isDir) throw badInput(`${flag} ${file} is a directory`, `give ${flag} a file name, e.g. ${file.replace(/\/+$/, '')}/out`)
  return true
}

/**
 * mkdir -p of a file's directory, one level at a time: node's recursive mkdirSync never returns on a path under /proc
 * (ENOENT there makes it retry the parent, which exists, forever).
 */
export function makeParents(file: string): void {
  const missing: string[] = []
  let dir = dirname(resolve(file))
  while (!existsSync(dir)) {
    missing.unshift(dir)
    const up = dirname(dir)
    if (up === dir) break
    dir = up
  }
  for (const d of missing) mkdirSync(d)
}

function rethrowBad(flag: string, file: string, error: unknown): never {
  const code = (error as NodeJS.ErrnoException).code
  const why = code === 'ENOTDIR' ? 'a part of its path is a file, not a directory'
    : code === 'EACCES' || code === 'EPERM' ? 'permission denied'
    : code === 'ENOENT' ? 'its directory cannot be created there'
    : code === 'EROFS' ? 'the file system is read-only'
    : oneLine(error)
  throw badInput(`${flag} ${file} cannot be written: ${why}${code ? ` (${code})` : ''}`, `give ${flag} a path in a directory you can write`)
}

/** A Pushgateway URL: http or https with a host, checked before the run. */
export function checkPushUrl(flag: string, raw: string): void {
  let u: URL
  try {
    u = new URL(raw)
  } catch {
    throw badInput(`${flag} ${JSON.stringify(redactText(raw))} is not a URL`, `give ${flag} the Pushgateway's address, e.g. http://127.0.0.1:9091`)
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') throw badInput(`${flag} must be an http:// or https:// URL, got ${u.protocol}`, 'e.g. http://127.0.0.1:9091')
  if (u.port === '0') throw badInput(`${flag} must have a port from 1 to 65535`, 'e.g. http://127.0.0.1:9091')
}

/**
 * Writes a run's outputs (journal, JUnit, HTML, Pushgateway) after its verdict is printed and its exit code decided:
 * a failed write never loses the verdict. Each failure is said on stderr and kept (for --json); the others still run.
 */
export function outputWriter(): {errors: string[]; attempt: <T>(what: string, write: () => T | Promise<T>) => Promise<T | undefined>; write: (file: string, text: string) => void} {
  const errors: string[] = []
  return {
    errors,
    async attempt(what, write) {
      try {
        return await write()
      } catch (error) {
        const line = `could not write ${what}: ${oneLine(error)}`
        errors.push(line)
        process.stderr.write(`Error: ${line} (the verdict above stands)\n`)
        return undefined
      }
    },
    write(file, text) {
      makeParents(file)
      writeFileSync(file, text)
    },
  }
}
