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

// Control characters (newline, CR, ESC...) that would break a line or move the cursor when printed.
const CONTROL = /[\u0000-\u001f\u007f-\u009f\u2028\u2029]/

/** One argument for people to read: shellQuote, or bash's $'...' with escapes when it holds a control character. */
function displayWord(arg: string): string {
  if (!CONTROL.test(arg)) return shellQuote(arg)
  const body = [...arg].map((c) => {
    const code = c.codePointAt(0)!
    if (c === '\n') return '\\n'
    if (c === '\t') return '\\t'
    if (c === '\r') return '\\r'
    if (c === "'" || c === '\\') return '\\' + c
    if (CONTROL.test(c)) return code <= 0xff ? `\\x${code.toString(16).padStart(2, '0')}` : `\\u${code.toString(16).padStart(4, '0')}`
    return c
  }).join('')
  return `$'${body}'`
}

/**
 * argv as one printable line: each argument quoted as a shell would need it, control characters escaped, so an
 * argument with a newline cannot forge another line of a log or of progress output (issue 12, S7).
 */
export function displayArgv(argv: readonly string[]): string {
  return argv.map((a) => displayWord(a)).join(' ')
}

/** A short, one-line rendering of argv for error messages (long commands are cut). */
export function describeArgv(argv: readonly string[], max = 120): string {
  const line = displayArgv(argv)
  return line.length > max ? line.slice(0, max - 1) + '…' : line
}
