import {z} from 'zod'

import {HostNameSchema} from '../deployment/file-schema.js'
import {loadYamlFile, parseYamlText, type YamlFileKind} from '../deployment/yaml-file.js'
import {checkFaultParams} from '../faults/params.js'
import {BUILTIN_SUITE} from '../faults/builtin-suite.js'
import {FAULT_NAMES, getFault} from '../faults/registry.js'
import {CHECKS, UNVERIFIED_BLOCKS_BY_DEFAULT} from '../model/verdict.js'

/**
 * The suite file: scenarios (a fault with its parameters and pins, or a co-restart), stop conditions and the release
 * gate. One zod schema serves validation and `pdchaos schema suite`. Errors name the file and the path (exit 2).
 */

/** A fault's params as the file gives them; each fault's own schema (src/faults/<fault>.ts) validates them. */
const ParamsSchema = z
  .record(z.string(), z.unknown())
  .describe("The fault's parameters: `pdchaos schema suite` lists each fault's under its name.")

const RestartSchema = z
  .object({
    services: z
      .array(z.enum(['prefill', 'decode', 'router']))
      .min(1)
      .default(['prefill', 'decode', 'router'])
      .describe(
        'The roles restarted, in this order, each instance behind its health gate; all three in this (the default) ' +
          "order follow the deployment file's restartOrder: where it states one.",
      ),
    watchSeconds: z.number().min(0).max(86_400).default(5).describe('Pin watch after the canaries.'),
    healthTimeoutSeconds: z.number().positive().max(3600).default(60),
    commandTimeoutSeconds: z.number().positive().max(3600).default(120),
    canaries: z.number().int().min(0).max(100).default(2),
    settleSeconds: z
      .number()
      .min(0)
      .max(600)
      .optional()
      .describe(
        'Wait after the last health gate before the canaries. Default: one decode heartbeat interval ' +
          "(SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL from decode's environment, else 5 s).",
      ),
    only: z
      .enum(['prefill', 'decode'])
      .optional()
      .describe(
        'Restart this role alone (a pod replaced behind its Service, SGLang #34289) instead of the co-restart, ' +
          "then judge how long canaries fail against decode's heartbeat bound (services, canaries, settle and " +
          'watch do not apply).',
      ),
  })
  .strict()

/** Instances are numbered from 0 in the deployment file's order; whether one exists is known once it is read. */
const instanceIndex = (role: string) =>
  z
    .number()
    .int()
    .min(0)
    .max(511)
    .optional()
    .describe(`The ${role} instance (from 0, in the deployment file's order). Default: --${role}-instance (0).`)

const PairSchema = z
  .object({prefill: instanceIndex('prefill'), decode: instanceIndex('decode')})
  .strict()
  .describe(
    'Where the deployment lists several instances of a role: the prefill/decode pair this fault acts on and its ' +
      "pins go to. Scenarios on different pairs share a batch where their footprints do not overlap (each pair's " +
      'GPUs, ports and queues are its own).',
  )

