import {execFile} from 'node:child_process'
import {mkdtemp, rm, writeFile} from 'node:fs/promises'
import {tmpdir} from 'node:os'
import {join} from 'node:path'
import {promisify} from 'node:util'
import {afterAll, beforeAll, describe, expect, it} from 'vitest'
import {parseDocument, parse as parseYaml} from 'yaml'
import {z} from 'zod'

import {DeploymentSchema} from '../../src/deployment/config.js'
import {deploymentJsonSchema, loadDeployment, parseDeployment} from '../../src/deployment/load.js'
import {duplicateKeyCheck, MAX_YAML_BYTES} from '../../src/deployment/yaml-file.js'
import {PdError} from '../../src/errors.js'
import {GOOD} from './fixtures.js'

const run = promisify(execFile)
const root = join(import.meta.dirname, '..', '..')

const escapeRe = (s: string): string => s.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')

async function loadError(file: string): Promise<PdError> {
  try {
    await loadDeployment(file)
  } catch (error) {
    expect(error).toBeInstanceOf(PdError)
    return error as PdError
  }
  throw new Error(`expected ${file} to be refused`)
}

describe('loadDeployment', () => {
  let dir: string
  const file = (name: string) => join(dir, name)

  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'pdchaos-load-'))
  })
  afterAll(async () => {
    await rm(dir, {recursive: true, force: true})
  })

  it('loads a good file and fills the defaults', async () => {
    await writeFile(file('good.yaml'), GOOD)
    const d = await loadDeployment(file('good.yaml'))
    expect(d.name).toBe('h100-pd')
    expect(d.host).toEqual({kind: 'ssh', alias: 'gpu-1', connectTimeoutSeconds: 10})
    expect(d.services.prefill.healthPath).toBe('/health')
    expect(d.services.router.readinessPath).toBe('/readiness')
    expect(d.services.prefill.restart).toEqual(['systemctl', 'restart', 'sglang-prefill'])
    expect(d.watchdog).toEqual({scope: 'inflight', deadlineSeconds: 30, pollSeconds: 5})
    expect(d.stateDir).toBe('/run/pdchaos')
    expect(d.sglangVersion).toBe('0.5.10')
  })

  it('names a missing file and how to get one (exit 2)', async () => {
    const e = await loadError(file('absent.yaml'))
    expect(e.exitCode).toBe(2)
    expect(e.message).toBe(`no deployment file at ${file('absent.yaml')}`)
    expect(e.suggestion).toMatch(/pdchaos sim up/)
    expect(e.suggestion).toMatch(/-c FILE/)
    const d = await loadError(dir)
    expect(d.message).toMatch(/is a directory/)
  })

  it('gives file:line:col for a YAML syntax error', async () => {
    await writeFile(file('syntax.yaml'), 'name: x\nhost:\n  kind: local\nservices: [a, b\nwatchdog: {}\n')
    const e = await loadError(file('syntax.yaml'))
    expect(e.exitCode).toBe(2)
    expect(e.message).toMatch(
      new RegExp(`^${file('syntax.yaml').replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}:\\d+:\\d+: YAML syntax error: `),
    )
    expect(e.message).not.toContain('\n')
    await writeFile(file('dup.yaml'), 'name: a\nname: b\n')
    expect((await loadError(file('dup.yaml'))).message).toMatch(/dup\.yaml:2:1: YAML syntax error: .*unique/i)
  })

  it('names the path inside the file and what was expected, one line per issue', async () => {
    const bad = GOOD.replace('url: http://10.0.0.5:30001', 'url: not a url')
      .replace('deadlineSeconds: 30', 'deadlineSeconds: "30s"')
      .replace('backend: nixl', 'backend: nixl\nextraKey: 1')
    await writeFile(file('schema.yaml'), bad)
    const e = await loadError(file('schema.yaml'))
    expect(e.exitCode).toBe(2)
    const lines = e.message.split('\n')
    expect(lines).toHaveLength(3)
    expect(lines[0].startsWith(`${file('schema.yaml')}: `)).toBe(true)
    expect(e.message).toMatch(/services\.decode\.url: url must be an http:\/\/ or https:\/\/ URL/)
    expect(e.message).toMatch(/watchdog\.deadlineSeconds: Invalid input: expected number, received string/)
    expect(e.message).toMatch(/Unrecognized key: "extraKey"/)
    expect(e.suggestion).toMatch(/pdchaos schema/)
  })

  it('says which host kind is expected and what a log source looks like', async () => {
    await writeFile(file('host.yaml'), GOOD.replace('kind: ssh', 'kind: ftp'))
    expect((await loadError(file('host.yaml'))).message).toMatch(/host\.kind: expected "ssh" or "local"/)
    await writeFile(file('logs.yaml'), GOOD.replace('logs: {journald: sglang-prefill}', 'logs: {syslog: x}'))
    expect((await loadError(file('logs.yaml'))).message).toMatch(
      /services\.prefill\.logs: expected \{file: PATH\} or \{journald: UNIT\}/,
    )
    await writeFile(file('ssh.yaml'), GOOD.replace('  alias: gpu-1\n', '  port: 22\n'))
    expect((await loadError(file('ssh.yaml'))).message).toMatch(/host: an ssh host needs alias or hostname/)
    await writeFile(file('empty.yaml'), '# nothing\n')
    expect((await loadError(file('empty.yaml'))).message).toMatch(/is empty/)
  })

  it('refuses a file over 256 KiB without parsing it, naming the file and the cap (exit 2)', async () => {
    const comment = '# ' + 'padding '.repeat(12) + '\n'
    let padded = GOOD + comment.repeat(Math.floor((MAX_YAML_BYTES - GOOD.length) / comment.length))
    padded += '#'.repeat(MAX_YAML_BYTES - padded.length - 1) + '\n'
    expect(Buffer.byteLength(padded)).toBe(MAX_YAML_BYTES)
    await writeFile(file('at-cap.yaml'), padded)
    expect((await loadDeployment(file('at-cap.yaml'))).name).toBe('h100-pd')

    await writeFile(file('over-cap.yaml'), padded + '\n')
    const e = await loadError(file('over-cap.yaml'))
    expect(e.exitCode).toBe(2)
    expect(e.message).toBe(
      `${file('over-cap.yaml')} is larger than 256 KiB, the most pdchaos reads from a deployment file`,
    )
    // A device is refused by its type, never read (issue 28): a private one with /dev/zero's numbers, never /dev's own.
    await run('mknod', [file('zero'), 'c', '1', '5'])
    expect((await loadError(file('zero'))).message).toBe(`${file('zero')} is a character device, not a deployment file`)
    // Text handed over directly is held to the same cap.
    expect(() => parseDeployment(padded + '\n', 'inline.yaml')).toThrow(/^inline\.yaml is larger than 256 KiB/)
  })

  it('finds a duplicate key in one pass over the map, at the line yaml names', async () => {
    const n = 15_000
    const keys = Array.from({length: n}, (_, i) => `k${i}: ${i}`).join('\n')
    await writeFile(file('many-keys.yaml'), `${keys}\nk17: again\n`)
    const started = performance.now()
    const e = await loadError(file('many-keys.yaml'))
    // yaml's own check (uniqueKeys: true) compares every key with every earlier one: about 8 s for this map (90 s
    // for 50 000 keys, more than the 256 KiB cap now holds).
    expect(performance.now() - started).toBeLessThan(30_000)
    expect(e.exitCode).toBe(2)
    expect(e.message).toBe(`${file('many-keys.yaml')}:${n + 1}:1: YAML syntax error: Map keys must be unique`)
    // One comparison per key after the first, where yaml's own check makes n(n-1)/2.
    const check = duplicateKeyCheck()
    let calls = 0
    parseDocument(keys.split('\n').slice(0, 1000).join('\n'), {
      uniqueKeys: (a, b) => {
        calls++
        return check.isEqual(a, b)
      },
    })
    expect(calls).toBe(999)
  })

  it("reports the first YAML error exactly as yaml's own duplicate-key check did", () => {
    const texts = [
      'name: a\nname: b\n',
      'a:\n  b: 1\n  b: 2\n',
      '{a: 1, a: 2}\n',
      'a: {b: 1, b: \n', // a duplicate, then a flow map that never ends: the duplicate comes first
      '{x: [1, 2}, x: 1}\n', // the unclosed sequence in the first value comes first
      'null: \n~: 1\n', // after an empty value yaml places the duplicate at the end of that value
      '1: x\n"1": y\n', // 1 and "1" differ
      '.nan: 1\n.nan: 2\n', // NaN is not NaN
      '? [a]\n: 1\n? [a]\n: 2\n', // collections are never equal
      '&x a: 1\n*x : 2\n', // nor are aliases
      '"a": 1\n\'a\': 2\na: 3\n',
      'a: 1\nb: [\nc: 1\na: 2\n',
      '- {a: 1, b: 2, a: 3}\n- a: 1\n  a: 2\n',
      'a: 1\r\nb:\r\n  c: 1\r\n  c: 2\r\n',
      '%YAML 1.2\n---\na: 1\na: 2\n',
      'a: 1\n---\na: 1\n',
      'a: 1\nb: 2\n',
    ]
    for (const text of texts) {
      const own = parseDocument(text, {prettyErrors: true, uniqueKeys: true}).errors[0]
      const at = own?.linePos?.[0]
      const expected =
        own &&
        `${at ? `f.yaml:${at.line}:${at.col}` : 'f.yaml'}: YAML syntax ` +
          `error: ${own.message.split('\n')[0].replace(/ at line \d+, column \d+:?$/, '')}`
      let got: string | undefined
      try {
        parseDeployment(text, 'f.yaml')
      } catch (error) {
        got = (error as PdError).message
      }
      if (expected) expect(got, JSON.stringify(text)).toBe(expected)
      else expect(got ?? '', JSON.stringify(text)).not.toMatch(/YAML syntax error/)
    }
  })

  it('turns an alias bomb or an alias without its anchor into exit 2 naming the file', async () => {
    // Ten lines, each nine aliases of the one before: a billion strings once expanded.
    const lines = ['a: &a ["x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for (let i = 1; i < 10; i++) {
      const name = String.fromCharCode(97 + i)
      lines.push(`${name}: &${name} [${Array.from({length: 9}, () => `*${String.fromCharCode(96 + i)}`).join(', ')}]`)
    }
    await writeFile(file('bomb.yaml'), lines.join('\n') + '\n')
    const e = await loadError(file('bomb.yaml'))
    expect(e.exitCode).toBe(2)
    expect(e.message).toBe(
      `${file('bomb.yaml')}: YAML cannot be resolved: Excessive alias count indicates a resource exhaustion attack`,
    )
    expect(e.suggestion).toMatch(/alias/)

    await writeFile(file('dangling.yaml'), GOOD.replace('name: h100-pd', 'name: *nowhere'))
    const d = await loadError(file('dangling.yaml'))
    expect(d.exitCode).toBe(2)
    expect(d.message).toMatch(
      new RegExp(`^${escapeRe(file('dangling.yaml'))}: YAML cannot be resolved: Unresolved alias .*nowhere$`),
    )
  })

  it('the JSON Schema describes the file as written (defaults optional) and accepts the good file', () => {
    const schema = deploymentJsonSchema() as {properties: Record<string, unknown>; required?: string[]; $schema: string}
    expect(schema.$schema).toMatch(/json-schema/)
    expect(Object.keys(schema.properties)).toEqual(
      expect.arrayContaining(['host', 'hosts', 'services', 'watchdog', 'labels', 'sudo']),
    )
    // host: or hosts: (never both, checked by the loader): neither is required on its own.
    expect(schema.required?.sort()).toEqual(['services', 'watchdog'])
    // The schema round-trips through zod's own JSON-Schema reader: the good file validates against it.
    const back = z.fromJSONSchema(schema as never)
    expect(back.safeParse(DeploymentSchema.parse(parseYaml(GOOD))).success).toBe(true)
  })
})

