import {readFile} from 'node:fs/promises'
import {parseDocument} from 'yaml'
import {z} from 'zod'

import {badInput} from '../errors.js'
import {type Deployment, DeploymentSchema} from './config.js'

/**
 * Reading pdchaos.yaml. Every failure is exit 2 with the file named: missing, unreadable, not YAML (file:line:col),
 * or not a deployment (one line per schema issue, the path inside the file first).
 */

export async function loadDeployment(file: string): Promise<Deployment> {
  let text: string
  try {
    text = await readFile(file, 'utf8')
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code
    if (code === 'ENOENT') {
      throw badInput(`no deployment file at ${file}`, 'run `pdchaos sim up` (it writes one for the twin), or pass -c FILE')
    }
    if (code === 'EISDIR') throw badInput(`${file} is a directory, not a deployment file`, 'pass the YAML file itself with -c FILE')
    throw badInput(`cannot read deployment file ${file}: ${code ?? String(error)}`, 'check the path and its permissions')
  }
  return parseDeployment(text, file)
}

/** Validate deployment YAML text; `file` is only used to name it in errors. */
export function parseDeployment(text: string, file: string): Deployment {
  const doc = parseDocument(text, {prettyErrors: true, uniqueKeys: true})
  if (doc.errors.length > 0) {
    const e = doc.errors[0]
    const at = e.linePos?.[0]
    const where = at ? `${file}:${at.line}:${at.col}` : file
    // yaml appends " at line L, column C:" and a code excerpt; the position is already in `where`.
    const cause = e.message.split('\n')[0].replace(/ at line \d+, column \d+:?$/, '')
    throw badInput(`${where}: YAML syntax error: ${cause}`, 'fix the YAML at that position (indentation, a missing quote or bracket)')
  }
  const data: unknown = doc.toJS()
  if (data === null || data === undefined) throw badInput(`${file} is empty`, 'write a deployment there; `pdchaos schema` prints what it may hold')
  const result = DeploymentSchema.safeParse(data)
  if (!result.success) {
    const issues = foldIssues(z.prettifyError(result.error))
    const lines = issues.map((issue, i) => (i === 0 ? `${file}: ${issue}` : issue))
    // One line per issue, the first is the cause; ";" keeps the one-line rendering readable.
    throw badInput(lines.join(';\n'), `fix ${file} at ${issues.length === 1 ? 'that path' : 'those paths'}; \`pdchaos schema\` prints the expected shape`)
  }
  return result.data
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

/** The JSON Schema of pdchaos.yaml, as a user writes it (defaults are optional). */
export function deploymentJsonSchema(): Record<string, unknown> {
  const schema = z.toJSONSchema(DeploymentSchema, {io: 'input', unrepresentable: 'any'}) as Record<string, unknown>
  const {$schema, ...rest} = schema
  return {$schema, title: 'pdchaos deployment file (pdchaos.yaml)', ...rest}
}
