import {z} from 'zod'

import {type PdError, badInput} from '../errors.js'
import {readInputText, sizeText} from '../util/safe-file.js'
import {currentStop} from '../util/stop.js'
import {inWorker} from '../util/worker.js'
import {parseYamlCore, type YamlParsed} from './yaml-parse.js'

export {duplicateKeyCheck, MAX_ALIAS_COUNT} from './yaml-parse.js'

/**
 * Reading a YAML file pdchaos takes as input (the deployment file, the suite file) and validating it against its zod
 * schema. Every failure is exit 2 with the file named: missing, unreadable, too large, not YAML (file:line:col), not
 * resolvable (aliases), empty, or not the right shape (one line per schema issue, the path inside the file first).
 *
 * Parsing is synchronous and yaml's cost grows with the text (idle, 2 cores: 4-15 s for a hostile MiB, 0.3 s for a
 * suite of 1000 scenarios): a file over INLINE_YAML_BYTES parses in a worker thread, so the run's stop (SIGINT,
 * SIGTERM) is heard at once and ends it, and no parse outlasts PARSE_DEADLINE_MS.
 */

/**
 * The most pdchaos reads from a YAML file: a deployment file is a few kB, a suite of 1000 scenarios (the most a run
 * plans) 70-110 kB; a hostile document of this size parses in at most ~4 s idle (measured; see PARSE_DEADLINE_MS).
 */
export const MAX_YAML_BYTES = 256 * 1024

/**
 * Up to this size a file parses on the main thread (a deployment file is 1-3 kB): the most hostile text measured
 * parses in ~0.3 s at load 13 on 2 cores; a larger one starts a worker (0.1 s idle, up to 0.5 s loaded).
 */
export const INLINE_YAML_BYTES = 4 * 1024

/** A parse (in its worker) that takes longer is ended: exit 2, the file too complex (a suite of 1000: ~1 s loaded). */
export const PARSE_DEADLINE_MS = 15_000

export interface YamlFileKind {
  /** Names the file in messages: "deployment" gives "no deployment file at …". */
  what: string
  /** The command that prints the file's JSON Schema, quoted in suggestions. */
  schemaCommand: string
  /** Suggestions, word for word, for each failure that has its own. */
  hints: {
    /** The file does not exist. */
    missing: string
    /** The path is a directory; without this hint it is reported as any other read error. */
    directory?: string
    /** A YAML syntax error (and a duplicate key). */
    syntax: string
    /** The file holds no document. */
    empty: string
  }
}

/** Read, parse and validate a YAML input file. */
export async function loadYamlFile<S extends z.ZodType>(
  file: string,
  schema: S,
  kind: YamlFileKind,
): Promise<z.output<S>> {
  const text = await readCapped(file, kind)
  if (Buffer.byteLength(text, 'utf8') <= INLINE_YAML_BYTES) return parseYamlText(text, file, schema, kind)
  return validateYaml(failed(await parseInWorker(text, file), kind), file, schema, kind)
}

/** parseYamlCore in a worker thread, ended by the command's stop (exit 3) or the deadline (exit 2). */
async function parseInWorker(text: string, file: string): Promise<YamlParsed> {
  try {
    return await inWorker<YamlParsed>(
      'deployment/yaml-worker',
      {text, file},
      {
        signal: currentStop(),
        phase: `reading ${file}`,
        deadlineMs: PARSE_DEADLINE_MS,
        late: () => tooComplex(file, `it took over ${PARSE_DEADLINE_MS / 1000} s to parse`),
      },
    )
  } catch (error) {
    if ((error as {code?: string}).code === 'ERR_WORKER_OUT_OF_MEMORY')
      throw tooComplex(file, 'parsing it took more memory than any pdchaos file needs')
    throw error
  }
}

function tooComplex(file: string, why: string): PdError {
  return badInput(
    `${file}: YAML too complex: ${why}`,
    `check that ${file} is the file you meant; pdchaos's files are plain maps and lists`,
  )
}

/** Parse and validate YAML text; `file` only names it in errors. */
export function parseYamlText<S extends z.ZodType>(
  text: string,
  file: string,
  schema: S,
  kind: YamlFileKind,
): z.output<S> {
  if (Buffer.byteLength(text, 'utf8') > MAX_YAML_BYTES) throw tooLarge(file, kind)
  return validateYaml(failed(parseYamlCore(text, file), kind), file, schema, kind)
}