describe('pdchaos schema (subprocess)', () => {
  it('--json prints valid JSON and nothing else; the default output is the same document', async () => {
    const env = {...process.env, OCLIF_SKIP_NEW_VERSION_CHECK: '1', NO_COLOR: '1'}
    const json = await run(process.execPath, [join(root, 'bin', 'dev.js'), 'schema', '--json'], {
      cwd: root,
      env,
      timeout: 30_000,
    })
    expect(json.stderr).toBe('')
    const doc = JSON.parse(json.stdout)
    expect(doc).toEqual(deploymentJsonSchema())
    const plain = await run(process.execPath, [join(root, 'bin', 'dev.js'), 'schema', 'deployment'], {
      cwd: root,
      env,
      timeout: 30_000,
    })
    expect(JSON.parse(plain.stdout)).toEqual(doc)
  })

  it("suite prints the suite file's schema; an unknown kind is refused with exit 2", async () => {
    const env = {...process.env, OCLIF_SKIP_NEW_VERSION_CHECK: '1', NO_COLOR: '1'}
    const suite = await run(process.execPath, [join(root, 'bin', 'dev.js'), 'schema', 'suite', '--json'], {
      cwd: root,
      env,
      timeout: 30_000,
    })
    const doc = JSON.parse(suite.stdout) as {properties?: Record<string, unknown>}
    expect(Object.keys(doc.properties ?? {})).toEqual(expect.arrayContaining(['scenarios', 'stop', 'gate']))
    const err = await run(process.execPath, [join(root, 'bin', 'dev.js'), 'schema', 'nonsense', '--json'], {
      cwd: root,
      env,
      timeout: 30_000,
    }).then(
      () => undefined,
      (error: {code: number; stdout: string}) => error,
    )
    expect(err?.code).toBe(2)
  })
})
