/**
 * What pdchaos needs of an inference engine (issue 31): its name, how discovery confirms it from what a host shows
 * (process titles and command lines, /metrics names), its deadline model, its metric names and their freshness, and
 * the texts its logs give for releasing a request's KV. One folder per engine (engines/sglang/, engines/vllm/) holds
 * its implementation and what else is the engine's own (docs/architecture.md, "Adding an engine", which also lists
 * what of SGLang's is still outside its folder: its runner and faults, its deployment file's fields).
 */

export const ENGINE_NAMES = ['sglang', 'vllm'] as const
export type EngineName = (typeof ENGINE_NAMES)[number]

/** Where a value was read: the launch command line, the process environment, the deployment file, or a default. */
export type ValueSource = 'cmdline' | 'env' | 'file' | 'derived' | 'default' | 'endpoint'

export interface Sourced<T> {
  value: T
  source: ValueSource
  /** What exactly was read (a flag, a variable, a rule), for the report. */
  detail: string
}

/** A process as the host lists it (`ps -eo pid=,ppid=,stat=,args=`). */
export interface ProcessLine {
  pid: number
  ppid: number
  args: string
}

export interface EngineDeadlineModel {
  /** 'watchdog': SGLang's prefill watchdog contract; 'kv-lease': vLLM's NIXL lease (or its legacy abort timeout). */
  kind: 'watchdog' | 'kv-lease'
  /** One line: what bounds how long the producer keeps a request's KV after the consumer is gone. */
  summary: string
}

/**
 * One text an engine (or its gateway) gives for letting go of a request's KV, as the checks match it: the first text
 * whose `re` matches an answer or log line names the cause; with `byState`, the regex's first group is the state the
 * engine names (SGLang's `KVPoll.<state>`) and picks a more precise cause, `cause` when the state is not listed.
 */
export interface ReleaseText<C extends string = string> {
  cause: C
  re: RegExp
  byState?: Readonly<Record<string, C>>
}

/** Where a pinned request waits, in the engine's own names (SGLang: the prefill queue and its KVPoll state). */
export interface PinStateName {
  /** The engine's name for the state (SGLang's KVPoll value). */
  name: string
  /** The queue or structure that holds the request in that state. */
  where: string
  /** What lets go of it there: the deadline or path that applies. */
  releasedBy: string
}

export interface Engine {
  name: EngineName
  /** The processes of this engine among a host's processes (empty: the engine is not confirmed there). */
  processesOf(rows: readonly ProcessLine[]): ProcessLine[]
  /** Whether a /metrics text is this engine's (its metric-name prefix). */
  metricsAreOurs(text: string): boolean
  deadline: EngineDeadlineModel
  /** Metric names pdchaos reads, and how fresh they are (when the engine updates them). */
  metrics: {names: readonly string[]; freshness: string}
  /** Log texts that say the producer released a request's KV, and why. */
  releaseCauses: readonly {cause: string; text: string}[]
  /** The same as data the checks match (absent: the checks have no texts of this engine yet). */
  releaseTexts?: readonly ReleaseText[]
  /** The states a pinned request can wait in (absent: the engine's pins are not named by state). */
  pinStates?: readonly PinStateName[]
}
