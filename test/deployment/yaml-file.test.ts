import {mkdtempSync, rmSync, writeFileSync} from 'node:fs'
import {tmpdir} from 'node:os'
import {join} from 'node:path'

import {afterAll, describe, expect, it} from 'vitest'
import {z} from 'zod'

import {
  INLINE_YAML_BYTES,
  loadYamlFile,
  MAX_YAML_BYTES,
  parseYamlText,
  type YamlFileKind,
} from '../../src/deployment/yaml-file.js'
import {PdError} from '../../src/errors.js'
import {setCurrentStop} from '../../src/util/stop.js'

/**
 * Issue 28, item 3 (file parsing hears a stop): a YAML file larger than INLINE_YAML_BYTES parses in a worker thread,
 * so the command's stop ends the parse at once (exit 3) however long the text would take; its result is the inline
 * parse's, failures included (exit 2, one line naming the file).
 */

const dir = mkdtempSync(join(tmpdir(), 'pdchaos-yaml-file-'))
afterAll(() => rmSync(dir, {recursive: true, force: true}))

const KIND: YamlFileKind = {
  what: 'suite',
  schemaCommand: 'pdchaos schema suite',
  hints: {missing: 'pass a file', syntax: 'fix the YAML at that position', empty: 'write a suite'},
}
const Schema = z.object({scenarios: z.array(z.object({name: z.string()}).strict())}).strict()

function file(name: string, text: string): string {
  writeFileSync(join(dir, name), text)
  return join(dir, name)
}

/** The error a promise rejects with. */
async function failure(p: Promise<unknown>): Promise<PdError> {
  const error = await p.then(
    () => undefined,
    (e: unknown) => e,
  )
  expect(error).toBeInstanceOf(PdError)
  return error as PdError
}

/** About `bytes` of lines that are each a YAML error (a tab as indentation): yaml's slowest text measured. */
const hostile = (bytes: number): string => 'scenarios:\n' + '\t- ]\n'.repeat(Math.floor(bytes / 5))

describe('YAML files: large ones parse in a worker that a stop ends (issue 28)', () => {
  it('a large file parses in the worker to the same data and the same errors as inline', async () => {
    const big = 'scenarios:\n' + Array.from({length: 500}, (_, i) => `  - {name: s${i}}`).join('\n') + '\n'
    expect(big.length).toBeGreaterThan(INLINE_YAML_BYTES)
    const data = await loadYamlFile(file('big.yaml', big), Schema, KIND)
    expect(data).toEqual(parseYamlText(big, join(dir, 'big.yaml'), Schema, KIND))
    expect(data.scenarios).toHaveLength(500)

    const broken = big + 'scenarios: []\n'
    const inWorker = await failure(loadYamlFile(file('broken.yaml', broken), Schema, KIND))
    expect(inWorker.exitCode).toBe(2)
    expect(inWorker.message).toBe(`${join(dir, 'broken.yaml')}:502:1: YAML syntax error: Map keys must be unique`)
    expect(() => parseYamlText(broken, join(dir, 'broken.yaml'), Schema, KIND)).toThrow(inWorker.message)

    // The schema's issues after a worker's parse are the inline parse's (one function validates both).
    const shaped = big.replace('{name: s7}', '{name: 7, colour: blue}')
    expect(() => parseYamlText(shaped, 'shape.yaml', Schema, KIND)).toThrow(
      /^shape\.yaml: scenarios\[7\]: Unrecognized key: "colour";\nscenarios\[7\]\.name: .*string/,
    )
  }, 30_000)

  it("a stop while a hostile file parses ends it at once: exit 3 naming the file, not the parse's seconds", async () => {
    const path = file('hostile.yaml', hostile(MAX_YAML_BYTES - 1024))
    // How long this text takes to load unstopped on this machine now (worker start and parse: 1-7 s, idle to load
    // 13); the stop lands at half of that, inside the parse, whatever the machine's load.
    const started = performance.now()
    expect((await failure(loadYamlFile(path, Schema, KIND))).exitCode).toBe(2)
    const unstoppedMs = performance.now() - started
    const stop = new AbortController()
    const restore = setCurrentStop(stop.signal)
    try {
      const loading = failure(loadYamlFile(path, Schema, KIND))
      await new Promise(resolve => setTimeout(resolve, unstoppedMs / 2))
      const stopped = performance.now()
      stop.abort('interrupted (SIGINT)')
      const error = await loading
      const ms = performance.now() - stopped
      expect(error.exitCode, error.message).toBe(3)
      expect(error.message).toBe(`interrupted (SIGINT) during reading ${path}: stopped before changing anything`)
      // The stop ends it within the event loop's next turn, not at the parse's end.
      expect(ms).toBeLessThan(Math.max(1000, unstoppedMs / 4))
    } finally {
      restore()
    }
  }, 30_000)

  it('a hostile file without a stop: exit 2 naming its first error, whatever the number of errors', async () => {
    const path = file('errors.yaml', hostile(64 * 1024))
    const error = await failure(loadYamlFile(path, Schema, KIND))
    expect(error.exitCode).toBe(2)
    expect(error.message).toBe(`${path}:2:1: YAML syntax error: Tabs are not allowed as indentation`)
  }, 30_000)

  it('nesting past the stack, an alias bomb and 20 000 unknown keys are each one short line (exit 2)', () => {
    // Inline: the worker runs the same parse (yaml-parse.ts); these need no worker to show it.
    const fail = (name: string, text: string): string => {
      try {
        parseYamlText(text, name, Schema, KIND)
      } catch (error) {
        expect((error as PdError).exitCode).toBe(2)
        return (error as PdError).message
      }
      throw new Error(`${name} parsed`)
    }
    expect(fail('deep.yaml', `scenarios: ${'['.repeat(5000)}${']'.repeat(5000)}\n`)).toMatch(
      /^deep\.yaml:1:\d+: YAML syntax error: collections nested too deeply/,
    )
    const levels = ['a0: &a0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]']
    for (let i = 1; i < 10; i++)
      levels.push(
        `a${i}: &a${i} [${Array(9)
          .fill(`*a${i - 1}`)
          .join(', ')}]`,
      )
    expect(fail('bomb.yaml', levels.join('\n') + '\n')).toMatch(/^bomb\.yaml: YAML cannot be resolved: Excessive alias/)
    const many = fail('keys.yaml', Array.from({length: 20_000}, (_, i) => `k${i}: 1`).join('\n') + '\n')
    expect(many.length, many.slice(0, 200)).toBeLessThan(1000)
    expect(many).toMatch(/^keys\.yaml: \(top level\): Unrecognized keys: "k0", "k1", .*…/)
  })

  it('a stop before the read: exit 3 at once, no worker started', async () => {
    const stop = new AbortController()
    stop.abort('interrupted (SIGTERM)')
    const restore = setCurrentStop(stop.signal)
    try {
      const error = await failure(loadYamlFile(file('late.yaml', hostile(16 * 1024)), Schema, KIND))
      expect(error.exitCode).toBe(3)
    } finally {
      restore()
    }
  })
})
