import {dirname, isAbsolute, resolve} from 'node:path'

import {z} from 'zod'

import type {Deployment} from '../deployment/config.js'
import {readEngineField} from '../deployment/engine-field.js'
import {loadDeployment} from '../deployment/load.js'
import {loadYamlFile, parseYamlText, type YamlFileKind} from '../deployment/yaml-file.js'
import {loadVllmDeployment, type VllmDeployment, vllmStateDir} from '../engines/vllm/deployment-file.js'
import {VLLM_BUILTIN_SUITE, type VllmSuite} from '../engines/vllm/experiments/builtin-suite.js'
import {loadVllmSuite, suiteFileEngine} from '../engines/vllm/experiments/suite-file.js'
import {badInput} from '../errors.js'
import {defaultSuite, loadSuite, type SuiteFile} from './suite-file.js'

/**
 * The fleet file: the deployments `pdchaos suite --fleet` runs, each a deployment file and the suite for it (paths
 * relative to the fleet file). Everything it names is read and validated before any deployment is touched: a typo in
 * the twentieth entry is exit 2 naming it, not a half-run fleet.
 */

export const DEFAULT_MAX_PARALLEL = 4
export const MAX_PARALLEL_LIMIT = 64

/** Names become journal file names (DIR/NAME.json) and a Prometheus label value: plain characters only. */
const MemberName = z
  .string()
  .min(1)
  .max(63)
  .regex(/^[A-Za-z0-9][A-Za-z0-9_.-]*$/, 'letters, digits and _ . - only (it names the journal file)')

const MemberSchema = z
  .object({
    name: MemberName.describe(
      'Names the deployment in the combined report, its journal file (NAME.json) and the Pushgateway label ' +
        '`deployment`.',
    ),
    deployment: z.string().min(1).describe('Its deployment file (pdchaos.yaml), relative to the fleet file.'),
    suite: z
      .string()
      .min(1)
      .optional()
      .describe("Its suite file, relative to the fleet file. Default: the fleet's suite, else the built-in suite."),
  })
  .strict()

export const FleetSchema = z
  .object({
    version: z.literal(1).default(1),
    name: z.string().min(1).max(80).default('fleet'),
    maxParallel: z
      .number()
      .int()
      .min(1)
      .max(MAX_PARALLEL_LIMIT)
      .default(DEFAULT_MAX_PARALLEL)
      .describe('Deployments run at once at most (--max-parallel overrides it).'),
    suite: z
      .string()
      .min(1)
      .optional()
      .describe(
        'The suite file of every deployment that names none, relative to the fleet file. Default: the built-in suite.',
      ),
    deployments: z.array(MemberSchema).min(1).max(1000),
  })
  .strict()
  .superRefine((f, ctx) => {
    const seen = new Map<string, number>()
    f.deployments.forEach((d, i) => {
      const first = seen.get(d.name)
      if (first !== undefined)
        ctx.addIssue({
          code: 'custom',
          path: ['deployments', i, 'name'],
          message: `duplicate name ${JSON.stringify(d.name)} (also deployments[${first}])`,
        })
      else seen.set(d.name, i)
    })
  })

export type FleetFile = z.infer<typeof FleetSchema>

interface FleetEntryBase {
  name: string
  /** Absolute paths. */
  deploymentFile: string
  suiteFile?: string
}

/**
 * One deployment of the fleet and its suite: SGLang's (no `engine`), or an `engine: vllm` file with a vLLM suite file
 * (`engine: vllm`) or the built-in vLLM suite; each runs as `pdchaos suite -c FILE` would run it alone.
 */
export type FleetEntry = FleetEntryBase &
  (
    | {engine?: 'sglang'; deployment: Deployment; suite: SuiteFile}
    | {engine: 'vllm'; deployment: VllmDeployment; suite: VllmSuite}
  )

/** The deployment's name as its own file states it (a vLLM file may state none: the fleet's name for it). */
export const entryDeploymentName = (e: FleetEntry): string => e.deployment.name ?? e.name

/** The deployment's state dir on its host (its run lock and halt live there). */
export const entryStateDir = (e: FleetEntry): string =>
  e.engine === 'vllm' ? vllmStateDir(e.deployment) : e.deployment.stateDir

export interface FleetPlan {
  file: string
  name: string
  maxParallel: number
  entries: FleetEntry[]
}

