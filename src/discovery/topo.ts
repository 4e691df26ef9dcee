/**
 * `nvidia-smi topo -m`: which NIC shares a PCIe switch with a GPU. The real output is a tab-separated matrix whose
 * header row is underlined with ANSI escapes on a terminal (`\x1b[4m … \x1b[0m`), one row per GPU and per NIC,
 * the diagonal ` X `, then `CPU Affinity`, `NUMA Affinity` and `GPU NUMA ID` columns, a `Legend:` block and a
 * `NIC Legend:` block mapping `NICk` to the RDMA device (`NIC0: mlx5_0`, `NIC8: mlx5_bond_0`). Pure functions.
 */

/** The PCIe relation of a GPU/NIC pair, closest first (nvidia-smi's legend; NVML's topology levels). */
export const PCIE_LEVELS = ['PIX', 'PXB', 'PHB', 'NODE', 'SYS'] as const
export type PcieLevel = (typeof PCIE_LEVELS)[number]

export interface TopoNic {
  /** The matrix label: NIC0, NIC1, … */
  label: string
  /** What the NIC Legend names it: an RDMA device (mlx5_3) or, on a host without RDMA, a netdev. */
  device?: string
}

export interface Topology {
  gpus: number[]
  nics: TopoNic[]
  /** GPU index -> NIC label -> the relation cell as printed (PIX, PXB, …). Plain JSON: discovery reports it. */
  gpuToNic: Record<string, Record<string, string>>
}

const ANSI = /\u001B\[[0-9;]*[A-Za-z]/g

export function parseNvidiaTopo(text: string): Topology {
  const lines = text.replace(ANSI, '').split('\n')
  // The header's first label is GPU0 and its second is not a cell (GPU0's own row starts `GPU0  X`).
  const headerIdx = lines.findIndex(l => {
    const t = l.trim().split(/\s+/)
    return t[0] === 'GPU0' && t[1] !== undefined && t[1] !== 'X'
  })
  const topo: Topology = {gpus: [], nics: [], gpuToNic: {}}
  if (headerIdx < 0) return topo
  // Columns: the GPU and NIC labels, in order, before "CPU Affinity".
  const cols = lines[headerIdx]!.trim()
    .split(/\s+/)
    .filter(c => /^(GPU|NIC)\d+$/.test(c))
  const nicLabels = cols.filter(c => c.startsWith('NIC'))
  const devices = new Map<string, string>()
  let inLegend = false
  for (const line of lines) {
    if (/^\s*NIC Legend:/.test(line)) {
      inLegend = true
      continue
    }
    const m = /^\s*(NIC\d+):\s*(\S+)\s*$/.exec(line)
    if (inLegend && m) devices.set(m[1]!, m[2]!)
  }
  topo.nics = nicLabels.map(label => ({label, ...(devices.has(label) ? {device: devices.get(label)!} : {})}))
  for (const line of lines.slice(headerIdx + 1)) {
    if (/^\s*(Legend:|NIC Legend:)/.test(line)) break
    // Cells are tab-separated; ` X ` and empty trailing cells are trimmed by a whitespace split, and no cell of the
    // GPU/NIC columns holds a space, so positions line up with the header's labels.
    const cells = line.trim().split(/\s+/)
    const row = /^GPU(\d+)$/.exec(cells[0] ?? '')
    if (!row) continue
    const gpu = Number(row[1])
    const rel: Record<string, string> = {}
    cols.forEach((label, i) => {
      const cell = cells[i + 1]
      if (label.startsWith('NIC') && cell !== undefined) rel[label] = cell
    })
    topo.gpus.push(gpu)
    topo.gpuToNic[String(gpu)] = rel
  }
  return topo
}

export type GpuNics =
  | {ok: true; level: 'PIX' | 'PXB'; nics: TopoNic[]; sharedWithGpus: number[]; evidence: string}
  | {ok: false; evidence: string}

/**
 * The NIC(s) of a GPU by PCIe affinity: PIX (same switch) first, then PXB (below the same host bridge). PHB, NODE
 * and SYS cross the CPU's root complex: the GPU's traffic could leave by any of those NICs, so none is "its" NIC.
 */
export function nicsOfGpu(topo: Topology, gpu: number): GpuNics {
  const rel = topo.gpuToNic[String(gpu)]
  if (!rel) {
    return {
      ok: false,
      evidence:
        topo.gpus.length === 0
          ? '`nvidia-smi topo -m` printed no GPU/NIC matrix'
          : `\`nvidia-smi topo -m\` has no row for GPU ${gpu} (GPUs ${topo.gpus.join(', ')})`,
    }
  }
  if (topo.nics.length === 0)
    return {ok: false, evidence: '`nvidia-smi topo -m` lists no NIC: this host has no RDMA NIC nvidia-smi can see'}
  for (const level of ['PIX', 'PXB'] as const) {
    const nics = topo.nics.filter(n => rel[n.label] === level)
    if (nics.length === 0) continue
    const close = (g: number, n: TopoNic) => ['PIX', 'PXB'].includes(topo.gpuToNic[String(g)]?.[n.label] ?? '')
    const shared = topo.gpus.filter(g => g !== gpu && nics.some(n => close(g, n)))
    const named = nics.map(n => `${n.label}${n.device ? ` (${n.device})` : ''}`).join(', ')
    return {
      ok: true,
      level,
      nics,
      sharedWithGpus: shared,
      evidence: `nvidia-smi topo -m: GPU${gpu} is ${level} to ${named}`,
    }
  }
  const seen = topo.nics.map(n => `${n.label} ${rel[n.label] ?? '?'}`).join(', ')
  return {
    ok: false,
    evidence:
      `nvidia-smi topo -m: no NIC is PIX or PXB to GPU${gpu} (${seen}): its KV may leave by any NIC behind ` +
      `the CPU`,
  }
}
