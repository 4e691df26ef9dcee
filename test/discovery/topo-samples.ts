/** `nvidia-smi topo -m` samples in the real tool's layout, for the parser and plan tests. */

/**
 * `nvidia-smi topo -m` as it prints on a rail-optimized 8 × H100 host (tabs between cells, the header underlined with
 * SGR escapes, ` X ` on the diagonal, CPU/NUMA columns, GPU rows ending `N/A`, NIC rows ending in empty cells).
 */
const row = (label: string, cells: string[], tail: string) => `${label}\t${cells.join('\t')}\t${tail}`
const numa = (i: number) => (i < 4 ? 0 : 1)
const rel = (a: number, b: number) => (numa(a) === numa(b) ? 'NODE' : 'SYS')

export function railHost(
  devices = ['mlx5_0', 'mlx5_3', 'mlx5_4', 'mlx5_5', 'mlx5_6', 'mlx5_7', 'mlx5_8', 'mlx5_9'],
): string {
  const gpus = 8
  const nics = 8
  const header =
    '\t\u001B[4m' +
    [
      ...Array.from({length: gpus}, (_, i) => `GPU${i}`),
      ...Array.from({length: nics}, (_, i) => `NIC${i}`),
      'CPU Affinity',
      'NUMA Affinity',
      'GPU NUMA ID',
    ].join('\t') +
    '\u001B[0m'
  const lines = [header]
  for (let g = 0; g < gpus; g++) {
    const cells = [
      ...Array.from({length: gpus}, (_, h) => (h === g ? ' X ' : 'NV18')),
      ...Array.from({length: nics}, (_, n) => (n === g ? 'PIX' : rel(g, n))),
    ]
    lines.push(row(`GPU${g}`, cells, `${numa(g) === 0 ? '0-55,112-167' : '56-111,168-223'}\t${numa(g)}\t\tN/A`))
  }
  for (let n = 0; n < nics; n++) {
    const cells = [
      ...Array.from({length: gpus}, (_, g) => (n === g ? 'PIX' : rel(g, n))),
      ...Array.from({length: nics}, (_, m) => (m === n ? ' X ' : rel(n, m))),
    ]
    lines.push(row(`NIC${n}`, cells, '\t\t\t'))
  }
  lines.push(
    '',
    'Legend:',
    '',
    '  X    = Self',
    '  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)',
    '  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node',
    '  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)',
    '  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)',
    '  PIX  = Connection traversing at most a single PCIe bridge',
    '  NV#  = Connection traversing a bonded set of # NVLinks',
    '',
    'NIC Legend:',
    '',
  )
  // A real legend's numbering need not follow the device numbers (mlx5_1, mlx5_2 may be storage or bonded ports).
  for (let n = 0; n < nics; n++) lines.push(`  NIC${n}: ${devices[n]}`)
  lines.push('', '')
  return lines.join('\n')
}

/** 8 GPUs, 4 NICs, two GPUs per PCIe switch tree: each GPU is PXB to its pair's NIC, no GPU is PIX to any. */
export const FEWER_NICS = [
  '\tGPU0\tGPU1\tGPU2\tGPU3\tGPU4\tGPU5\tGPU6\tGPU7\tNIC0\tNIC1\tNIC2\tNIC3\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID',
  'GPU0\t X \tNV12\tNV12\tNV12\tNV12\tNV12\tNV12\tNV12\tPXB\tNODE\tSYS\tSYS\t0-47\t0\t\tN/A',
  'GPU1\tNV12\t X \tNV12\tNV12\tNV12\tNV12\tNV12\tNV12\tPXB\tNODE\tSYS\tSYS\t0-47\t0\t\tN/A',
  'GPU2\tNV12\tNV12\t X \tNV12\tNV12\tNV12\tNV12\tNV12\tNODE\tPXB\tSYS\tSYS\t0-47\t0\t\tN/A',
  'GPU3\tNV12\tNV12\tNV12\t X \tNV12\tNV12\tNV12\tNV12\tNODE\tPXB\tSYS\tSYS\t0-47\t0\t\tN/A',
  'GPU4\tNV12\tNV12\tNV12\tNV12\t X \tNV12\tNV12\tNV12\tSYS\tSYS\tPXB\tNODE\t48-95\t1\t\tN/A',
  'GPU5\tNV12\tNV12\tNV12\tNV12\tNV12\t X \tNV12\tNV12\tSYS\tSYS\tPXB\tNODE\t48-95\t1\t\tN/A',
  'GPU6\tNV12\tNV12\tNV12\tNV12\tNV12\tNV12\t X \tNV12\tSYS\tSYS\tNODE\tPHB\t48-95\t1\t\tN/A',
  'GPU7\tNV12\tNV12\tNV12\tNV12\tNV12\tNV12\tNV12\t X \tSYS\tSYS\tNODE\tPHB\t48-95\t1\t\tN/A',
  'NIC0\tPXB\tPXB\tNODE\tNODE\tSYS\tSYS\tSYS\tSYS\t X \tNODE\tSYS\tSYS\t\t\t\t',
  'NIC1\tNODE\tNODE\tPXB\tPXB\tSYS\tSYS\tSYS\tSYS\tNODE\t X \tSYS\tSYS\t\t\t\t',
  'NIC2\tSYS\tSYS\tSYS\tSYS\tPXB\tPXB\tNODE\tNODE\tSYS\tSYS\t X \tNODE\t\t\t\t',
  'NIC3\tSYS\tSYS\tSYS\tSYS\tNODE\tNODE\tPHB\tPHB\tSYS\tSYS\tNODE\t X \t\t\t\t',
  '',
  'Legend:',
  '',
  '  X    = Self',
  '  PIX  = Connection traversing at most a single PCIe bridge',
  '',
  'NIC Legend:',
  '',
  '  NIC0: mlx5_0',
  '  NIC1: mlx5_1',
  '  NIC2: mlx5_2',
  '  NIC3: mlx5_bond_0',
  '',
].join('\n')
