/** nvidia-smi's CSV answers (with or without header), mapped to what discovery needs: which GPU a pid holds. */

export interface GpuRow {
  index: number
  uuid: string
  name: string
}

function csvRows(text: string): string[][] {
  return text
    .split('\n')
    .map((l) => l.trim())
    .filter(Boolean)
    .map((l) => l.split(',').map((c) => c.trim()))
}

/** `nvidia-smi --query-gpu=index,uuid,name --format=csv[,noheader]`. */
export function parseGpuList(text: string): GpuRow[] {
  return csvRows(text)
    .filter((c) => /^\d+$/.test(c[0] ?? ''))
    .map((c) => ({index: Number(c[0]), uuid: c[1] ?? '', name: c.slice(2).join(', ')}))
}

/** `nvidia-smi --query-compute-apps=pid,gpu_uuid --format=csv[,noheader]`: pid -> GPU uuids it holds. */
export function parseComputeApps(text: string): Map<number, string[]> {
  const byPid = new Map<number, string[]>()
  for (const c of csvRows(text)) {
    if (!/^\d+$/.test(c[0] ?? '') || !c[1]) continue
    const pid = Number(c[0])
    byPid.set(pid, [...(byPid.get(pid) ?? []), c[1]])
  }
  return byPid
}

/** The GPU indices each pid holds, joining the two answers by uuid. */
export function gpuIndexByPid(apps: Map<number, string[]>, gpus: GpuRow[]): Map<number, number[]> {
  const indexOf = new Map(gpus.map((g) => [g.uuid, g.index]))
  const out = new Map<number, number[]>()
  for (const [pid, uuids] of apps) {
    out.set(pid, uuids.map((u) => indexOf.get(u)).filter((i): i is number => i !== undefined))
  }
  return out
}
