import {parse as parseYaml} from 'yaml'

/**
 * An SGLang server's launch arguments, as discovery needs them: its role and port (which deployment a scheduler belongs
 * to) and its parallel layout (which GPU each scheduler runs on). Read from the launch command (`ps`) and, with
 * `--config FILE`, from SGLang's YAML config file. Pure functions.
 *
 * Upstream (`python/sglang/srt/server_args_config_parser.py`, `ConfigArgumentMerger.merge_config_with_args`): every
 * top-level key `k: v` of the YAML becomes `--k v` (a list `--k a b`, a boolean `--k true|false` or, for store_true
 * flags, `--k` when true), inserted *before* the command-line arguments, so the command line wins: CLI > config >
 * defaults.
 */
export interface LaunchArgs {
  mode?: 'prefill' | 'decode'
  host?: string
  port?: number
  tpSize?: number
  dpSize?: number
  ppSize?: number
  epSize?: number
  enableDpAttention?: boolean
  baseGpuId?: number
  gpuIdStep?: number
  bootstrapPort?: number
  /** A multi-node instance (--nnodes N --node-rank K --dist-init-addr HOST:PORT): its node count, this node's rank. */
  nnodes?: number
  nodeRank?: number
  distInitAddr?: string
  /** The `--config FILE` path, when the command line names one. */
  configFile?: string
}

/** SGLang's spellings of each flag (server_args.py add_cli_args), the first the canonical one. */
const FLAGS: Record<
  Exclude<keyof LaunchArgs, 'configFile' | 'enableDpAttention' | 'mode' | 'host' | 'distInitAddr'>,
  string[]
> = {
  port: ['port'],
  tpSize: ['tp-size', 'tensor-parallel-size', 'tp'],
  dpSize: ['dp-size', 'data-parallel-size', 'dp'],
  ppSize: ['pp-size', 'pipeline-parallel-size', 'pp'],
  epSize: ['ep-size', 'expert-parallel-size', 'ep'],
  baseGpuId: ['base-gpu-id'],
  gpuIdStep: ['gpu-id-step'],
  bootstrapPort: ['disaggregation-bootstrap-port'],
  nnodes: ['nnodes'],
  nodeRank: ['node-rank'],
}

/** Split a `ps` args string into words (SGLang's own arguments hold no spaces that matter here). */
function words(args: string): string[] {
  return args.trim().split(/\s+/).filter(Boolean)
}

/**
 * `--name value` / `--name=value` pairs of an argv, later ones winning (argparse's rule). Names without dashes, `_` as
 * `-`.
 */
function flagValues(argv: string[]): Map<string, string | true> {
  const out = new Map<string, string | true>()
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!
    if (!a.startsWith('--')) continue
    const eq = a.indexOf('=')
    const name = (eq > 0 ? a.slice(2, eq) : a.slice(2)).replaceAll('_', '-')
    if (eq > 0) out.set(name, a.slice(eq + 1))
    else if (argv[i + 1] !== undefined && !argv[i + 1]!.startsWith('--')) out.set(name, argv[++i]!)
    else out.set(name, true)
  }
  return out
}

function fromFlags(values: Map<string, string | true>): LaunchArgs {
  const out: LaunchArgs = {}
  for (const [key, names] of Object.entries(FLAGS) as Array<[keyof typeof FLAGS, string[]]>) {
    for (const n of names) {
      const v = values.get(n)
      if (typeof v === 'string' && /^\d+$/.test(v)) {
        out[key] = Number(v)
        break
      }
    }
  }
  const mode = values.get('disaggregation-mode')
  if (mode === 'prefill' || mode === 'decode') out.mode = mode
  const host = values.get('host')
  if (typeof host === 'string') out.host = host
  const dpa = values.get('enable-dp-attention')
  if (dpa !== undefined) out.enableDpAttention = dpa === true || /^(true|1|yes)$/i.test(dpa)
  const dist = values.get('dist-init-addr') ?? values.get('nccl-init-addr')
  if (typeof dist === 'string') out.distInitAddr = dist
  const config = values.get('config')
  if (typeof config === 'string') out.configFile = config
  return out
}

/** The launch arguments on a command line (`ps` args), `--config FILE` included but not read. */
export function parseLaunchCommand(args: string): LaunchArgs {
  return fromFlags(flagValues(words(args)))
}

/**
 * Does this command line look like an SGLang server launch (a disaggregation mode, or a config file that may hold it)?
 */
export function isServerLaunch(args: string): boolean {
  return /(^|\s)--disaggregation[-_]mode[ =]/.test(args) || /(^|\s)--config[ =]\S+\.ya?ml\b/.test(args)
}

/**
 * SGLang's YAML config file as arguments, converted as ConfigArgumentMerger does (keys become `--key`). A file that is
 * not a mapping throws, naming what it found.
 */
export function parseConfigYaml(text: string): LaunchArgs {
  const data = parseYaml(text) as unknown
  if (data === null || data === undefined) return {}
  if (typeof data !== 'object' || Array.isArray(data))
    throw new Error('the config file must hold a mapping at its top level')
  const values = new Map<string, string | true>()
  for (const [k, v] of Object.entries(data as Record<string, unknown>)) {
    const name = k.replace(/^-+/, '').replaceAll('_', '-')
    if (typeof v === 'boolean') values.set(name, v ? true : 'false')
    else if (Array.isArray(v)) values.set(name, v.map(String).join(','))
    else if (v !== null && v !== undefined) values.set(name, String(v))
  }
  return fromFlags(values)
}

/** The file's arguments under the command line's (CLI > config), as SGLang merges them. */
export function mergeLaunchArgs(fromFile: LaunchArgs, fromCli: LaunchArgs): LaunchArgs {
  return {...fromFile, ...fromCli}
}
