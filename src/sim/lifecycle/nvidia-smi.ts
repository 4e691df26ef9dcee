import {createHash} from 'node:crypto'
import {chmodSync, mkdirSync, renameSync, writeFileSync} from 'node:fs'
import {join} from 'node:path'

/**
 * The twin's stand-in for nvidia-smi: a self-contained node script written to DIR/bin/nvidia-smi (on the
 * PATH of the twin's services). It answers the queries pdchaos's discovery uses, in nvidia-smi's CSV format,
 * from the DIR/gpus/<index>.json files the rank processes write, and `nvidia-smi topo -m` (-mp) in the real
 * tool's layout: tab-separated cells, the header underlined with SGR escapes, the Legend and, with rail NICs,
 * the NIC Legend (a rail-optimized host: GPU g is PIX to NIC g).
 */

export const GPU_NAME = 'NVIDIA H100 80GB HBM3'

/** A GPU uuid that is stable for a state dir and index: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx. */
export function gpuUuid(stateDir: string, index: number): string {
  const h = createHash('sha256').update(`${stateDir}\0gpu\0${index}`).digest('hex')
  return `GPU-${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20, 32)}`
}

/**
 * Write DIR/bin/nvidia-smi (atomically) for a twin with `gpus` GPUs and NICs `nics` (NIC i's name, and the GPU it is
 * PIX to: GPU i for a bare name; a node of a twin that spans nodes has the NICs of its own GPUs only); returns its path.
 * hideProcesses: it lists no compute processes, as nvidia-smi inside a container does (the host's pids are not its own).
 */
export function writeNvidiaSmi(stateDir: string, gpus: number, nics: ReadonlyArray<string | {name: string; gpu: number}> = [], view: {hideProcesses: boolean} = {hideProcesses: false}): string {
  const names = nics.map((n) => (typeof n === 'string' ? n : n.name))
  const nicGpus = nics.map((n, i) => (typeof n === 'string' ? i : n.gpu))
  const bin = join(stateDir, 'bin')
  mkdirSync(bin, {recursive: true})
  const uuids = Array.from({length: gpus}, (_, i) => gpuUuid(stateDir, i))
  // The script is CommonJS whatever package.json encloses the state dir.
  writeFileSync(join(bin, 'package.json'), '{"type": "commonjs"}\n')
  const file = join(bin, 'nvidia-smi')
  const tmp = `${file}.${process.pid}.tmp`
  writeFileSync(tmp, SCRIPT.replace('__UUIDS__', JSON.stringify(uuids)).replace('__NAME__', JSON.stringify(GPU_NAME)).replace('__NICS__', JSON.stringify(names)).replace('__NIC_GPUS__', JSON.stringify(nicGpus)).replace('__HIDE__', JSON.stringify(view.hideProcesses)))
  chmodSync(tmp, 0o755)
  renameSync(tmp, file)
  return file
}

