import {existsSync} from 'node:fs'
import {resolve} from 'node:path'

import {Flags} from '@oclif/core'

import {readEngineField} from '../deployment/engine-field.js'
import {badInput} from '../errors.js'
import {defaultSimDir} from '../state-dir.js'
import {seconds, simStateDir} from './sim-flags.js'

/**
 * Which engine a command acts on (issue 31): a deployment file's `engine:` decides (-c FILE); with --sim, `--engine`
 * picks the twin (SGLang's by default). `--sim --engine vllm` starts (or reuses) the vLLM twin in its own state dir and
 * hands the command the twin's deployment file, which it then reads exactly as `-c DIR/pdchaos.yaml`: the CLI reaches
 * the twin only as it reaches a real host.
 */

export const engineFlags = {
  engine: Flags.option({
    options: ['sglang', 'vllm'] as const,
    helpGroup: 'TARGET',
    summary:
      "With --sim: which twin, SGLang's (default) or vLLM's (its state dir: the SGLang twin's with -vllm appended). " +
      "Without --sim the deployment file's engine: decides.",
  })(),
  'sim-lease': Flags.string({
    helpGroup: 'TARGET',
    summary:
      'With --sim --engine vllm, when the command starts the vLLM twin: its kv_lease_duration in seconds (suite: 4, ' +
      "else vLLM's 30).",
  }),
  'sim-base-port': Flags.integer({
    helpGroup: 'TARGET',
    summary: "With --sim --engine vllm, when the command starts the vLLM twin: the proxy's port (default 8000).",
    min: 1,
    max: 65_000,
  }),
  'sim-side-channel-port': Flags.integer({
    helpGroup: 'TARGET',
    summary: "With --sim --engine vllm, when the command starts the vLLM twin: P's NIXL side-channel port (5600).",
    min: 1,
    max: 65_000,
  }),
}

export interface EngineTargetFlags {
  config: string
  sim: boolean
  'state-dir'?: string
  engine?: 'sglang' | 'vllm'
  'sim-lease'?: string
  'sim-base-port'?: number
  'sim-side-channel-port'?: number
}

/** The vLLM twin's default state dir: the SGLang twin's ($PDCHAOS_SIM_DIR, else ~/.local/state/pdchaos/sim) + -vllm. */
export const vllmSimDir = (env: NodeJS.ProcessEnv = process.env): string => `${defaultSimDir(env)}-vllm`

export interface VllmTarget {
  /** The `engine: vllm` deployment file the command reads, as -c would give it. */
  file: string
  /** Set when this command started the twin (its state dir). */
  startedTwin?: string
  /** The lease the started twin was given, seconds. */
  leaseS?: number
  /** NIXL's READ stall timeout the started twin was given, seconds (0: off). */
  xferStallTimeoutS?: number
}

/** How a command starts the vLLM twin when none runs: its lease and NIXL's READ stall timeout (absent: vLLM's). */
export interface VllmTwinStart {
  leaseS?: number
  xferStallTimeoutS?: number
}

const TWIN_FLAGS = ['sim-lease', 'sim-base-port', 'sim-side-channel-port'] as const

/** Exit 2 for an --engine, a vLLM twin flag or a --state-dir given where it cannot apply. */
export function checkEngineFlags(f: EngineTargetFlags): void {
  if (f.engine !== undefined && !f.sim)
    throw badInput(
      "--engine applies only with --sim: a deployment file's engine: decides which engine it is",
      'drop --engine (-c FILE runs the engine its file names), or add --sim to pick a twin',
    )
  for (const flag of TWIN_FLAGS)
    if (f[flag] !== undefined && !(f.sim && f.engine === 'vllm'))
      throw badInput(`--${flag} applies only with --sim --engine vllm`, `add --sim --engine vllm, or drop --${flag}`)
  if (f['state-dir'] !== undefined && !f.sim)
    throw badInput(
      "--state-dir applies only with --sim (it names the twin's state dir)",
      'add --sim to target the twin, or drop --state-dir and pass the deployment file with -c FILE',
    )
}