const FLEET_FILE: YamlFileKind = {
  what: 'fleet',
  schemaCommand: 'pdchaos schema fleet',
  hints: {
    missing: 'pass the fleet file to --fleet; `pdchaos schema fleet` prints what it holds',
    directory: 'pass the fleet YAML file itself to --fleet',
    syntax: 'fix the YAML at that position',
    empty: 'list the deployments under `deployments:`; `pdchaos schema fleet` prints the shape',
  },
}

export function parseFleet(text: string, file: string): FleetFile {
  return parseYamlText(text, file, FleetSchema, FLEET_FILE)
}

/** Read the fleet file, then every deployment and suite file it names (each failure exit 2, naming the file). */
export async function loadFleet(file: string): Promise<FleetPlan> {
  return planFleet(await loadYamlFile(file, FleetSchema, FLEET_FILE), file)
}

export async function planFleet(fleet: FleetFile, file: string): Promise<FleetPlan> {
  const base = dirname(resolve(file))
  const at = (p: string) => (isAbsolute(p) ? p : resolve(base, p))
  const suites = new Map<string, Promise<SuiteFile>>()
  const suiteOf = (p: string | undefined) => {
    if (p === undefined) return Promise.resolve(defaultSuite())
    if (!suites.has(p)) suites.set(p, loadSuite(p))
    return suites.get(p)!
  }
  const entries: FleetEntry[] = []
  // One at a time, in file order: the first mistake reported is the first in the file.
  for (const d of fleet.deployments) {
    const deploymentFile = at(d.deployment)
    const suiteFile = d.suite ?? fleet.suite
    const suitePath = suiteFile === undefined ? undefined : at(suiteFile)
    const base = {name: d.name, deploymentFile, ...(suitePath ? {suiteFile: suitePath} : {})}
    const engine = await readEngineField(deploymentFile)
    if (suitePath !== undefined) await checkSuiteEngine(file, d.name, engine, suitePath)
    entries.push(
      engine === 'vllm'
        ? {
            ...base,
            engine,
            deployment: await loadVllmDeployment(deploymentFile),
            suite: suitePath ? await loadVllmSuite(suitePath) : VLLM_BUILTIN_SUITE,
          }
        : {...base, deployment: await loadDeployment(deploymentFile, 'suite'), suite: await suiteOf(suitePath)},
    )
  }
  checkDistinct(entries, file)
  return {file: resolve(file), name: fleet.name, maxParallel: fleet.maxParallel, entries}
}

/** A deployment's suite file is its engine's (exit 2 naming both, before anything runs). */
async function checkSuiteEngine(file: string, name: string, engine: 'sglang' | 'vllm', suite: string): Promise<void> {
  const suiteEngine = await suiteFileEngine(suite)
  if (suiteEngine === engine) return
  const is = (e: string) => (e === 'vllm' ? 'a vLLM' : 'an SGLang')
  throw badInput(
    `${file}: deployment ${name} is ${is(engine)} deployment and its suite ${suite} is ${is(suiteEngine)} suite file`,
    engine === 'vllm'
      ? 'give it a vLLM suite file (engine: vllm) with `suite:` on its entry, or omit suite: for the built-in vLLM ' +
          'suite'
      : 'give it an SGLang suite file with `suite:` on its entry, or omit suite: for the built-in suite',
  )
}

/** Two entries on one deployment would contend for its host lock (and the second would be refused): said now. */
function checkDistinct(entries: FleetEntry[], file: string): void {
  const seen = new Map<string, string>()
  for (const e of entries) {
    for (const key of [`file ${e.deploymentFile}`, `host ${JSON.stringify(e.deployment.host)} ${entryStateDir(e)}`]) {
      const other = seen.get(key)
      if (other !== undefined) {
        const what = key.startsWith('file')
          ? `the same deployment file ${e.deploymentFile}`
          : `the same host and stateDir ${entryStateDir(e)}`
        throw badInput(
          `${file}: deployments ${other} and ${e.name} use ${what}: two runs of one deployment would contend for ` +
            `its host lock`,
          'list each deployment once',
        )
      }
      seen.set(key, e.name)
    }
  }
}

export function fleetJsonSchema(): Record<string, unknown> {
  const {$schema, ...rest} = z.toJSONSchema(FleetSchema, {io: 'input'}) as Record<string, unknown>
  return {$schema, title: 'pdchaos fleet file', ...rest}
}
