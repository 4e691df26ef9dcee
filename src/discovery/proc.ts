/**
 * Parsers for what a Linux host says about its processes: `ps` lines, /proc/<pid>/stat, /proc/<pid>/environ,
 * and `ss -ltnp` listeners. Pure functions, so discovery's logic is tested without a host.
 */

export interface ProcessRow {
  pid: number
  ppid: number
  /** Process state letter from ps (R, S, D, T, Z...). */
  stat: string
  args: string
}

/** Lines of `ps -eo pid=,ppid=,stat=,args=`. */
export function parsePs(text: string): ProcessRow[] {
  const rows: ProcessRow[] = []
  for (const line of text.split('\n')) {
    const m = /^\s*(\d+)\s+(\d+)\s+(\S+)\s+(.*)$/.exec(line)
    if (m) rows.push({pid: Number(m[1]), ppid: Number(m[2]), stat: m[3], args: m[4].trim()})
  }
  return rows
}

/**
 * docker-proxy's command line (`docker-proxy -proto tcp -host-ip H -host-port P -container-ip C -container-port Q`).
 */
export interface DockerProxy {
  hostPort?: number
  containerIp?: string
  containerPort?: number
}

export function parseDockerProxy(args: string): DockerProxy | undefined {
  const argv = args.trim().split(/\s+/)
  if (!/(^|\/)docker-proxy$/.test(argv[0] ?? '')) return undefined
  const val = (flag: string) => {
    const i = argv.findIndex(a => a === `-${flag}` || a === `--${flag}`)
    return i >= 0 ? argv[i + 1] : argv.find(a => a.startsWith(`-${flag}=`) || a.startsWith(`--${flag}=`))?.split('=')[1]
  }
  const num = (v: string | undefined) => (v !== undefined && /^\d+$/.test(v) ? Number(v) : undefined)
  const hostPort = num(val('host-port'))
  const containerPort = num(val('container-port'))
  const containerIp = val('container-ip')
  return {
    ...(hostPort === undefined ? {} : {hostPort}),
    ...(containerIp ? {containerIp} : {}),
    ...(containerPort === undefined ? {} : {containerPort}),
  }
}

export interface ProcStat {
  pid: number
  state: string
  ppid: number
  /** Field 22: start time in clock ticks since boot. Together with the pid it names one process for its whole life. */
  startTicks: number
}

/** One /proc/<pid>/stat line. The comm field may hold spaces and parentheses, so split after the last ')'. */
export function parseProcStat(line: string): ProcStat | undefined {
  const open = line.indexOf('(')
  const close = line.lastIndexOf(')')
  if (open < 0 || close < open) return undefined
  const pid = Number(line.slice(0, open).trim())
  const rest = line.slice(close + 2).split(' ')
  // rest[0] is field 3 (state); field n is rest[n - 3].
  const startTicks = Number(rest[19])
  if (!Number.isInteger(pid) || !Number.isFinite(startTicks)) return undefined
  return {pid, state: rest[0], ppid: Number(rest[1]), startTicks}
}

/** /proc/<pid>/environ: NUL-separated NAME=value pairs. */
export function parseEnviron(text: string): Record<string, string> {
  const env: Record<string, string> = {}
  for (const pair of text.split('\0')) {
    const eq = pair.indexOf('=')
    if (eq > 0) env[pair.slice(0, eq)] = pair.slice(eq + 1)
  }
  return env
}

export interface Listener {
  address: string
  port: number
  pids: number[]
}

/** `ss -Hltnp` lines: the listening TCP sockets with the pids that own them (pids need root for other users). */
export function parseSsListeners(text: string): Listener[] {
  const out: Listener[] = []
  for (const line of text.split('\n')) {
    const cols = line.trim().split(/\s+/)
    if (cols.length < 4) continue
    const local = cols[3]
    const colon = local.lastIndexOf(':')
    const port = Number(local.slice(colon + 1))
    if (colon < 0 || !Number.isInteger(port)) continue
    const pids = [...line.matchAll(/pid=(\d+)/g)].map(m => Number(m[1]))
    out.push({address: local.slice(0, colon).replace(/^\[|\]$/g, ''), port, pids: [...new Set(pids)]})
  }
  return out
}
