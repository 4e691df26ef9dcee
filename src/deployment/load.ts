import {z} from 'zod'

import {badInput} from '../errors.js'
import type {Deployment} from './config.js'
import {readEngineField, vllmFileRefused} from './engine-field.js'
import {DeploymentFileSchema} from './file-schema.js'
import {type DeploymentModel, toModel} from './model.js'
import {singleHostView} from './single-host.js'
import {watchdogRuleBreaks} from '../engines/sglang/deployment/watchdog-rules.js'
import {loadYamlFile, parseYamlText, type YamlFileKind} from './yaml-file.js'

export {foldIssues} from './yaml-file.js'

/**
 * Reading pdchaos.yaml. Every failure is exit 2 with the file named: missing, unreadable, too large, not YAML
 * (file:line:col), not resolvable, or not a deployment (one line per schema issue, the path inside the file first).
 * The file's model (model.ts) holds every form; commands take its single-host view (single-host.ts).
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

/** Read and validate a deployment file in any of its forms: the model of its hosts and instances. */
export async function loadDeploymentModel(file: string): Promise<DeploymentModel> {
  if ((await readEngineField(file)) === 'vllm') throw vllmFileRefused(file)
  return checkContract(toModel(await loadYamlFile(file, DeploymentFileSchema, DEPLOYMENT_FILE)), file)
}

/** Validate deployment YAML text; `file` is only used to name it in errors. */
export function parseDeploymentModel(text: string, file: string): DeploymentModel {
  return checkContract(toModel(parseYamlText(text, file, DeploymentFileSchema, DEPLOYMENT_FILE)), file)
}

/**
 * The single-host view of a deployment file, for `command` (it names the command in the refusal of a file that spans
 * several hosts or instances: exit 2, single-host.ts).
 */
export async function loadDeployment(file: string, command = 'pdchaos'): Promise<Deployment> {
  return singleHostView(await loadDeploymentModel(file), {command, file})
}

export function parseDeployment(text: string, file: string, command = 'pdchaos'): Deployment {
  return singleHostView(parseDeploymentModel(text, file), {command, file})
}

/**
 * What one field's bounds cannot say (watchdog-rules.ts, the rules' one home): poll <= deadline. Checked where a file
 * is read (the runner's own tests build contracts outside these bounds on purpose, to stress timing).
 */
function checkContract(d: DeploymentModel, file: string): DeploymentModel {
  const w = d.watchdog
  if (watchdogRuleBreaks(w).some(b => b.rule === 'poll-over-deadline')) {
    throw badInput(
      `${file}: watchdog.pollSeconds (${w.pollSeconds}) is longer than watchdog.deadlineSeconds (${w.deadlineSeconds})`,
      "give the watchdog's real poll interval, at most its deadline",
    )
  }
  return d
}

/** The JSON Schema of pdchaos.yaml, as a user writes it (defaults are optional), in every form the loader accepts. */
export function deploymentJsonSchema(): Record<string, unknown> {
  const schema = z.toJSONSchema(DeploymentFileSchema, {io: 'input', unrepresentable: 'any'}) as Record<string, unknown>
  const {$schema, ...rest} = schema
  return {$schema, title: 'pdchaos deployment file (pdchaos.yaml)', ...rest}
}
