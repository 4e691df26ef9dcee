import type {ProcessLine} from '../engine.js'

/**
 * Recognising a vLLM server from what a host shows (pure): process titles, the `vllm serve` command line and its
 * `--kv-transfer-config`, and /metrics names.
 *
 * Titles: vLLM sets `VLLM::EngineCore` on the engine-core process and `VLLM::Worker_TP<n>` (with _DP/_PP/_EP parts when
 * those sizes exceed 1) on workers, with setproctitle (vllm/utils/system_utils.py `set_process_title`, PRs #21445,
 * #22205 per reference/vllm-pd.md; the suffix rules were not read in the source: unconfirmed).
 */

export const ENGINE_CORE_TITLE = /^VLLM::EngineCore(?:_DP\d+)?(?=\s|$)/
export const WORKER_TITLE = /^VLLM::Worker(?:_[A-Z]+\d+)*?_TP(\d+)(?:_[A-Z]+\d+)*(?=\s|$)/

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