/** The parsed data, or the parse's failure as exit 2 with its suggestion. */
function failed(parsed: YamlParsed, kind: YamlFileKind): unknown {
  if (parsed.ok) return parsed.data
  if (parsed.kind === 'syntax') throw badInput(parsed.message, kind.hints.syntax)
  throw badInput(
    parsed.message,
    'each alias (*name) must come after its anchor (&name), and aliases may not multiply the document (an alias ' +
      'bomb)',
  )
}

/** Parsed YAML against the file's schema. */
function validateYaml<S extends z.ZodType>(data: unknown, file: string, schema: S, kind: YamlFileKind): z.output<S> {
  if (data === null || data === undefined) throw badInput(`${file} is empty`, kind.hints.empty)
  const result = schema.safeParse(data)
  if (!result.success) {
    const issues = foldIssues(z.prettifyError({issues: pickUnionOptions(result.error.issues)}))
    const lines = shownIssues(issues).map((issue, i) => (i === 0 ? `${file}: ${issue}` : issue))
    // One line per issue, the first is the cause; ";" keeps the one-line rendering readable.
    throw badInput(
      lines.join(';\n'),
      `fix ${file} at ${issues.length === 1 ? 'that path' : 'those paths'}; \`${kind.schemaCommand}\` prints the ` +
        `expected shape`,
    )
  }
  return result.data
}

/** The most issues a message shows, each cut at ISSUE_CHARS: a hostile file's 20 000 unknown keys are not echoed. */
const MAX_ISSUES = 20
const ISSUE_CHARS = 300

function shownIssues(issues: string[]): string[] {
  const cut = issues.slice(0, MAX_ISSUES).map(i => (i.length > ISSUE_CHARS ? `${i.slice(0, ISSUE_CHARS)}…` : i))
  return issues.length > MAX_ISSUES ? [...cut, `and ${issues.length - MAX_ISSUES} more issue(s)`] : cut
}

/**
 * A union whose value matches the type of exactly one option (a map where the options are a map or a list of them)
 * reports that option's own issues, at their paths ("services.decode.restart: expected array"), not "Invalid input"
 * for the whole union. A union that no option's type, or more than one, matches keeps its own message.
 */
export function pickUnionOptions(issues: readonly z.core.$ZodIssue[], prefix: PropertyKey[] = []): z.core.$ZodIssue[] {
  return issues.flatMap(issue => {
    const path = [...prefix, ...issue.path]
    if (issue.code !== 'invalid_union' || issue.errors.length === 0) return [{...issue, path}]
    const typed = issue.errors.filter(option => !option.some(i => i.code === 'invalid_type' && i.path.length === 0))
    return typed.length === 1 ? pickUnionOptions(typed[0], path) : [{...issue, path}]
  })
}

/** z.prettifyError prints "✖ message" then "  → at a.b.c" per issue; fold each into "a.b.c: message". */
export function foldIssues(pretty: string): string[] {
  const out: string[] = []
  let message: string | undefined
  const flush = (path?: string) => {
    if (message !== undefined) out.push(path ? `${path}: ${message}` : `(top level): ${message}`)
    message = undefined
  }
  for (const raw of pretty.split('\n')) {
    const line = raw.trim()
    if (line.startsWith('✖')) {
      flush()
      message = line.replace(/^✖\s*/, '')
    } else if (line.startsWith('→ at ')) {
      flush(line.slice('→ at '.length))
    } else if (line !== '' && message !== undefined) {
      message += ' ' + line
    }
  }
  flush()
  return out
}

function tooLarge(file: string, kind: YamlFileKind): PdError {
  return badInput(
    `${file} is larger than ${sizeText(MAX_YAML_BYTES)}, the most pdchaos reads from a ${kind.what} file`,
    `check that ${file} is the ${kind.what} file: one is a few kB`,
  )
}

/** The file as text: a regular file of at most the cap, strict UTF-8 (util/safe-file.ts). */
async function readCapped(file: string, kind: YamlFileKind): Promise<string> {
  return readInputText(file, {
    what: `${kind.what} file`,
    maxBytes: MAX_YAML_BYTES,
    missing: {message: `no ${kind.what} file at ${file}`, suggestion: kind.hints.missing},
    notAFile: kind.hints.directory ?? `give the path of the ${kind.what} file itself (a regular file)`,
  })!
}
