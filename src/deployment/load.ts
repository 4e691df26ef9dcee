import {z} from 'zod'

import {badInput} from '../errors.js'
import {type Deployment, DeploymentSchema} from './config.js'
import {loadYamlFile, parseYamlText, type YamlFileKind} from './yaml-file.js'

export {foldIssues} from './yaml-file.js'

/**
 * Reading pdchaos.yaml. Every failure is exit 2 with the file named: missing, unreadable, too large, not YAML
 * (file:line:col), not resolvable, or not a deployment (one line per schema issue, the path inside the file first).
 */

const DEPLOYMENT_FILE: YamlFileKind = {
  what: 'deployment',
  schemaCommand: 'pdchaos schema',
  hints: {
    missing: 'run `pdchaos sim up` (it writes one for the twin), or pass -c FILE',
    directory: 'pass the YAML file itself with -c FILE',
    syntax: 'fix the YAML at that position (indentation, a missing quote or bracket)',
    empty: 'write a deployment there; `pdchaos schema` prints what it may hold',
  },
}

export async function loadDeployment(file: string): Promise<Deployment> {
  return checkContract(await loadYamlFile(file, DeploymentSchema, DEPLOYMENT_FILE), file)
}

/** Validate deployment YAML text; `file` is only used to name it in errors. */
export function parseDeployment(text: string, file: string): Deployment {
  return checkContract(parseYamlText(text, file, DeploymentSchema, DEPLOYMENT_FILE), file)
}

/**
 * What one field's bounds cannot say: a watchdog that polls less often than its deadline gives an eviction window
 * wider than the deadline itself, which no check can judge as a deadline. Checked where a file is read (the
 * runner's own tests build contracts outside these bounds on purpose, to stress timing).
 */
function checkContract(d: Deployment, file: string): Deployment {
  const w = d.watchdog
  if (w.pollSeconds > w.deadlineSeconds) {
    throw badInput(`${file}: watchdog.pollSeconds (${w.pollSeconds}) is longer than watchdog.deadlineSeconds (${w.deadlineSeconds})`,
      "give the watchdog's real poll interval, at most its deadline")
  }
  return d
}

/** The JSON Schema of pdchaos.yaml, as a user writes it (defaults are optional). */
export function deploymentJsonSchema(): Record<string, unknown> {
  const schema = z.toJSONSchema(DeploymentSchema, {io: 'input', unrepresentable: 'any'}) as Record<string, unknown>
  const {$schema, ...rest} = schema
  return {$schema, title: 'pdchaos deployment file (pdchaos.yaml)', ...rest}
}
