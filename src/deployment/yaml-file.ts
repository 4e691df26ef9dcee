import {isScalar, LineCounter, parseDocument, type Scalar} from 'yaml'
import {z} from 'zod'

import {type PdError, badInput, oneLine} from '../errors.js'
import {readInputText} from '../util/safe-file.js'

/**
 * Reading a YAML file pdchaos takes as input (the deployment file, the suite file) and validating it against its zod
 * schema. Every failure is exit 2 with the file named: missing, unreadable, too large, not YAML (file:line:col), not
 * resolvable (aliases), empty, or not the right shape (one line per schema issue, the path inside the file first).
 */

/** The most pdchaos reads from an input file: these files are a few kB, and a wrong path must not stall or swamp it. */
export const MAX_YAML_BYTES = 1024 * 1024

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
  return parseYamlText(await readCapped(file, kind), file, schema, kind)
}

/** Parse and validate YAML text; `file` only names it in errors. */
export function parseYamlText<S extends z.ZodType>(
  text: string,
  file: string,
  schema: S,
  kind: YamlFileKind,
): z.output<S> {
  if (Buffer.byteLength(text, 'utf8') > MAX_YAML_BYTES) throw tooLarge(file, kind)
  const lineCounter = new LineCounter()
  const keys = duplicateKeyCheck()
  const doc = parseDocument(text, {prettyErrors: false, uniqueKeys: keys.isEqual, lineCounter})
  const first = keys.realErrors(doc.errors)[0]
  if (first) {
    // The position as yaml's prettyErrors computes it; the message's first line without the position it would append.
    const at = first.pos[0] === -1 ? undefined : lineCounter.linePos(first.pos[0])
    const where = at ? `${file}:${at.line}:${at.col}` : file
    const cause = first.message.split('\n')[0].replace(/ at line \d+, column \d+:?$/, '')
    throw badInput(`${where}: YAML syntax error: ${cause}`, kind.hints.syntax)
  }
  let data: unknown
  try {
    data = doc.toJS()
  } catch (error) {
    // An alias to an anchor not (yet) defined, or aliases that would expand the document enormously (an alias bomb).
    throw badInput(
      `${file}: YAML cannot be resolved: ${oneLine(error)}`,
      'each alias (*name) must come after its anchor (&name), and aliases may not multiply the document (an alias ' +
        'bomb)',
    )
  }
  if (data === null || data === undefined) throw badInput(`${file} is empty`, kind.hints.empty)
  const result = schema.safeParse(data)
  if (!result.success) {
    const issues = foldIssues(z.prettifyError({issues: pickUnionOptions(result.error.issues)}))
    const lines = issues.map((issue, i) => (i === 0 ? `${file}: ${issue}` : issue))
    // One line per issue, the first is the cause; ";" keeps the one-line rendering readable.
    throw badInput(
      lines.join(';\n'),
      `fix ${file} at ${issues.length === 1 ? 'that path' : 'those paths'}; \`${kind.schemaCommand}\` prints the ` +
        `expected shape`,
    )
  }
  return result.data
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
    `${file} is larger than 1 MiB, the most pdchaos reads from a ${kind.what} file`,
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

/**
 * yaml's own duplicate-key check (uniqueKeys: true) compares each key with every earlier key of its map: quadratic,
 * minutes on a map of 100 000 keys. This one does the same job in linear time and leaves yaml's errors exactly as they
 * were, in the same order and at the same positions: yaml asks isEqual(first key of the map, new key) before it
 * would compare the new key with the others; answering true at once makes yaml report the key as a duplicate right
 * there (one call per key), and realErrors() drops the reports of keys that were not duplicates after all. Keys are
 * equal as yaml has them by default: scalars with strictly equal values (1 and "1" differ, and so do two NaNs).
 * test/deployment/load.test.ts holds the result to yaml's own check, so a yaml upgrade that changes the protocol shows.
 */
export function duplicateKeyCheck(): {
  isEqual: (first: unknown, key: unknown) => boolean
  realErrors: <E extends {code: string}>(errors: E[]) => E[]
} {
  const seenByMap = new Map<unknown, Set<unknown>>()
  const verdicts: boolean[] = []
  const comparable = (node: unknown): node is Scalar =>
    isScalar(node) && !(typeof node.value === 'number' && Number.isNaN(node.value))
  return {
    isEqual(first, key) {
      let seen = seenByMap.get(first)
      if (!seen) {
        seen = new Set(comparable(first) ? [first.value] : [])
        seenByMap.set(first, seen)
      }
      const duplicate = comparable(key) && seen.has(key.value)
      if (comparable(key)) seen.add(key.value)
      verdicts.push(duplicate)
      return true
    },
    realErrors(errors) {
      let i = 0
      return errors.filter(e => e.code !== 'DUPLICATE_KEY' || verdicts[i++] === true)
    },
  }
}
