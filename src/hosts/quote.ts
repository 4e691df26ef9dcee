import {badInput} from '../errors.js'

/**
 * THE quoting function: every argument pdchaos sends to a host's shell passes through here.
 * POSIX sh single quotes keep every byte literal except the quote itself, which becomes '\''.
 * Words made only of characters no shell treats specially are left bare so commands stay readable.
 */
const BARE = /^[A-Za-z0-9_@%+=:,./-]+$/

export function shellQuote(arg: string): string {
  if (typeof arg !== 'string')
    throw badInput(`cannot quote a ${typeof arg} as a shell argument`, 'pass every argv element as a string')
  if (arg.includes('\0')) {
    throw badInput(
      `a command argument contains a NUL byte: ${JSON.stringify(arg.slice(0, 40))}`,
      'remove the NUL: no shell or exec can carry it',
    )
  }
  if (arg === '') return "''"
  if (BARE.test(arg)) return arg
  return "'" + arg.replaceAll("'", "'\\''") + "'"
}

/** argv -> one command line for `sh -c` (what sshd hands to the login shell). */
export function shellCommand(argv: readonly string[]): string {
  if (argv.length === 0) throw badInput('an empty command cannot be run', 'give at least the program name')
  return argv.map(a => shellQuote(a)).join(' ')
}

// Control characters (newline, CR, ESC...) that would break a line or move the cursor when printed.
const CONTROL = /[\u0000-\u001f\u007f-\u009f\u2028\u2029]/

/** One argument for people to read: shellQuote, or bash's $'...' with escapes when it holds a control character. */
function displayWord(arg: string): string {
  if (!CONTROL.test(arg)) return shellQuote(arg)
  const body = [...arg]
    .map(c => {
      const code = c.codePointAt(0)!
      if (c === '\n') return '\\n'
      if (c === '\t') return '\\t'
      if (c === '\r') return '\\r'
      if (c === "'" || c === '\\') return '\\' + c
      if (CONTROL.test(c))
        return code <= 0xff ? `\\x${code.toString(16).padStart(2, '0')}` : `\\u${code.toString(16).padStart(4, '0')}`
      return c
    })
    .join('')
  return `$'${body}'`
}

/**
 * argv as one printable line: each argument quoted as a shell would need it, control characters escaped, so an
 * argument with a newline cannot forge another line of a log or of progress output (issue 12, S7).
 */
export function displayArgv(argv: readonly string[]): string {
  return argv.map(a => displayWord(a)).join(' ')
}

/** A short, one-line rendering of argv for error messages (long commands are cut). */
export function describeArgv(argv: readonly string[], max = 120): string {
  const line = displayArgv(argv)
  return line.length > max ? line.slice(0, max - 1) + '…' : line
}

// Bytes that mean nothing special inside single quotes (sh, bash, tcsh, fish), inside sh double quotes and in a
// printf format: they travel as they are; every other byte travels as a \ooo escape.
const PLAIN_BYTE = /^[A-Za-z0-9 _.,:/=+@;|&<>(){}[\]*?#~^-]$/

/**
 * A POSIX command line made safe for ANY login shell: sshd hands the command to the user's login shell, which may be
 * tcsh (no newline inside quotes, ! history) or fish (backslashes inside single quotes, no $$). The line is sent as
 * `exec sh -c 'eval "$(printf "…")"'` where the printf format holds only plain characters and octal escapes, so
 * every one of those shells passes it unchanged to sh, which decodes it and runs the original line (issue 12, S6).
 */
export function anyShellCommand(posixLine: string): string {
  if (posixLine.includes('\0'))
    throw badInput('a command line contains a NUL byte', 'remove the NUL: no shell or exec can carry it')
  let format = ''
  for (const byte of Buffer.from(posixLine, 'utf8')) {
    const c = String.fromCharCode(byte)
    // A leading - would read as a printf option.
    format +=
      byte < 0x80 && PLAIN_BYTE.test(c) && !(format === '' && c === '-') ? c : '\\' + byte.toString(8).padStart(3, '0')
  }
  return `exec sh -c 'eval "$(printf "${format}")"'`
}
