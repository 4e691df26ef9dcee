import {isScalar, LineCounter, parseDocument, type Scalar} from 'yaml'

/**
 * YAML text to plain data, nothing more: the one parse that yaml-file.ts runs inline for a small file and in a worker
 * thread for a larger one (yaml-worker.ts), so a signal is heard while a large or hostile document parses. It imports
 * yaml alone (a worker loads nothing else) and returns its failure as data: the caller makes the error (exit 2).
 */

/**
 * The most alias expansions yaml allows (its resource-exhaustion guard, counted per anchor as the nodes it holds
 * times the aliases to it): a "billion laughs" document is refused at once, a file that shares a few anchors is not.
 */
export const MAX_ALIAS_COUNT = 100

export type YamlParsed =
  | {ok: true; data: unknown}
  /** syntax: file:line:col and yaml's first message; resolve: an alias that cannot be resolved, or an alias bomb. */
  | {ok: false; kind: 'syntax' | 'resolve'; message: string}

/** Parse one YAML document; `file` only names it in the message. Never throws for any text. */
export function parseYamlCore(text: string, file: string): YamlParsed {
  const lineCounter = new LineCounter()
  const keys = duplicateKeyCheck()
  let doc: ReturnType<typeof parseDocument>
  try {
    doc = parseDocument(text, {prettyErrors: false, uniqueKeys: keys.isEqual, lineCounter})
  } catch (error) {
    // yaml reports its own failures as doc.errors; anything thrown (a stack overflow it did not catch) is the same.
    return {ok: false, kind: 'syntax', message: `${file}: YAML syntax error: ${firstLine(error)}`}
  }
  const first = keys.realErrors(doc.errors)[0]
  if (first) {
    // The position as yaml's prettyErrors computes it; the message's first line without the position it would append.
    const at = first.pos[0] === -1 ? undefined : lineCounter.linePos(first.pos[0])
    const where = at ? `${file}:${at.line}:${at.col}` : file
    const cause = deep(first.message.split('\n')[0]!.replace(/ at line \d+, column \d+:?$/, ''))
    return {ok: false, kind: 'syntax', message: `${where}: YAML syntax error: ${cause}`}
  }
  try {
    return {ok: true, data: doc.toJS({maxAliasCount: MAX_ALIAS_COUNT})}
  } catch (error) {
    // An alias to an anchor not (yet) defined, or aliases that would expand the document enormously (an alias bomb).
    return {ok: false, kind: 'resolve', message: `${file}: YAML cannot be resolved: ${firstLine(error)}`}
  }
}

function firstLine(error: unknown): string {
  return deep(String(error instanceof Error ? error.message : error).split('\n')[0]!)
}

/** yaml parses nested collections by recursion: past the stack's depth it reports the engine's RangeError. */
function deep(message: string): string {
  return /Maximum call stack size exceeded/.test(message)
    ? 'collections nested too deeply (Maximum call stack size exceeded)'
    : message
}

/**
 * yaml's own duplicate-key check (uniqueKeys: true) compares each key with every earlier key of its map: quadratic,
 * minutes on a map of 100 000 keys. This one does the same job in linear time and leaves yaml's errors exactly as they
 * were, in the same order and at the same positions: yaml asks isEqual(first key of the map, new key) before it
 * would compare the new key with the others; answering true at once makes yaml report the key as a duplicate right
 * there (one call per key), and realErrors() drops the reports of keys that were not duplicates after all. Keys are
 * equal as yaml has them by default: scalars with strictly equal values (1 and "1" differ, and so do two NaNs).
 * test/deployment/load.system.test.ts holds the result to yaml's own check, so a yaml upgrade that changes the protocol
 * shows.
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
