import {closeSync, constants, existsSync, fstatSync, openSync, unlinkSync} from 'node:fs'

import {badInput, oneLine, PdError} from '../errors.js'
export {makeParents} from '../util/safe-file.js'
import {errnoText, makeParents, OutputNotAFile, outputTarget, removeMade, writeOutputFile} from '../util/safe-file.js'
import {redactText} from '../util/redact.js'

/**
 * The files and URLs a run writes its results to, checked before the run (exit 2 naming the flag), so a long run
 * never ends in a write that was bound to fail. A path that exists must be a regular file (or a symbolic link to one,
 * which the write follows): a directory, device, FIFO or socket is refused by its stat, never opened. Missing parent
 * directories are made for the check and removed after it (the write makes them again), so a run that writes nothing
 * leaves none behind. Only an open tells what a write will do (root passes access() on /proc, a parent may be a
 * regular file): a regular file is opened for appending, a missing one created and removed, never blocking.
 */
export function checkOutputFile(flag: string, file: string): void {
  let target: string
  try {
    target = outputTarget(file)
  } catch (error) {
    if (error instanceof OutputNotAFile) {
      const hint =
        error.kind === 'a directory'
          ? `give ${flag} a file name, e.g. ${file.replace(/\/+$/, '')}/out`
          : `give ${flag} the path of a regular file; pdchaos writes only files`
      throw badInput(`${flag} ${file} is ${error.kind}, not a regular file`, hint)
    }
    rethrowBad(flag, file, error)
  }
  let made: string[] = []
  try {
    made = makeParents(target)
    const existed = existsSync(target)
    const flags =
      constants.O_WRONLY |
      constants.O_APPEND |
      constants.O_NONBLOCK |
      constants.O_NOCTTY |
      (existed ? 0 : constants.O_CREAT | constants.O_EXCL)
    const fd = openSync(target, flags, 0o666)
    const isFile = fstatSync(fd).isFile()
    closeSync(fd)
    if (!existed) unlinkSync(target)
    if (!isFile) throw badInput(`${flag} ${file} is not a regular file`, `give ${flag} the path of a regular file`)
  } catch (error) {
    if (error instanceof PdError) throw error
    rethrowBad(flag, file, error)
  } finally {
    removeMade(made)
  }
}

function rethrowBad(flag: string, file: string, error: unknown): never {
  const code = (error as NodeJS.ErrnoException).code
  const why = code === 'ENOENT' ? 'its directory cannot be created there (ENOENT)' : errnoText(error)
  throw badInput(`${flag} ${file} cannot be written: ${why}`, `give ${flag} a path in a directory you can write`)
}

/** A Pushgateway URL: http or https with a host, checked before the run. */
export function checkPushUrl(flag: string, raw: string): void {
  let u: URL
  try {
    u = new URL(raw)
  } catch {
    throw badInput(
      `${flag} ${JSON.stringify(redactText(raw))} is not a URL`,
      `give ${flag} the Pushgateway's address, e.g. http://127.0.0.1:9091`,
    )
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:')
    throw badInput(`${flag} must be an http:// or https:// URL, got ${u.protocol}`, 'e.g. http://127.0.0.1:9091')
  if (u.port === '0') throw badInput(`${flag} must have a port from 1 to 65535`, 'e.g. http://127.0.0.1:9091')
}

/**
 * Writes a run's outputs (journal, JUnit, HTML, Pushgateway) after its verdict is printed and its exit code decided:
 * a failed write never loses the verdict. Each failure is said on stderr and kept (for --json); the others still run.
 */
export function outputWriter(): {
  errors: string[]
  attempt: <T>(what: string, write: () => T | Promise<T>) => Promise<T | undefined>
  write: (file: string, text: string) => void
} {
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
      writeOutputFile(file, text)
    },
  }
}
