import {badInput} from '../errors.js'

/**
 * THE quoting function: every argument pdchaos sends to a host's shell passes through here.
 * POSIX sh single quotes keep every byte literal except the quote itself, which becomes '\''.
 * Words made only of characters no shell treats specially are left bare so commands stay readable.
 */
const BARE = /^[A-Za-z0-9_@%+=:,./-]+$/

export function shellQuote(arg: string): string {
  if (typeof arg !== 'string') throw badInput(`cannot quote a ${typeof arg} as a shell argument`, 'pass every argv element as a string')
  if (arg.includes('\0')) {
    throw badInput(`a command argument contains a NUL byte: ${JSON.stringify(arg.slice(0, 40))}`, 'remove the NUL: no shell or exec can carry it')
  }
  if (arg === '') return "''"
  if (BARE.test(arg)) return arg
  return "'" + arg.replaceAll("'", "'\\''") + "'"
}

/** argv -> one command line for `sh -c` (what sshd hands to the login shell). */
export function shellCommand(argv: readonly string[]): string {
  if (argv.length === 0) throw badInput('an empty command cannot be run', 'give at least the program name')
  return argv.map((a) => shellQuote(a)).join(' ')
}

/** A short, one-line rendering of argv for error messages (long commands are cut). */
export function describeArgv(argv: readonly string[], max = 120): string {
  const line = shellCommand(argv).replaceAll('\n', '\\n')
  return line.length > max ? line.slice(0, max - 1) + '…' : line
}
