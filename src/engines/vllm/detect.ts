import type {ProcessLine} from '../engine.js'

/**
 * Recognising a vLLM server from what a host shows (pure): process titles, the `vllm serve` command line and its
 * `--kv-transfer-config`, and /metrics names.
 *
 * Titles: vLLM's `set_process_title(name, suffix, prefix=envs.VLLM_PROCESS_NAME_PREFIX)` writes `f"{prefix}::{name}"`
 * (`{name}_{suffix}` with a suffix), and VLLM_PROCESS_NAME_PREFIX defaults to "VLLM" (vllm/envs.py): so
 * `VLLM::EngineCore` and `VLLM::Worker_TP<n>` by default, another prefix when the operator set one. The titles are
 * therefore matched with any prefix, but only under a `vllm serve` process (vllmProcessTrees). The exact worker
 * suffix rules (_DP/_PP/_EP parts) were not read in the source: unconfirmed.
 */

export const ENGINE_CORE_TITLE = /^[^\s:]+::EngineCore(?:_DP\d+)?(?=\s|$)/
export const WORKER_TITLE = /^[^\s:]+::Worker(?:_[A-Z]+\d+)*?_TP(\d+)(?:_[A-Z]+\d+)*(?=\s|$)/

/** The argv words of a command line as ps shows it (space-separated; the JSON config has no spaces when written so). */
const words = (args: string): string[] => args.split(/\s+/).filter(w => w !== '')

/** A `vllm serve` API server (or `python -m vllm.entrypoints.openai.api_server`). */
export function isVllmServer(args: string): boolean {
  const w = words(args)
  for (let i = 0; i < w.length; i++) {
    if (/(^|\/)vllm$/.test(w[i]!) && w[i + 1] === 'serve') return true
    if (w[i] === 'vllm.entrypoints.openai.api_server') return true
  }
  return false
}

/** The value of `--flag V` or `--flag=V` in an argv. */
export function flagValue(argv: readonly string[], flag: string): string | undefined {
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === flag) return argv[i + 1]
    if (argv[i]!.startsWith(`${flag}=`)) return argv[i]!.slice(flag.length + 1)
  }
  return undefined
}

/** The server's listening port from its command line (vLLM's default 8000 when absent). */
export function serverPort(argv: readonly string[]): number {
  const v = flagValue(argv, '--port')
  return v !== undefined && /^\d+$/.test(v) ? Number(v) : 8000
}

/** `--kv-transfer-config` parsed (undefined when absent; an error text when it is not a JSON object). */
export function kvTransferConfig(argv: readonly string[]): Record<string, unknown> | string | undefined {
  const raw = flagValue(argv, '--kv-transfer-config')
  if (raw === undefined) return undefined
  try {
    const v = JSON.parse(raw) as unknown
    return typeof v === 'object' && v !== null && !Array.isArray(v) ? (v as Record<string, unknown>) : 'not an object'
  } catch {
    return `not JSON: ${raw.slice(0, 60)}`
  }
}

export interface VllmProcessTree {
  server: ProcessLine
  engineCores: ProcessLine[]
  workers: {tpRank: number; process: ProcessLine}[]
}

/** Each vLLM API server in a process list with its engine core(s) and workers (children, then grandchildren). */
export function vllmProcessTrees(rows: readonly ProcessLine[]): VllmProcessTree[] {
  return rows
    .filter(r => isVllmServer(r.args))
    .map(server => {
      const engineCores = rows.filter(r => r.ppid === server.pid && ENGINE_CORE_TITLE.test(r.args))
      const parents = new Set([server.pid, ...engineCores.map(e => e.pid)])
      const workers = rows.flatMap(r => {
        const m = parents.has(r.ppid) ? WORKER_TITLE.exec(r.args) : null
        return m ? [{tpRank: Number(m[1]), process: r}] : []
      })
      return {server, engineCores, workers: workers.sort((a, b) => a.tpRank - b.tpRank)}
    })
}

/** vLLM's metric names carry the `vllm:` prefix (vllm/v1/metrics/loggers.py, PrometheusStatLogger). */
export function isVllmMetricsText(text: string): boolean {
  return /^vllm:[a-z_]+/m.test(text)
}
