import {createHash} from 'node:crypto'
import {chmodSync, mkdirSync, renameSync, writeFileSync} from 'node:fs'
import {join} from 'node:path'

/**
 * The twin's stand-in for nvidia-smi: a self-contained sh and awk script written to DIR/bin/nvidia-smi (on the
 * PATH of the twin's services). It answers the queries pdchaos's discovery uses, in nvidia-smi's CSV format,
 * from the DIR/gpus/<index>.json files the rank processes write, and `nvidia-smi topo -m` (-mp) in the real
 * tool's layout: tab-separated cells, the header underlined with SGR escapes, the Legend and, with rail NICs,
 * the NIC Legend (a rail-optimized host: GPU g is PIX to NIC g). Not a node script: every discovery runs it three
 * times, and a Node start is 0.12 CPU-s on a small VM (three twins' discoveries at once were a second of CPU).
 */

export const GPU_NAME = 'NVIDIA H100 80GB HBM3'

/** A GPU uuid that is stable for a state dir and index: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx. */
export function gpuUuid(stateDir: string, index: number): string {
  const h = createHash('sha256').update(`${stateDir}\0gpu\0${index}`).digest('hex')
  return `GPU-${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20, 32)}`
}

/**
 * Write DIR/bin/nvidia-smi (atomically) for a twin with `gpus` GPUs and NICs `nics` (NIC i's name, and the GPU it is
 * PIX to: GPU i for a bare name; a node of a twin that spans nodes has the NICs of its own GPUs only); returns its
 * path.
 * hideProcesses: it lists no compute processes, as nvidia-smi inside a container does (the host's pids are not its
 * own).
 */
export function writeNvidiaSmi(
  stateDir: string,
  gpus: number,
  nics: ReadonlyArray<string | {name: string; gpu: number}> = [],
  view: {hideProcesses: boolean} = {hideProcesses: false},
): string {
  const names = nics.map(n => (typeof n === 'string' ? n : n.name))
  const nicGpus = nics.map((n, i) => (typeof n === 'string' ? i : n.gpu))
  const bin = join(stateDir, 'bin')
  mkdirSync(bin, {recursive: true})
  const uuids = Array.from({length: gpus}, (_, i) => gpuUuid(stateDir, i))
  // Words in the script's awk variables: a NIC name is an interface or device name, never one with spaces or quotes.
  for (const n of names)
    if (!/^[\w.:-]+$/.test(n)) throw new Error(`nvidia-smi stand-in: NIC name ${JSON.stringify(n)} is not a plain name`)
  const file = join(bin, 'nvidia-smi')
  const tmp = `${file}.${process.pid}.tmp`
  writeFileSync(
    tmp,
    SCRIPT.replace('__UUIDS__', uuids.join(' '))
      .replace('__NAME__', GPU_NAME)
      .replace('__NICS__', names.join(' '))
      .replace('__NIC_GPUS__', nicGpus.join(' '))
      .replace('__HIDE__', view.hideProcesses ? '1' : '0'),
  )
  chmodSync(tmp, 0o755)
  renameSync(tmp, file)
  return file
}