export const ScenarioSchema = z
  .object({
    // Names are refused, not normalized, where two could read alike: no trailing space ("a" and "a " would be two
    // scenarios that print the same), and duplicates are compared with runs of spaces collapsed (below).
    name: z
      .string()
      .min(1)
      .max(80)
      .regex(/^[A-Za-z0-9][A-Za-z0-9 _.:#@-]*$/, 'letters, digits, space and _ . : # @ - only')
      .refine(
        n => !n.endsWith(' '),
        'a scenario name must not end with a space (two names differing only by it read the same)',
      ),
    fault: z.enum(FAULT_NAMES).optional(),
    params: ParamsSchema.default({}),
    pins: z
      .number()
      .int()
      .min(1)
      .max(10_000)
      .default(2)
      .describe('Pinned requests (a fault observed by abort trials sends its trials instead).'),
    repetitions: z
      .number()
      .int()
      .min(1)
      .max(100)
      .default(1)
      .describe('Run the scenario this many times (never concurrently with itself).'),
    restart: RestartSchema.optional().describe('A co-restart step instead of a fault; it always runs alone.'),
    pair: PairSchema.optional(),
    gpuHost: HostNameSchema.optional().describe(
      "The host (its name in the deployment file's hosts:) whose GPU params.gpu names: needed where ranks on " +
        'several hosts use that GPU index, as the node ranks of a multi-node instance do.',
    ),
  })
  .strict()
  .superRefine((s, ctx) => {
    if ((s.fault === undefined) === (s.restart === undefined))
      ctx.addIssue({code: 'custom', message: 'a scenario needs exactly one of fault or restart'})
    if (s.restart !== undefined && s.pair !== undefined)
      ctx.addIssue({
        code: 'custom',
        path: ['pair'],
        message: 'a co-restart restarts every instance: pair applies to a fault scenario',
      })
    if (s.gpuHost !== undefined && s.params.gpu === undefined)
      ctx.addIssue({
        code: 'custom',
        path: ['gpuHost'],
        message: 'gpuHost names the host of params.gpu, and this scenario names no GPU',
      })
    if (s.fault === undefined) return
    const checked = checkFaultParams(getFault(s.fault), s.params, 'file')
    if ('issue' in checked)
      ctx.addIssue({
        code: 'custom',
        path: checked.issue.key ? ['params', checked.issue.key] : ['params'],
        message: checked.issue.message,
      })
  })

export const StopSchema = z
  .object({
    routerUnhealthySeconds: z
      .number()
      .positive()
      .max(3600)
      .optional()
      .describe("Stop when the router's /liveness fails for longer than this."),
    collateralLossPercent: z
      .number()
      .min(0)
      .max(100)
      .optional()
      .describe("Stop when more than this share of the steady load outside the faults' reach fails."),
    kernelXid: z
      .boolean()
      .default(true)
      .describe('Stop on a new "NVRM: Xid" line in the host\'s kernel log (dmesg, else journalctl -k).'),
  })
  .strict()

export const GateSchema = z
  .object({
    maxFailedChecks: z.number().int().min(0).default(0),
    maxFaultsLeftBehind: z.number().int().min(0).default(0),
    requiredChecks: z.array(z.enum(CHECKS)).default([]).describe('Checks that must have run and passed every time.'),
    unverifiedBlocks: z
      .array(z.enum(CHECKS))
      .default([...UNVERIFIED_BLOCKS_BY_DEFAULT])
      .describe('Checks whose unverified verdicts (the check lacked its data) fail the gate. Default: eviction.'),
    minMarginMs: z
      .number()
      .min(0)
      .max(3_600_000)
      .optional()
      .describe(
        'Fail the gate when an eviction lands closer than this (ms) to the deadline or to deadline + poll:' +
          ' a watchdog drifting towards a bound fails before a pin does.',
      ),
  })
  .strict()

/**
 * The most scenarios a run plans (each scenario times its repetitions): planning compares every pair, and a run of
 * this many already takes hours. Counted on the file's raw text, before any scenario is validated, so a file of 10,000
 * is refused at once (exit 2), not after seconds of validation and a minute of planning.
 */
export const MAX_PLANNED_SCENARIOS = 1000

/**
 * Scenarios × repetitions as the file writes them (a repetitions that is not a number counts 1; its own check says).
 */
function plannedCount(raw: unknown): number {
  const scenarios = (raw as {scenarios?: unknown} | null)?.scenarios
  if (!Array.isArray(scenarios)) return 0
  let n = 0
  for (const s of scenarios) {
    const r = (s as {repetitions?: unknown} | null)?.repetitions
    n += typeof r === 'number' && Number.isInteger(r) && r > 1 ? Math.min(r, 100) : 1
  }
  return n
}

const SuiteObjectSchema = z
  .object({
    version: z.literal(1).default(1),
    name: z.string().min(1).default('suite'),
    scenarios: z.array(ScenarioSchema).min(1),
    stop: StopSchema.default({kernelXid: true}),
    gate: GateSchema.optional().describe('Present: the exit code is the release verdict (as --gate).'),
    allowCompetingTimeout: z
      .boolean()
      .default(false)
      .describe(
        "Run a scenario although one of SGLang's own timeouts (prefill's bootstrap timeout, decode's waiting " +
          'timeout or heartbeat) fires before its window closes: its pins are then unverified. Default: such a ' +
          'scenario is not run, with the reason.',
      ),
    load: z
      .object({
        intervalMs: z
          .number()
          .int()
          .min(0)
          .max(60_000)
          .default(500)
          .describe('Steady load beside every batch (0: none).'),
        promptTokens: z.number().int().min(1).max(131_072).default(128),
        canaries: z.number().int().min(1).max(100).default(2),
      })
      .strict()
      .default({intervalMs: 500, promptTokens: 128, canaries: 2}),
  })
  .strict()
  .superRefine((s, ctx) => {
    const seen = new Map<string, string>()
    s.scenarios.forEach((sc, i) => {
      // "a  b" and "a b" print alike: a duplicate too.
      const key = sc.name.replace(/ +/g, ' ')
      const other = seen.get(key)
      if (other !== undefined) {
        const alike = other === sc.name ? '' : ` (reads as ${JSON.stringify(other)})`
        ctx.addIssue({
          code: 'custom',
          path: ['scenarios', i, 'name'],
          message: `duplicate scenario name ${JSON.stringify(sc.name)}${alike}`,
        })
      }
      seen.set(key, sc.name)
    })
  })

export const SuiteSchema = z.preprocess((raw, ctx) => {
  const n = plannedCount(raw)
  if (n <= MAX_PLANNED_SCENARIOS) return raw
  ctx.addIssue({
    code: 'custom',
    path: ['scenarios'],
    input: raw,
    message:
      `${n} scenarios to plan (scenarios × repetitions) is more than the ${MAX_PLANNED_SCENARIOS} a run ` +
      `plans; split the suite into several files`,
  })
  return z.NEVER
}, SuiteObjectSchema)

export type SuiteFile = z.infer<typeof SuiteSchema>
export type ScenarioSpec = z.infer<typeof ScenarioSchema>
export type GateSpec = z.infer<typeof GateSchema>
export type StopSpec = z.infer<typeof StopSchema>

/** The built-in suite (its scenarios are stated next to the faults: faults/builtin-suite.ts). */
export const DEFAULT_SUITE_INPUT = BUILTIN_SUITE

export function defaultSuite(): SuiteFile {
  return SuiteSchema.parse(DEFAULT_SUITE_INPUT)
}

/** `pdchaos inject` as a suite: one scenario, one batch, no stop conditions (a person is watching). */
export function oneScenarioSuite(o: {
  fault: string
  params: Record<string, unknown>
  pins: number
  gpuHost?: string
  load: SuiteFile['load']
}): SuiteFile {
  return SuiteSchema.parse({
    name: o.fault,
    scenarios: [
      {
        name: o.fault,
        fault: o.fault,
        params: o.params,
        pins: o.pins,
        ...(o.gpuHost === undefined ? {} : {gpuHost: o.gpuHost}),
      },
    ],
    stop: {kernelXid: false},
    load: o.load,
  })
}

/** A suite file as the loader names it in refusals (any engine's: the vLLM probe reads it so too). */
export const SUITE_FILE: YamlFileKind = {
  what: 'suite',
  schemaCommand: 'pdchaos schema suite',
  hints: {
    missing: 'pass an existing file, or none for the built-in suite; `pdchaos schema suite` prints the shape',
    syntax: 'fix the YAML at that position',
    empty: '`pdchaos schema suite` prints what a suite file holds',
  },
}

export async function loadSuite(file: string): Promise<SuiteFile> {
  return loadYamlFile(file, SuiteSchema, SUITE_FILE)
}

/** Validate suite YAML text; `file` names it in errors. */
export function parseSuite(text: string, file: string): SuiteFile {
  return parseYamlText(text, file, SuiteSchema, SUITE_FILE)
}

export function suiteJsonSchema(): Record<string, unknown> {
  // biome-ignore lint/suspicious/noExplicitAny: zod's JSON Schema, edited in place
  const schema = z.toJSONSchema(SuiteSchema, {io: 'input', unrepresentable: 'any'}) as Record<string, any>
  // Each fault's params, from the fault's own schema: one entry per fault, titled with its name.
  const params = schema.properties?.scenarios?.items?.properties?.params
  if (params) {
    params.anyOf = FAULT_NAMES.map(name => {
      const {$schema: _s, ...one} = z.toJSONSchema(getFault(name).params, {io: 'input'}) as Record<string, unknown>
      return {title: name, ...one}
    })
    delete params.type
    delete params.propertyNames
    delete params.additionalProperties
  }
  const {$schema, ...rest} = schema
  return {$schema, title: 'pdchaos suite file', ...rest}
}
