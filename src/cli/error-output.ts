import {PdError, codeForExit, oneLine} from '../errors.js'
import {ExitCode} from '../exit-codes.js'

/**
 * How every error leaves pdchaos, whoever raised it (a command, oclif's parser, oclif's command lookup): one line
 * naming the cause and a suggestion on stderr, or under --json one document on stdout with the same fields and a
 * `code`; the README's exit code either way; a stack trace only with --verbose.
 */

export interface ErrorDocument {
  /** note: said after the error (where the run's failure journal was written, or why it was not). */
  error: {code: string; exitCode: number; message: string; name: string; suggestions?: string[]; note?: string}
}

type AnyError = Error & {
  code?: unknown
  exitCode?: number
  suggestion?: string
  suggestions?: string[]
  oclif?: {exit?: number}
}

/** oclif's parse and lookup errors end with this advice; the suggestion says it instead, naming the command. */
const OCLIF_HELP_TAIL = /\s*See more help with --help\.?\s*$/

/** `this.exit(n)`: an exit asked for, not an error. */
export function isExitRequest(err: unknown): boolean {
  return (err as AnyError | undefined)?.code === 'EEXIT'
}

/** The error as pdchaos renders it: its exit code, code, one-line message and suggestions. */
export function errorDocument(err: unknown, helpCommand?: string): ErrorDocument {
  const doc = errorDocumentOf(err, helpCommand)
  const note = (err as {journalNote?: unknown} | undefined)?.journalNote
  return typeof note === 'string' ? {error: {...doc.error, note}} : doc
}

function errorDocumentOf(err: unknown, helpCommand?: string): ErrorDocument {
  const e = (err instanceof Error ? err : new Error(String(err))) as AnyError
  if (err instanceof PdError) {
    return {
      error: {
        code: err.code,
        exitCode: err.exitCode,
        message: oneLine(err),
        name: err.name,
        ...(err.suggestion ? {suggestions: [err.suggestion]} : {}),
      },
    }
  }
  const oclifExit = e.oclif?.exit
  // oclif's exit 2 is bad input (a parse error, an unknown command or flag); its other errors (a command module that
  // fails to load) are infrastructure, below.
  if (oclifExit === ExitCode.badInput) {
    // oclif's own: a parse error, an unknown command or flag (exit 2 by oclif's convention, as the README's).
    const exitCode = oclifExit
    const help = helpCommand
      ? `\`pdchaos ${helpCommand} --help\` lists what it takes`
      : '`pdchaos --help` lists the commands'
    const suggestions = e.suggestions?.length ? e.suggestions : [help]
    return {
      error: {
        code: codeForExit(exitCode),
        exitCode,
        message: oneLine(e.message)
          .replace(OCLIF_HELP_TAIL, '')
          .replace(/^The following errors? occurred:\s*/, ''),
        name: e.name,
        suggestions,
      },
    }
  }
  // Anything else is unexpected: infrastructure (exit 5), never a verdict.
  return {
    error: {
      code: 'E_INTERNAL',
      exitCode: ExitCode.unreachable,
      message: oneLine(e),
      name: e.name,
      suggestions: ['re-run with --verbose for details'],
    },
  }
}

/** Render an error document: JSON on stdout, or `Error:` and `Try this:` lines on stderr; sets the exit code. */
export function writeError(doc: ErrorDocument, o: {json: boolean; verbose?: boolean; stack?: string}): void {
  process.exitCode = doc.error.exitCode
  if (o.json) {
    process.stdout.write(JSON.stringify(doc, null, 2) + '\n')
    return
  }
  process.stderr.write(`Error: ${doc.error.message}\n`)
  const hint = doc.error.suggestions?.[0]
  if (hint) process.stderr.write(`Try this: ${hint}\n`)
  if (doc.error.note) process.stderr.write(`Note: ${doc.error.note}\n`)
  if (o.verbose && o.stack) process.stderr.write(o.stack + '\n')
}

/** Whether argv asks for --json (before a `--`), as oclif reads it. */
export function argvWantsJson(argv: string[]): boolean {
  const end = argv.indexOf('--')
  const i = argv.indexOf('--json')
  return i !== -1 && (end === -1 || i < end)
}
