import {
  closeSync,
  constants,
  existsSync,
  fstatSync,
  lstatSync,
  mkdirSync,
  openSync,
  readSync,
  realpathSync,
  renameSync,
  rmdirSync,
  rmSync,
  type Stats,
  statSync,
  writeSync,
} from 'node:fs'
import {dirname, join, resolve} from 'node:path'

import {badInput, PdError} from '../errors.js'

/**
 * Every file pdchaos reads (deployment, suite and fleet files, journals, ssh keys, known_hosts, ssh config) is read
 * here: only a regular file, never more than a stated size, and never by a call that can block. A path that is a
 * FIFO, a device, a socket or a directory is refused by its stat, so it is never opened (opening a device can act,
 * a FIFO's open waits for a writer); the open that follows is non-blocking and its fstat must agree, so a file
 * swapped in between is refused too. Every refusal is exit 2 naming the file.
 */

export interface InputFileKind {
  /** Names the file in messages: "deployment file", "journal", "ssh identity file". */
  what: string
  /** The most read; a larger file is refused. */
  maxBytes: number
  /** Suggestion when the file does not exist; absent: a missing file is returned as undefined. */
  missing?: {message?: string; suggestion: string}
  /** Suggestion for a path that is not a regular file. */
  notAFile?: string
}

/** What a stat says a path is, for messages. */
export function nodeTypeOf(s: Stats): string {
  if (s.isDirectory()) return 'a directory'
  if (s.isFIFO()) return 'a FIFO (named pipe)'
  if (s.isCharacterDevice()) return 'a character device'
  if (s.isBlockDevice()) return 'a block device'
  if (s.isSocket()) return 'a socket'
  if (s.isSymbolicLink()) return 'a symbolic link'
  return s.isFile() ? 'a regular file' : 'not a regular file'
}

/** A size for messages: "1 MiB", "64 KiB". */
export function sizeText(bytes: number): string {
  if (bytes >= 1024 * 1024 && bytes % (1024 * 1024) === 0) return `${bytes / 1024 / 1024} MiB`
  if (bytes >= 1024 && bytes % 1024 === 0) return `${bytes / 1024} KiB`
  return `${bytes} bytes`
}

/** Why an errno stopped a read or a write, in words. */
export function errnoText(error: unknown): string {
  const code = (error as NodeJS.ErrnoException).code
  const why =
    code === 'ENOTDIR'
      ? 'a part of its path is a file, not a directory'
      : code === 'EACCES' || code === 'EPERM'
        ? 'permission denied'
        : code === 'ELOOP'
          ? 'too many symbolic links'
          : code === 'EROFS'
            ? 'the file system is read-only'
            : code === 'ENAMETOOLONG'
              ? 'the name is too long'
              : code === undefined
                ? String((error as Error).message ?? error)
                : undefined
  return why === undefined ? String(code) : `${why}${code ? ` (${code})` : ''}`
}

/**
 * The file's bytes, or undefined when it does not exist and kind.missing is absent. Throws exit 2 naming the file for
 * anything that is not a readable regular file of at most kind.maxBytes.
 */
export function readInputFile(file: string, kind: InputFileKind): Buffer | undefined {
  const notAFile = (s: Stats): PdError =>
    badInput(
      `${file} is ${nodeTypeOf(s)}, not a ${kind.what}`,
      kind.notAFile ?? `give the path of the ${kind.what} itself (a regular file)`,
    )
  const tooLarge = (): PdError =>
    badInput(
      `${file} is larger than ${sizeText(kind.maxBytes)}, the most pdchaos reads from a ${kind.what}`,
      `check that ${file} is the ${kind.what}`,
    )
  let fd: number | undefined
  try {
    const before = statSync(file)
    if (!before.isFile()) throw notAFile(before)
    if (before.size > kind.maxBytes) throw tooLarge()
    fd = openSync(file, constants.O_RDONLY | constants.O_NONBLOCK | constants.O_NOCTTY)
    const s = fstatSync(fd)
    if (!s.isFile()) throw notAFile(s)
    if (s.size > kind.maxBytes) throw tooLarge()
    // Read to EOF, never past the cap: the file may grow while it is read.
    let buf = Buffer.allocUnsafe(Math.min(kind.maxBytes + 1, Math.max(s.size + 1, 4096)))
    let total = 0
    for (;;) {
      if (total === buf.length) {
        if (total > kind.maxBytes) throw tooLarge()
        const grown = Buffer.allocUnsafe(Math.min(kind.maxBytes + 1, buf.length * 2))
        buf.copy(grown, 0, 0, total)
        buf = grown
      }
      const n = readSync(fd, buf, total, buf.length - total, null)
      if (n === 0) break
      total += n
    }
    if (total > kind.maxBytes) throw tooLarge()
    return buf.subarray(0, total)
  } catch (error) {
    if (error instanceof PdError) throw error
    const code = (error as NodeJS.ErrnoException).code
    if (code === 'ENOENT') {
      if (!kind.missing) return undefined
      throw badInput(kind.missing.message ?? `no ${kind.what} at ${file}`, kind.missing.suggestion)
    }
    throw badInput(`cannot read ${kind.what} ${file}: ${errnoText(error)}`, 'check the path and its permissions')
  } finally {
    if (fd !== undefined) closeSync(fd)
  }
}

