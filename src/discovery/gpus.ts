/** nvidia-smi's CSV answers (with or without header), mapped to what discovery needs: which GPU a pid holds. */

export interface GpuRow {
  index: number
  uuid: string
  name: string
}

function csvRows(text: string): string[][] {
  return text
    .split('\n')
    .map(l => l.trim())
    .filter(Boolean)
    .map(l => l.split(',').map(c => c.trim()))
}

/** `nvidia-smi --query-gpu=index,uuid,name --format=csv[,noheader]`. */
export function parseGpuList(text: string): GpuRow[] {
  return csvRows(text)
    .filter(c => /^\d+$/.test(c[0] ?? ''))
    .map(c => ({index: Number(c[0]), uuid: c[1] ?? '', name: c.slice(2).join(', ')}))
}

/** One compute context of a process, as `nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory` lists it. */
export interface ComputeContext {
  uuid: string
  /** MiB; undefined when the column is absent or `[N/A]`. */
  usedMiB?: number
}

/**
 * `nvidia-smi --query-compute-apps=pid,gpu_uuid[,used_memory] --format=csv[,noheader][,nounits]`: pid -> its contexts,
 * in listed order.
 */
export function parseComputeApps(text: string): Map<number, ComputeContext[]> {
  const byPid = new Map<number, ComputeContext[]>()
  for (const c of csvRows(text)) {
    if (!/^\d+$/.test(c[0] ?? '') || !c[1]) continue
    const pid = Number(c[0])
    const mem = /^(\d+)(\s*MiB)?$/.exec(c[2] ?? '')
    byPid.set(pid, [...(byPid.get(pid) ?? []), {uuid: c[1], ...(mem ? {usedMiB: Number(mem[1])} : {})}])
  }
  return byPid
}

export interface PidGpu {
  index: number
  usedMiB?: number
  /** How many contexts the pid holds: more than one means a stray context (often on GPU 0) besides its own. */
  contexts: number
}

/**
 * The GPU each pid computes on: of its contexts, the one using the most memory. A process often holds a small stray
 * context too (a library touching cuda:0 before set_device), and nvidia-smi lists contexts by GPU, so the first listed
 * is usually that stray one. A pid with several contexts and no memory figures is left out (ambiguous).
 */
export function gpuIndexByPid(apps: Map<number, ComputeContext[]>, gpus: GpuRow[]): Map<number, PidGpu> {
  const indexOf = new Map(gpus.map(g => [g.uuid, g.index]))
  const out = new Map<number, PidGpu>()
  for (const [pid, contexts] of apps) {
    const known = contexts.filter(c => indexOf.has(c.uuid))
    if (known.length === 0) continue
    if (known.length > 1 && known.some(c => c.usedMiB === undefined)) continue
    const best = known.reduce((a, b) => ((b.usedMiB ?? 0) > (a.usedMiB ?? 0) ? b : a))
    out.set(pid, {
      index: indexOf.get(best.uuid)!,
      ...(best.usedMiB === undefined ? {} : {usedMiB: best.usedMiB}),
      contexts: contexts.length,
    })
  }
  return out
}

/** What fixes a scheduler's GPU without nvidia-smi: its server's layout and base GPU id, and CUDA_VISIBLE_DEVICES. */
export interface GpuLayout {
  tpSize: number
  ppSize: number
  dpSize: number
  enableDpAttention: boolean
  baseGpuId: number
  gpuIdStep: number
  /** --nnodes: an instance over several nodes numbers its GPUs per node (1: one node). */
  nnodes?: number
  /** The scheduler's CUDA_VISIBLE_DEVICES, as set (indices or GPU uuids); undefined: all GPUs, in order. */
  cudaVisibleDevices?: string
}

/**
 * The physical GPU of a scheduler, as SGLang picks it: gpu_id = base_gpu_id + (plain DP: dp_rank × tp × pp × step)
 * + pp_rank × tp + tp_rank × step (`managers/data_parallel_controller.py` `launch_dp_schedulers` and
 * `launch_tensor_parallel_group`; one node), then CUDA_VISIBLE_DEVICES[gpu_id] when that is set. With DP attention the
 * title's TP rank already counts across DP groups, so no DP offset. Over --nnodes N, each node numbers its own GPUs:
 * tp_size_per_node = tp / max(N / pp, 1), pp_size_per_node = max(pp / N, 1), and gpu_id = base_gpu_id +
 * (pp_rank % pp_size_per_node) × tp_size_per_node + (tp_rank % tp_size_per_node) × step, the title keeping the global
 * TP rank (`entrypoints/engine.py` `_launch_subprocesses`). Undefined when the list is too short or names a device this
 * host does not list.
 */
export function gpuFromLayout(
  l: GpuLayout,
  rank: {tpRank: number; dpRank?: number; ppRank?: number},
  gpus: GpuRow[],
): {index: number; local: number} | undefined {
  const dpOffset = !l.enableDpAttention && l.dpSize > 1 ? (rank.dpRank ?? 0) * l.tpSize * l.ppSize * l.gpuIdStep : 0
  const nnodes = Math.max(1, l.nnodes ?? 1)
  const tpPerNode = Math.max(1, Math.floor(l.tpSize / Math.max(Math.floor(nnodes / l.ppSize), 1)))
  const ppPerNode = Math.max(Math.floor(l.ppSize / nnodes), 1)
  const local =
    l.baseGpuId + dpOffset + ((rank.ppRank ?? 0) % ppPerNode) * tpPerNode + (rank.tpRank % tpPerNode) * l.gpuIdStep
  const cvd = l.cudaVisibleDevices?.trim()
  if (cvd === undefined || cvd === '') return {index: local, local}
  const entry = cvd.split(',').map(x => x.trim())[local]
  if (entry === undefined) return undefined
  if (/^\d+$/.test(entry)) return {index: Number(entry), local}
  const byUuid = gpus.find(g => g.uuid === entry || g.uuid === `GPU-${entry}` || g.uuid.startsWith(entry))
  return byUuid ? {index: byUuid.index, local} : undefined
}