// POSIX sh and awk (mawk, gawk or busybox): the state dir is two levels above the script's real path.
const SCRIPT =
  String.raw`#!/bin/sh
# nvidia-smi stand-in written by pdchaos sim up. GPUs and uuids are fixed for this state dir;
# compute apps come from ../gpus/<index>.json written by the twin's rank processes.
self=$(readlink -f -- "$0") || exit 1
dir=$` +
  '{self%/*}' +
  String.raw`
exec awk -v STATE="$` +
  '{dir%/*}' +
  String.raw`" -v UUIDS='__UUIDS__' -v NAME='__NAME__' -v NICS='__NICS__' \
  -v NIC_GPUS='__NIC_GPUS__' -v HIDE=__HIDE__ -- '
function fail(msg, code) { printf "%s\n", msg; exit code }
function usage_error() {
  fail("Invalid combination of input arguments. Please run \047nvidia-smi -h\047 for help.\n", 2)
}
function pad_end(s, n) { while (length(s) < n) s = s " "; return s }
function pad_start(s, n) { while (length(s) < n) s = " " s; return s }
function trim(s) { sub(/^[ \t\r\n]+/, "", s); sub(/[ \t\r\n]+$/, "", s); return s }
function read_all(file, sep,   line, text, n, saved) {
  saved = RS; RS = sep; text = ""; n = 0
  while ((getline line < file) > 0) { text = (n++ ? text RS : "") line; if (sep == "\0") break }
  close(file); RS = saved
  return n ? text : "\001missing"
}
function alive(pid,   stat, rest, i) {
  stat = read_all("/proc/" pid "/stat", "\n")
  if (stat == "\001missing") return 0
  # The state follows the last ")" (the name may hold one).
  i = 0; rest = stat
  while (match(rest, /\)/)) { i += RSTART; rest = substr(rest, RSTART + 1) }
  rest = substr(stat, i + 2, 1)
  return rest != "Z" && rest != "X"
}
function process_name(pid,   argv0) {
  argv0 = read_all("/proc/" pid "/cmdline", "\0")
  if (argv0 == "\001missing" || argv0 == "") return "[Not Found]"
  return argv0
}
function json_int(text, key,   m) {
  if (!match(text, "\"" key "\":-?[0-9]+[,}]")) return ""
  m = substr(text, RSTART + length(key) + 3, RLENGTH - length(key) - 4)
  return m
}
# Each rank: its own context (USED_MIB) and its stray one (STRAY_MIB), sorted by GPU, the smaller first.
function contexts(   i, text, pid, stray, n, j, k, t) {
  n = 0
  for (i = 0; i < G; i++) {
    text = read_all(STATE "/gpus/" i ".json", "\n")
    if (text == "\001missing") continue
    pid = json_int(text, "pid")
    if (pid == "" || !alive(pid)) continue
    n++; c_index[n] = i; c_pid[n] = pid; c_mib[n] = USED_MIB
    stray = json_int(text, "strayGpu")
    if (stray != "" && stray + 0 >= 0 && stray + 0 < G) {
      n++; c_index[n] = stray + 0; c_pid[n] = pid; c_mib[n] = STRAY_MIB
    }
  }
  for (j = 2; j <= n; j++) for (k = j; k > 1 && (c_index[k - 1] > c_index[k] ||
      (c_index[k - 1] == c_index[k] && c_mib[k - 1] > c_mib[k])); k--) {
    t = c_index[k]; c_index[k] = c_index[k - 1]; c_index[k - 1] = t
    t = c_pid[k]; c_pid[k] = c_pid[k - 1]; c_pid[k - 1] = t
    t = c_mib[k]; c_mib[k] = c_mib[k - 1]; c_mib[k - 1] = t
  }
  return n
}
function load_gpus(   n, i) {
  n = contexts()
  for (i = 0; i < G; i++) busy[i] = 0
  for (i = 1; i <= n; i++) if (c_mib[i] == USED_MIB) busy[c_index[i]] = 1
  # The compute apps, unless hidden (as in a container).
  apps_n = HIDE ? 0 : n
}
function bus_id(i) { return sprintf("00000000:%02X:00.0", 24 + i * 16) }
function gpu_unit(f) { return f ~ /^memory\./ ? "MiB" : f == "utilization.gpu" ? "%" : "" }
function app_unit(f) { return f == "used_memory" || f == "used_gpu_memory" ? "MiB" : "" }
function gpu_value(f, i) {
  if (f == "index") return i
  if (f == "uuid" || f == "gpu_uuid") return UUID[i]
  if (f == "name" || f == "gpu_name") return NAME
  if (f == "pci.bus_id") return bus_id(i)
  if (f == "memory.total") return MEM_TOTAL
  if (f == "memory.used") return busy[i] ? USED_MIB : 0
  if (f == "memory.free") return MEM_TOTAL - (busy[i] ? USED_MIB : 0)
  if (f == "utilization.gpu") return busy[i] ? 37 : 0
  if (f == "count") return G
  return "570.133.20"
}
function app_value(f, a) {
  if (f == "pid") return c_pid[a]
  if (f == "gpu_uuid") return UUID[c_index[a]]
  if (f == "gpu_name") return NAME
  if (f == "process_name" || f == "name") return process_name(c_pid[a])
  if (f == "used_memory" || f == "used_gpu_memory") return c_mib[a]
  return bus_id(c_index[a])
}
function csv(spec, kind, rows,   parts, n, i, k, fields, nf, unit, out, line, v, noheader, nounits, valid) {
  n = split(spec, parts, ",")
  nf = 0
  for (i = 1; i <= n; i++) { parts[i] = trim(parts[i]); if (parts[i] != "") fields[++nf] = parts[i] }
  if (nf == 0) usage_error()
  valid = kind == "gpu" ? GPU_FIELDS : APP_FIELDS
  for (i = 1; i <= nf; i++)
    if (index(valid, " " fields[i] " ") == 0) fail("Field \"" fields[i] "\" is not a valid field to query.\n", 2)
  noheader = FMT_NOHEADER; nounits = FMT_NOUNITS
  out = ""
  if (!noheader) {
    line = ""
    for (i = 1; i <= nf; i++) {
      unit = kind == "gpu" ? gpu_unit(fields[i]) : app_unit(fields[i])
      line = line (i > 1 ? ", " : "") (unit != "" && !nounits ? fields[i] " [" unit "]" : fields[i])
    }
    out = line "\n"
  }
  for (k = (kind == "gpu" ? 0 : 1); k < (kind == "gpu" ? G : rows + 1); k++) {
    line = ""
    for (i = 1; i <= nf; i++) {
      unit = kind == "gpu" ? gpu_unit(fields[i]) : app_unit(fields[i])
      v = kind == "gpu" ? gpu_value(fields[i], k) : app_value(fields[i], k)
      if (unit != "" && !nounits) v = v " " unit
      line = line (i > 1 ? ", " : "") v
    }
    out = out line "\n"
  }
  printf "%s", out
}
function table(   i, mem, l) {
  load_gpus()
  print strftime("%a %b %d %Y %H:%M:%S")
  print "+-----------------------------------------------------------------------------------------+"
  print "| NVIDIA-SMI 570.133.20             Driver Version: 570.133.20     CUDA Version: 12.8     |"
  print "|-----------------------------------------+------------------------+----------------------+"
  print "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |"
  print "|=========================================+========================+======================|"
  for (i = 0; i < G; i++) {
    mem = (busy[i] ? USED_MIB : 0) "MiB / " MEM_TOTAL "MiB"
    print "|   " pad_end(i "", 2) " " pad_end(NAME, 24) "  On   | " bus_id(i) " Off | " pad_start(mem, 20) " |"
  }
  print "+-----------------------------------------------------------------------------------------+"
  print "| Processes:                                                                              |"
  print "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |"
  print "|=========================================================================================|"
  if (apps_n == 0) print "|  No running processes found                                                             |"
  for (i = 1; i <= apps_n; i++) {
    l = "|  " pad_start(c_index[i] "", 3) "   N/A  N/A  " pad_start(c_pid[i] "", 12) "      C   "
    print l pad_end(substr(process_name(c_pid[i]), 1, 34), 34) "  " pad_start(c_mib[i] "MiB", 10) " |"
  }
  print "+-----------------------------------------------------------------------------------------+"
}
function numa(i) { return i < int((G + 1) / 2) ? 0 : 1 }
function pcie(a, b) { return numa(a) == numa(b) ? "NODE" : "SYS" }
function gpu_nic(g, n) { return g == NIC_GPU[n] ? "PIX" : pcie(g, NIC_GPU[n]) }
# An 8-GPU H100 SXM host: two sockets, NVSwitch between all GPUs (NV18), each NIC behind the PCIe switch of its GPU
# (PIX).
function topo(pcie_only,   g, h, n, m, line) {
  line = "\t\033[4m"
  for (g = 0; g < G; g++) line = line "GPU" g "\t"
  for (n = 0; n < NN; n++) line = line "NIC" n "\t"
  print line "CPU Affinity\tNUMA Affinity\tGPU NUMA ID\033[0m"
  for (g = 0; g < G; g++) {
    line = "GPU" g
    for (h = 0; h < G; h++) line = line "\t" (g == h ? " X " : pcie_only ? pcie(g, h) : "NV18")
    for (n = 0; n < NN; n++) line = line "\t" gpu_nic(g, n)
    print line "\t" (numa(g) ? "56-111,168-223" : "0-55,112-167") "\t" numa(g) "\t\tN/A"
  }
  for (n = 0; n < NN; n++) {
    line = "NIC" n
    for (g = 0; g < G; g++) line = line "\t" gpu_nic(g, n)
    for (m = 0; m < NN; m++) line = line "\t" (n == m ? " X " : pcie(NIC_GPU[n], NIC_GPU[m]))
    print line "\t\t\t\t"
  }
  print ""
  print "Legend:"
  print ""
  print "  X    = Self"
  print "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)"
  print "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node"
  print "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)"
  print "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)"
  print "  PIX  = Connection traversing at most a single PCIe bridge"
  print "  NV#  = Connection traversing a bonded set of # NVLinks"
  if (NN > 0) {
    print ""
    print "NIC Legend:"
    print ""
    for (n = 0; n < NN; n++) print "  NIC" n ": " NIC[n]
    print ""
  }
}
BEGIN {
  USED_MIB = 72000; STRAY_MIB = 500; MEM_TOTAL = 81559
  G = split(UUIDS, u, " "); for (i = 1; i <= G; i++) UUID[i - 1] = u[i]
  NN = split(NICS, nn, " "); split(NIC_GPUS, ng, " ")
  for (i = 1; i <= NN; i++) { NIC[i - 1] = nn[i]; NIC_GPU[i - 1] = ng[i] + 0 }
  GPU_FIELDS = " index uuid gpu_uuid name gpu_name pci.bus_id memory.total memory.used memory.free"
  GPU_FIELDS = GPU_FIELDS " utilization.gpu count driver_version "
  APP_FIELDS = " pid gpu_uuid gpu_name process_name name used_memory used_gpu_memory gpu_bus_id "
  argc = ARGC; for (i = 1; i < argc; i++) { A[i] = ARGV[i]; ARGV[i] = "" }
  if (argc == 1) { table(); exit 0 }
  if (A[1] == "topo") {
    if (argc == 3 && (A[2] == "-m" || A[2] == "--matrix")) topo(0)
    else if (argc == 3 && (A[2] == "-mp" || A[2] == "--matrix_pci")) topo(1)
    else usage_error()
    exit 0
  }
  has_gpu = has_apps = has_format = list = 0
  for (i = 1; i < argc; i++) {
    a = A[i]; eq = index(a, "=")
    name = eq ? substr(a, 1, eq - 1) : a
    if (name == "--query-gpu" || name == "--query-compute-apps" || name == "--format") {
      if (eq) { v = substr(a, eq + 1); got = 1 } else if (i + 1 < argc) { v = A[++i]; got = 1 } else { i++; got = 0 }
      if (name == "--query-gpu") { has_gpu = got; qgpu = v }
      else if (name == "--query-compute-apps") { has_apps = got; qapps = v }
      else { has_format = got; format = v }
    } else if (name == "-L" || name == "--list-gpus") list = 1
    else if (name == "-h" || name == "--help") {
      printf "NVIDIA System Management Interface (pdchaos twin stand-in)\n\n    -L, --list-gpus\n"
      printf "    --query-gpu=FIELDS --format=csv[,noheader][,nounits]\n"
      printf "    --query-compute-apps=FIELDS --format=csv[,noheader][,nounits]\n    topo -m | -mp\n"
      exit 0
    } else usage_error()
  }
  if (list) {
    if ((has_gpu && qgpu != "") || (has_apps && qapps != "")) usage_error()
    for (i = 0; i < G; i++) print "GPU " i ": " NAME " (UUID: " UUID[i] ")"
    exit 0
  }
  if (has_gpu == has_apps) usage_error()
  if (!has_format) fail("\"--format\" is required when using the --query-* options.\n", 2)
  n = split(format, fm, ",")
  FMT_NOHEADER = FMT_NOUNITS = 0
  if (trim(fm[1]) != "csv") fail("Invalid format \"" format "\" specified.\n", 2)
  for (i = 2; i <= n; i++) {
    f = trim(fm[i])
    if (f == "noheader") FMT_NOHEADER = 1
    else if (f == "nounits") FMT_NOUNITS = 1
    else fail("Invalid format \"" format "\" specified.\n", 2)
  }
  load_gpus()
  if (has_gpu) csv(qgpu, "gpu", 0)
  else csv(qapps, "app", apps_n)
  exit 0
}
' "$@"
`