/** readInputFile as UTF-8 text; bytes that are not UTF-8 are refused (line and column named), never replaced. */
export function readInputText(file: string, kind: InputFileKind): string | undefined {
  const bytes = readInputFile(file, kind)
  return bytes === undefined ? undefined : decodeUtf8(bytes, file)
}

/** Strict UTF-8: a byte that is not UTF-8 is exit 2 naming the file, line and column, not a silent U+FFFD. */
export function decodeUtf8(bytes: Buffer, file: string): string {
  try {
    return new TextDecoder('utf-8', {fatal: true}).decode(bytes)
  } catch {
    const at = firstInvalidUtf8(bytes)
    const before = new TextDecoder('utf-8').decode(bytes.subarray(0, at))
    const lines = before.split('\n')
    const where = `${file}:${lines.length}:${[...lines.at(-1)!].length + 1}`
    throw badInput(
      `${where}: not UTF-8 (byte 0x${bytes[at]!.toString(16).padStart(2, '0')} at offset ${at})`,
      `save ${file} as UTF-8 (iconv -f LATIN1 -t UTF-8 converts a Latin-1 file)`,
    )
  }
}

/** The offset of the first byte that does not start or continue a valid UTF-8 sequence. */
function firstInvalidUtf8(b: Buffer): number {
  let i = 0
  while (i < b.length) {
    const c = b[i]!
    const len = c < 0x80 ? 1 : c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0
    if (len === 0 || i + len > b.length) return i
    const fatal = new TextDecoder('utf-8', {fatal: true})
    try {
      fatal.decode(b.subarray(i, i + len))
    } catch {
      return i
    }
    i += len
  }
  return b.length
}

/** Numbers this process's temporary files. */
let tmpCount = 0

/**
 * Outputs (journal, JUnit, HTML): written only as regular files. A path that exists and is not a regular file is
 * never opened, written or replaced; a symbolic link is followed to the regular file it names (the link stays, the
 * file it names is replaced), and a link to nothing is refused. The text goes to a new file beside the target, then
 * is renamed over it, so a reader never sees half of it. Directories made for it are removed when the write fails.
 */
export function writeOutputFile(file: string, text: string): void {
  const target = outputTarget(file)
  const made = makeParents(target)
  // A short name of its own beside the target (a target's name may be as long as a name can be).
  const tmp = join(dirname(target), `.pdchaos-${process.pid}-${++tmpCount}.tmp`)
  let fd: number | undefined
  try {
    fd = openSync(
      tmp,
      constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | constants.O_NOFOLLOW | constants.O_NONBLOCK,
      0o666,
    )
    writeFullySync(fd, Buffer.from(text, 'utf8'))
    closeSync(fd)
    fd = undefined
    // Checked again at the last moment: a node that appeared meanwhile is not replaced either.
    outputTarget(file)
    renameSync(tmp, target)
  } catch (error) {
    if (fd !== undefined) closeSync(fd)
    try {
      rmSync(tmp, {force: true})
    } catch {
      /* never made */
    }
    removeMade(made)
    throw error
  }
}

/** The regular file an output path writes: itself, or the file its symbolic link names. Throws for anything else. */
export function outputTarget(file: string): string {
  const path = resolve(file)
  let l: Stats
  try {
    l = lstatSync(path)
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT') return path
    throw error
  }
  if (l.isFile()) return path
  if (!l.isSymbolicLink()) throw new OutputNotAFile(file, l)
  let real: string
  try {
    real = realpathSync(path)
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === 'ENOENT')
      throw new OutputNotAFile(file, l, 'a symbolic link to nothing')
    throw error
  }
  const s = statSync(real)
  if (!s.isFile()) throw new OutputNotAFile(file, s)
  return real
}

/** An output path that is a directory, a device, a FIFO, a socket or a dangling link: never written. */
export class OutputNotAFile extends Error {
  readonly kind: string
  constructor(
    readonly file: string,
    s: Stats,
    kind?: string,
  ) {
    const k = kind ?? nodeTypeOf(s)
    super(`${file} is ${k}, not a regular file: pdchaos does not write or replace it`)
    this.kind = k
  }
}

/** mkdir -p of a file's directory, one level at a time; returns the directories it made, outermost first. */
export function makeParents(file: string): string[] {
  // node's recursive mkdirSync never returns on a path under /proc (ENOENT there makes it retry the parent forever).
  const missing: string[] = []
  let dir = dirname(resolve(file))
  while (!existsSync(dir)) {
    missing.unshift(dir)
    const up = dirname(dir)
    if (up === dir) break
    dir = up
  }
  const made: string[] = []
  try {
    for (const d of missing) {
      mkdirSync(d)
      made.push(d)
    }
  } catch (error) {
    removeMade(made)
    throw error
  }
  return made
}

/** Remove directories makeParents made (innermost first), each only while it is empty. */
export function removeMade(made: string[]): void {
  for (const d of [...made].reverse()) {
    try {
      rmdirSync(d)
    } catch {
      return
    }
  }
}

function writeFullySync(fd: number, data: Buffer): void {
  let off = 0
  while (off < data.length) off += writeSync(fd, data, off, data.length - off)
}