// Plain JavaScript (runs with whatever node is on the PATH, no build, no dependencies).
const SCRIPT = String.raw`#!/usr/bin/env node
// nvidia-smi stand-in written by pdchaos sim up. GPUs and uuids are fixed for this state dir;
// compute apps come from ../gpus/<index>.json written by the twin's rank processes.
'use strict'
const fs = require('fs')
const path = require('path')
const UUIDS = __UUIDS__
const NAME = __NAME__
const NICS = __NICS__
const NIC_GPUS = __NIC_GPUS__
const MEM_TOTAL = 81559
const STATE_DIR = path.dirname(path.dirname(fs.realpathSync(process.argv[1])))

function fail(msg, code) {
  process.stdout.write(msg + '\n')
  process.exit(code)
}
const usageError = () => fail('Invalid combination of input arguments. Please run \'nvidia-smi -h\' for help.\n', 2)

function alive(pid) {
  try {
    const stat = fs.readFileSync('/proc/' + pid + '/stat', 'utf8')
    const state = stat.slice(stat.lastIndexOf(')') + 2).split(' ')[0]
    return state !== 'Z' && state !== 'X'
  } catch (e) {
    return false
  }
}

function processName(pid) {
  try {
    const argv0 = fs.readFileSync('/proc/' + pid + '/cmdline', 'utf8').split('\0')[0]
    if (argv0) return argv0
  } catch (e) {}
  return '[Not Found]'
}

// Each rank's own context (72000 MiB), and its stray one (STRAY_MIB) when it holds one, listed by GPU as nvidia-smi
// does: a stray context on GPU 0 comes before the rank's own.
function contexts() {
  const out = []
  for (let i = 0; i < UUIDS.length; i++) {
    let held
    try {
      held = JSON.parse(fs.readFileSync(path.join(STATE_DIR, 'gpus', i + '.json'), 'utf8'))
    } catch (e) {
      continue
    }
    if (!held || !Number.isInteger(held.pid) || !alive(held.pid)) continue
    out.push({index: i, pid: held.pid, role: held.role, tpRank: held.tpRank, mib: USED_MIB})
    if (Number.isInteger(held.strayGpu) && held.strayGpu >= 0 && held.strayGpu < UUIDS.length) out.push({index: held.strayGpu, pid: held.pid, role: held.role, tpRank: held.tpRank, mib: STRAY_MIB})
  }
  return out.sort((a, b) => a.index - b.index || a.mib - b.mib)
}
const apps = () => (HIDE ? [] : contexts())

const USED_MIB = 72000
const STRAY_MIB = 500
const HIDE = __HIDE__
const GPU_FIELDS = {
  index: {unit: '', get: (g) => String(g.index)},
  uuid: {unit: '', get: (g) => g.uuid},
  gpu_uuid: {unit: '', get: (g) => g.uuid},
  name: {unit: '', get: () => NAME},
  gpu_name: {unit: '', get: () => NAME},
  'pci.bus_id': {unit: '', get: (g) => '00000000:' + (0x18 + g.index * 0x10).toString(16).toUpperCase().padStart(2, '0') + ':00.0'},
  'memory.total': {unit: 'MiB', get: () => String(MEM_TOTAL)},
  'memory.used': {unit: 'MiB', get: (g) => String(g.busy ? USED_MIB : 0)},
  'memory.free': {unit: 'MiB', get: (g) => String(MEM_TOTAL - (g.busy ? USED_MIB : 0))},
  'utilization.gpu': {unit: '%', get: (g) => String(g.busy ? 37 : 0)},
  count: {unit: '', get: () => String(UUIDS.length)},
  driver_version: {unit: '', get: () => '570.133.20'},
}
const APP_FIELDS = {
  pid: {unit: '', get: (a) => String(a.pid)},
  gpu_uuid: {unit: '', get: (a) => UUIDS[a.index]},
  gpu_name: {unit: '', get: () => NAME},
  process_name: {unit: '', get: (a) => processName(a.pid)},
  name: {unit: '', get: (a) => processName(a.pid)},
  used_memory: {unit: 'MiB', get: (a) => String(a.mib)},
  used_gpu_memory: {unit: 'MiB', get: (a) => String(a.mib)},
  gpu_bus_id: {unit: '', get: (a) => GPU_FIELDS['pci.bus_id'].get({index: a.index})},
}

function csv(fieldsSpec, table, rows, format) {
  const fields = fieldsSpec.split(',').map((f) => f.trim()).filter(Boolean)
  if (fields.length === 0) usageError()
  for (const f of fields) if (!table[f]) fail('Field "' + f + '" is not a valid field to query.\n', 2)
  const noheader = format.includes('noheader')
  const nounits = format.includes('nounits')
  const lines = []
  if (!noheader) lines.push(fields.map((f) => (table[f].unit && !nounits ? f + ' [' + table[f].unit + ']' : f)).join(', '))
  for (const r of rows) {
    lines.push(fields.map((f) => {
      const v = table[f].get(r)
      return table[f].unit && !nounits && table[f].unit !== '%' ? v + ' ' + table[f].unit : table[f].unit === '%' && !nounits ? v + ' %' : v
    }).join(', '))
  }
  process.stdout.write(lines.length ? lines.join('\n') + '\n' : '')
}

function gpus() {
  const busy = new Set(contexts().filter((a) => a.mib === USED_MIB).map((a) => a.index))
  return UUIDS.map((uuid, index) => ({index, uuid, busy: busy.has(index)}))
}

function table() {
  const now = new Date().toString().split(' GMT')[0]
  const l = []
  l.push(now)
  l.push('+-----------------------------------------------------------------------------------------+')
  l.push('| NVIDIA-SMI 570.133.20             Driver Version: 570.133.20     CUDA Version: 12.8     |')
  l.push('|-----------------------------------------+------------------------+----------------------+')
  l.push('| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |')
  l.push('|=========================================+========================+======================|')
  for (const g of gpus()) {
    const mem = (g.busy ? USED_MIB : 0) + 'MiB / ' + MEM_TOTAL + 'MiB'
    l.push('|   ' + String(g.index).padEnd(2) + ' ' + NAME.padEnd(24) + '  On   | ' + GPU_FIELDS['pci.bus_id'].get(g) + ' Off | ' + mem.padStart(20) + ' |')
  }
  l.push('+-----------------------------------------------------------------------------------------+')
  l.push('| Processes:                                                                              |')
  l.push('|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |')
  l.push('|=========================================================================================|')
  const as = apps()
  if (as.length === 0) l.push('|  No running processes found                                                             |')
  for (const a of as) {
    l.push('|  ' + String(a.index).padStart(3) + '   N/A  N/A  ' + String(a.pid).padStart(12) + '      C   ' + processName(a.pid).slice(0, 34).padEnd(34) + '  ' + (a.mib + 'MiB').padStart(10) + ' |')
  }
  l.push('+-----------------------------------------------------------------------------------------+')
  process.stdout.write(l.join('\n') + '\n')
}

// topo -m: an 8-GPU H100 SXM host, two sockets (GPUs 0..n/2-1 and their NICs on NUMA node 0), NVSwitch between
// all GPUs (NV18), one NIC per GPU behind the GPU's own PCIe switch (PIX); further away: NODE on the same socket,
// SYS across. Cells are tab-separated, as nvidia-smi prints them (GPU rows end CPU, NUMA, two tabs, N/A; NIC rows
// end in four tabs), and the header row is underlined with SGR escapes even into a pipe.
const numaOf = (i) => (i < Math.ceil(UUIDS.length / 2) ? 0 : 1)
const CPU_AFFINITY = ['0-55,112-167', '56-111,168-223']
function topo(pcieOnly) {
  const gpuN = UUIDS.length
  const cols = []
  for (let i = 0; i < gpuN; i++) cols.push('GPU' + i)
  for (let j = 0; j < NICS.length; j++) cols.push('NIC' + j)
  const pcie = (a, b) => (numaOf(a) === numaOf(b) ? 'NODE' : 'SYS')
  const gpuGpu = (a, b) => (a === b ? ' X ' : pcieOnly ? pcie(a, b) : 'NV18')
  // NIC n sits behind its GPU's PCIe switch: PIX to that GPU, placed on that GPU's socket.
  const gpuNic = (g, n) => (g === NIC_GPUS[n] ? 'PIX' : pcie(g, NIC_GPUS[n]))
  const nicNic = (a, b) => (a === b ? ' X ' : pcie(NIC_GPUS[a], NIC_GPUS[b]))
  const l = []
  l.push('\t\x1b[4m' + cols.concat(['CPU Affinity', 'NUMA Affinity', 'GPU NUMA ID']).join('\t') + '\x1b[0m')
  for (let g = 0; g < gpuN; g++) {
    const cells = []
    for (let h = 0; h < gpuN; h++) cells.push(gpuGpu(g, h))
    for (let n = 0; n < NICS.length; n++) cells.push(gpuNic(g, n))
    l.push('GPU' + g + '\t' + cells.join('\t') + '\t' + CPU_AFFINITY[numaOf(g)] + '\t' + numaOf(g) + '\t\tN/A')
  }
  for (let n = 0; n < NICS.length; n++) {
    const cells = []
    for (let g = 0; g < gpuN; g++) cells.push(gpuNic(g, n))
    for (let m = 0; m < NICS.length; m++) cells.push(nicNic(n, m))
    l.push('NIC' + n + '\t' + cells.join('\t') + '\t\t\t\t')
  }
  l.push('')
  l.push('Legend:')
  l.push('')
  l.push('  X    = Self')
  l.push('  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)')
  l.push('  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node')
  l.push('  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)')
  l.push('  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)')
  l.push('  PIX  = Connection traversing at most a single PCIe bridge')
  l.push('  NV#  = Connection traversing a bonded set of # NVLinks')
  if (NICS.length > 0) {
    l.push('')
    l.push('NIC Legend:')
    l.push('')
    for (let n = 0; n < NICS.length; n++) l.push('  NIC' + n + ': ' + NICS[n])
    l.push('')
  }
  process.stdout.write(l.join('\n') + '\n')
}

const args = process.argv.slice(2)
if (args.length === 0) {
  table()
  process.exit(0)
}
if (args[0] === 'topo') {
  const rest = args.slice(1)
  if (rest.length === 1 && (rest[0] === '-m' || rest[0] === '--matrix')) topo(false)
  else if (rest.length === 1 && (rest[0] === '-mp' || rest[0] === '--matrix_pci')) topo(true)
  else usageError()
  process.exit(0)
}
let queryGpu, queryApps, format, list = false
for (let i = 0; i < args.length; i++) {
  const a = args[i]
  const eq = a.indexOf('=')
  const name = eq >= 0 ? a.slice(0, eq) : a
  const value = () => (eq >= 0 ? a.slice(eq + 1) : args[++i])
  if (name === '--query-gpu') queryGpu = value()
  else if (name === '--query-compute-apps') queryApps = value()
  else if (name === '--format') format = value()
  else if (name === '-L' || name === '--list-gpus') list = true
  else if (name === '-h' || name === '--help') {
    process.stdout.write('NVIDIA System Management Interface (pdchaos twin stand-in)\n\n    -L, --list-gpus\n    --query-gpu=FIELDS --format=csv[,noheader][,nounits]\n    --query-compute-apps=FIELDS --format=csv[,noheader][,nounits]\n    topo -m | -mp\n')
    process.exit(0)
  } else usageError()
}
if (list) {
  if (queryGpu || queryApps) usageError()
  for (const g of gpus()) process.stdout.write('GPU ' + g.index + ': ' + NAME + ' (UUID: ' + g.uuid + ')\n')
  process.exit(0)
}
if ((queryGpu === undefined) === (queryApps === undefined)) usageError()
if (format === undefined) fail('"--format" is required when using the --query-* options.\n', 2)
const fmt = format.split(',').map((f) => f.trim())
if (fmt[0] !== 'csv' || fmt.slice(1).some((f) => f !== 'noheader' && f !== 'nounits')) fail('Invalid format "' + format + '" specified.\n', 2)
if (queryGpu !== undefined) csv(queryGpu, GPU_FIELDS, gpus(), fmt)
else csv(queryApps, APP_FIELDS, apps(), fmt)
`