/**
 * The vLLM deployment a command acts on, or undefined for SGLang's (the command's own path): -c FILE whose engine: is
 * vllm; --sim --engine vllm (the twin started when none runs there); --sim on a state dir whose running twin is the
 * vLLM one. `before` runs before a twin is started (a check of the command's own flags).
 */
export async function vllmTarget(
  f: EngineTargetFlags,
  o: VllmTwinStart & {say: (line: string) => void; before?: () => void | Promise<void>},
): Promise<VllmTarget | undefined> {
  checkEngineFlags(f)
  if (!f.sim) {
    const file = resolve(f.config)
    if ((await readEngineField(file)) !== 'vllm') return undefined
    await o.before?.()
    return {file}
  }
  const dir = simStateDir(f['state-dir'] ?? (f.engine === 'vllm' ? vllmSimDir() : defaultSimDir()))
  const running = await runningTwinFile(dir)
  if (running) {
    const engine = await readEngineField(running)
    if (f.engine !== undefined && f.engine !== engine)
      throw badInput(
        `the twin running in ${dir} is the ${engine === 'vllm' ? 'vLLM' : 'SGLang'} twin, not --engine ${f.engine}`,
        `drop --engine, stop it (\`pdchaos sim down --state-dir ${dir}\`), or give another --state-dir`,
      )
    if (engine !== 'vllm') return undefined
    await o.before?.()
    if (TWIN_FLAGS.some(flag => f[flag] !== undefined))
      o.say(`the vLLM twin in ${dir} runs already: its settings are kept (sim down, then run again, to change them)`)
    return {file: running}
  }
  if (f.engine !== 'vllm') return undefined
  await o.before?.()
  return startVllmTwin(dir, f, o)
}

/** The deployment file of a twin running in `dir` (its lock held by live processes), else undefined. */
async function runningTwinFile(dir: string): Promise<string | undefined> {
  // The twin's code only for --sim: a run against a deployment file does not load it.
  const [{readLock, liveHolders}, {simPaths}] = await Promise.all([
    import('../sim/lifecycle/lock.js'),
    import('../sim/sim-config.js'),
  ])
  const file = simPaths(dir).deploymentFile
  const lock = readLock(dir)
  return lock !== undefined && liveHolders(lock).length > 0 && existsSync(file) ? file : undefined
}

async function startVllmTwin(
  dir: string,
  f: EngineTargetFlags,
  o: VllmTwinStart & {say: (line: string) => void},
): Promise<VllmTarget> {
  const [{vllmUp}, {fromSimError}] = await Promise.all([import('../sim/vllm/up.js'), import('./twin.js')])
  const leaseS = seconds('--sim-lease', f['sim-lease']) ?? o.leaseS
  const said = [
    ...(leaseS === undefined ? [] : [`kv_lease_duration ${leaseS}s`]),
    ...(o.xferStallTimeoutS === undefined ? [] : [`NIXL READ stall timeout ${o.xferStallTimeoutS}s`]),
  ]
  o.say(`starting the vLLM twin in ${dir}${said.length ? ` (${said.join(', ')})` : ''}`)
  try {
    const up = await vllmUp({
      stateDir: dir,
      ...(f['sim-base-port'] === undefined ? {} : {basePort: f['sim-base-port']}),
      ...(f['sim-side-channel-port'] === undefined ? {} : {sideChannelPort: f['sim-side-channel-port']}),
      ...(leaseS === undefined ? {} : {leaseDurationS: leaseS}),
      ...(o.xferStallTimeoutS === undefined ? {} : {xferStallTimeoutS: o.xferStallTimeoutS}),
      waitS: 60,
    })
    const {lease, xferStallTimeoutS} = up.config
    return {file: up.deploymentFile, startedTwin: dir, leaseS: lease.durationS, xferStallTimeoutS}
  } catch (error) {
    throw fromSimError(error)
  }
}
