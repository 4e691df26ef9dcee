import {oneLine} from '../../errors.js'
import type {Host} from '../../hosts/host.js'
import type {Judgement, MechanismPlan, NicFacts, Probe, RouteEntry} from '../fault.js'
import {IFACE_NAME} from './packet-filter.js'

/**
 * A GPU's NIC on the host, read-only: which RDMA device and netdev it is (sysfs), its link layer (RoCE = Ethernet,
 * InfiniBand), and what can stall it. Two mechanisms act on the whole NIC and so are refused unless the user asks:
 * - link-down: `ip link set DEV down`; revert `ip link set DEV up`, then the routes and global IPv6 addresses the
 *   kernel deleted with the link (static and policy routes do not come back by themselves).
 * - ib-port-disable: an InfiniBand port can only be disabled, not filtered: `ibportstate -C DEV -P 1 -D 0 1 off`
 *   (direct route 0: the local HCA itself, no LID needed), revert `… on`, which enables only a disabled port
 *   (rdma-core infiniband-diags/ibportstate.c: ON is a no-op unless PortPhysicalState is Disabled).
 * Both are verified by their effect: the link state, and the NIC's traffic counters standing still over a second.
 */

/** Device names are passed to constant scripts as arguments and named in sysfs paths: plain characters only. */
export const DEVICE_NAME = /^[A-Za-z0-9_.:-]{1,64}$/

/**
 * One block per name: RS, the name, then key=value lines. A name is an RDMA device (mlx5_3) or, where the NIC
 * Legend names a netdev (the twin's rail0), the netdev. The netdev of an RDMA device is its GID 0 netdev on port 1,
 * else the first of its PCI function's net/ entries.
 */
export const NIC_SCRIPT = [
  'for x in "$@"; do',
  '  printf \'\\036%s\\n\' "$x"',
  '  r=; n=',
  '  if [ -d "/sys/class/infiniband/$x" ]; then r="$x"',
  '  elif [ -d "/sys/class/net/$x" ]; then n="$x"',
  '    for d in "/sys/class/net/$x/device/infiniband/"*; do [ -d "$d" ] && { r="${d##*/}"; break; }; done',
  // A network namespace whose /sys was not remounted shows another namespace's netdevs: ask ip.
  '  elif ip link show dev "$x" >/dev/null 2>&1; then n="$x"; echo "nosysfs=1"',
  '  else echo "missing=1"; continue; fi',
  '  if [ -n "$r" ]; then',
  '    echo "rdma=$r"',
  '    echo "link_layer=$(cat "/sys/class/infiniband/$r/ports/1/link_layer" 2>/dev/null)"',
  '    echo "state=$(cat "/sys/class/infiniband/$r/ports/1/state" 2>/dev/null)"',
  '    echo "phys_state=$(cat "/sys/class/infiniband/$r/ports/1/phys_state" 2>/dev/null)"',
  '    if [ -z "$n" ]; then',
  '      n=$(cat "/sys/class/infiniband/$r/ports/1/gid_attrs/ndevs/0" 2>/dev/null)',
  '      if [ -z "$n" ]; then for d in "/sys/class/infiniband/$r/device/net/"*; do [ -d "$d" ] && { n="${d##*/}"; ' +
    'break; }; done; fi',
  '    fi',
  '  fi',
  '  if [ -n "$n" ]; then',
  '    o=$(cat "/sys/class/net/$n/operstate" 2>/dev/null) || o=$(ip -o link show dev "$n" 2>/dev/null | sed -n ' +
    '"s/.* state \\([A-Z]*\\).*/\\1/p")',
  '    echo "netdev=$n"; echo "operstate=$o"',
  '  fi',
  'done',
].join('\n')

export function parseNicBlocks(stdout: string): Map<string, Record<string, string>> {
  const out = new Map<string, Record<string, string>>()
  for (const block of stdout.split('\u001E')) {
    const lines = block.split('\n')
    const name = lines[0]?.trim()
    if (!name) continue
    const kv: Record<string, string> = {}
    for (const l of lines.slice(1)) {
      const eq = l.indexOf('=')
      if (eq > 0) kv[l.slice(0, eq).trim()] = l.slice(eq + 1).trim()
    }
    out.set(name, kv)
  }
  return out
}

/** `ethtool -k DEV`: the hw-tc-offload line's value ("on", "off", "off [fixed]"), or undefined. */
export function parseHwTcOffload(stdout: string): string | undefined {
  const m = /^\s*hw-tc-offload:\s*(.+?)\s*$/m.exec(stdout)
  return m?.[1]
}

/**
 * What a tc flower drop needs: tc itself, and in the kernel cls_flower (the classifier), act_gact (the drop action)
 * and sch_ingress (the clsact qdisc). Loaded, loadable or built in; the script changes nothing.
 */
export const TC_CAPS_SCRIPT = [
  'v=$(tc -V 2>&1 | head -n 1) || v=',
  'echo "version=$v"',
  'for m in cls_flower act_gact sch_ingress; do',
  '  if [ -d "/sys/module/$m" ]; then echo "$m=loaded"',
  '  elif modinfo "$m" >/dev/null 2>&1; then echo "$m=module"',
  '  elif grep -qs "/$m.ko" "/lib/modules/$(uname -r)/modules.builtin"; then echo "$m=builtin"',
  '  else echo "$m=missing"; fi',
  'done',
].join('\n')

export function parseTcCaps(stdout: string): {version?: string; modules: Record<string, string>} {
  const kv = parseNicBlocks(`\u001Ecaps\n${stdout}`).get('caps') ?? {}
  const version = kv.version && /tc utility|iproute2/i.test(kv.version) ? kv.version : undefined
  const modules: Record<string, string> = {}
  for (const m of ['cls_flower', 'act_gact', 'sch_ingress']) modules[m] = kv[m] ?? 'unknown'
  return {...(version ? {version} : {}), modules}
}

/** `tc -j qdisc show dev DEV`: is a clsact qdisc there? */
export function hasClsactQdisc(stdout: string): boolean {
  try {
    const list = JSON.parse(stdout) as Array<{kind?: string}>
    return Array.isArray(list) && list.some(q => q.kind === 'clsact')
  } catch {
    return /qdisc clsact/.test(stdout)
  }
}

// ---------------------------------------------------------------- routes and addresses

interface IpRoute {
  type?: string
  dst?: string
  gateway?: string
  table?: string
  protocol?: string
  scope?: string
  prefsrc?: string
  metric?: number
  flags?: string[]
  nexthops?: unknown[]
  multipath?: unknown[]
}

/** `ip [-6] -j route show table all dev DEV`, minus what the kernel puts back itself when the link comes up. */
export function parseRoutes(stdout: string, family: 4 | 6): RouteEntry[] {
  let list: IpRoute[]
  try {
    list = JSON.parse(stdout || '[]') as IpRoute[]
  } catch {
    return []
  }
  const out: RouteEntry[] = []
  for (const r of Array.isArray(list) ? list : []) {
    if (!r.dst) continue
    // Connected, local, broadcast and link-local routes are the kernel's own: `ip link set up` restores them.
    if (r.protocol === 'kernel') continue
    if (r.type && !['unicast', 'blackhole', 'unreachable', 'prohibit'].includes(r.type)) continue
    out.push({
      family,
      dst: r.dst,
      ...(r.type && r.type !== 'unicast' ? {type: r.type} : {}),
      ...(r.gateway ? {gateway: r.gateway} : {}),
      ...(r.table && r.table !== 'main' ? {table: r.table} : {}),
      ...(r.protocol ? {protocol: r.protocol} : {}),
      ...(r.scope ? {scope: r.scope} : {}),
      ...(r.prefsrc ? {prefsrc: r.prefsrc} : {}),
      ...(typeof r.metric === 'number' ? {metric: r.metric} : {}),
      ...(r.flags?.length ? {flags: r.flags} : {}),
      ...(r.nexthops || r.multipath ? {multipath: true} : {}),
    })
  }
  return out
}

/**
 * `ip -6 -j addr show dev DEV`: the global IPv6 addresses (the kernel drops them with the link unless
 * keep_addr_on_down).
 */
export function parseGlobalAddrs6(stdout: string): string[] {
  try {
    const list = JSON.parse(stdout || '[]') as Array<{
      addr_info?: Array<{family?: string; local?: string; prefixlen?: number; scope?: string}>
    }>
    return list.flatMap(l =>
      (l.addr_info ?? [])
        .filter(a => a.family === 'inet6' && a.scope === 'global' && a.local && typeof a.prefixlen === 'number')
        .map(a => `${a.local}/${a.prefixlen}`),
    )
  } catch {
    return []
  }
}

/** The idempotent `ip route replace` that puts one route back on DEV. */
export function routeReplaceArgv(r: RouteEntry, dev: string): string[] {
  return [
    'ip',
    ...(r.family === 6 ? ['-6'] : []),
    'route',
    'replace',
    ...(r.type ? [r.type] : []),
    r.dst,
    ...(r.gateway ? ['via', r.gateway] : []),
    'dev',
    dev,
    ...(r.table ? ['table', r.table] : []),
    ...(r.protocol ? ['proto', r.protocol] : []),
    ...(r.scope ? ['scope', r.scope] : []),
    ...(r.prefsrc ? ['src', r.prefsrc] : []),
    ...(r.metric === undefined ? [] : ['metric', String(r.metric)]),
    ...(r.flags?.includes('onlink') ? ['onlink'] : []),
  ]
}

// ---------------------------------------------------------------- gathering

export const NIC_FACTS_TIMEOUT_MS = 5000

/** Resolve the NIC Legend names on the host and probe what each one's stall mechanisms need. Read-only. */
export async function gatherNics(
  host: Host,
  nics: Array<{label: string; device?: string}>,
  opts: {timeoutMs?: number; linkDown?: boolean} = {},
): Promise<NicFacts[]> {
  const timeoutMs = opts.timeoutMs ?? NIC_FACTS_TIMEOUT_MS
  const names = nics.map(n => n.device).filter((d): d is string => d !== undefined && DEVICE_NAME.test(d))
  const blocks = names.length
    ? parseNicBlocks(
        (
          await host
            .run(['sh', '-c', NIC_SCRIPT, 'sh', ...names], {timeoutMs})
            .catch((e: unknown) => ({stdout: '', stderr: oneLine(e), code: null}))
        ).stdout,
      )
    : new Map<string, Record<string, string>>()
  const out: NicFacts[] = []
  for (const n of nics) {
    const f = nicFromSysfs(n, blocks)
    out.push(f)
    const dev = f.netdev
    if (!f.rdmaDevice || !dev) continue
    if (f.linkLayer === 'Ethernet') await probeRoce(host, f, dev, timeoutMs)
    else if (f.linkLayer === 'InfiniBand') await probeInfiniBand(host, f, timeoutMs)
    if (opts.linkDown && f.linkLayer === 'Ethernet') await probeLinkState(host, f, dev, timeoutMs)
  }
  return out
}

/** One NIC Legend entry as NIC_SCRIPT's block shows it: RDMA device, netdev, link layer, port state. */
function nicFromSysfs(n: {label: string; device?: string}, blocks: Map<string, Record<string, string>>): NicFacts {
  const f: NicFacts = {label: n.label, ...(n.device ? {legend: n.device} : {}), evidence: []}
  if (!n.device) {
    f.evidence.push(`${n.label} has no name in the NIC Legend`)
    return f
  }
  if (!DEVICE_NAME.test(n.device)) {
    f.evidence.push(`${n.label}: unexpected device name ${JSON.stringify(n.device)}`)
    return f
  }
  const kv = blocks.get(n.device)
  if (!kv || kv.missing) {
    f.evidence.push(
      `${n.label} (${n.device}): neither /sys/class/infiniband/${n.device} nor /sys/class/net/${n.device} exists`,
    )
    return f
  }
  if (kv.rdma) f.rdmaDevice = kv.rdma
  if (kv.netdev && IFACE_NAME.test(kv.netdev)) f.netdev = kv.netdev
  if (kv.link_layer) f.linkLayer = kv.link_layer
  if (kv.state) f.portState = kv.state
  if (kv.phys_state) f.portPhysState = kv.phys_state
  if (kv.nosysfs) f.rdmaUnknown = true
  f.evidence.push(
    f.rdmaDevice
      ? `${n.label}: RDMA device ${f.rdmaDevice}, link layer ${f.linkLayer ?? 'unknown'}, port ` +
          `1 ${f.portState ?? '?'} ` +
          `/ ${f.portPhysState ?? '?'}${f.netdev ? `, netdev ${f.netdev} (${kv.operstate || '?'})` : ', no netdev'}`
      : f.rdmaUnknown
        ? `${n.label}: netdev ${f.netdev ?? n.device} (${kv.operstate || '?'}) seen by \`ip link\` but not in ` +
          `/sys/class/net (a network namespace without its own sysfs): whether it has an RDMA device is unknown`
        : `${n.label}: netdev ${f.netdev ?? n.device} (${kv.operstate || '?'}) with no RDMA device: kernel ` +
          `traffic only`,
  )
  return f
}

/** A RoCE NIC: hw-tc-offload, tc and its kernel modules, and whether DEV has a clsact qdisc (for tc flower). */
async function probeRoce(host: Host, f: NicFacts, dev: string, timeoutMs: number): Promise<void> {
  const [eth, caps, qd] = await Promise.all([
    host.run(['ethtool', '-k', dev], {timeoutMs}).catch((e: unknown) => ({code: null, stdout: '', stderr: oneLine(e)})),
    host
      .run(['sh', '-c', TC_CAPS_SCRIPT], {timeoutMs})
      .catch((e: unknown) => ({code: null, stdout: '', stderr: oneLine(e)})),
    host
      .run(['tc', '-j', 'qdisc', 'show', 'dev', dev], {timeoutMs})
      .catch((e: unknown) => ({code: null, stdout: '', stderr: oneLine(e)})),
  ])
  f.hwTcOffload = eth.code === 0 ? (parseHwTcOffload(eth.stdout) ?? 'absent') : undefined
  f.evidence.push(
    eth.code === 0
      ? `ethtool -k ${dev}: hw-tc-offload: ${f.hwTcOffload}`
      : `ethtool -k ${dev} failed: ${oneLine(eth.stderr) || `exit ${eth.code}`}`,
  )
  f.tc = parseTcCaps(caps.stdout)
  f.evidence.push(
    `tc: ${f.tc.version ?? 'not found'}; kernel ${Object.entries(f.tc.modules)
      .map(([m, v]) => `${m} ${v}`)
      .join(', ')}`,
  )
  f.hasClsact = qd.code === 0 && hasClsactQdisc(qd.stdout)
}

/** An InfiniBand HCA: whether ibportstate (to disable its port) is installed. */
async function probeInfiniBand(host: Host, f: NicFacts, timeoutMs: number): Promise<void> {
  const ib = await host.run(['sh', '-c', 'command -v ibportstate'], {timeoutMs}).catch(() => ({code: null, stdout: ''}))
  if (ib.code === 0 && ib.stdout.trim()) f.ibportstate = ib.stdout.trim()
  f.evidence.push(f.ibportstate ? `ibportstate: ${f.ibportstate}` : 'ibportstate: not installed (infiniband-diags)')
}

/** For link down: the routes and global IPv6 addresses the kernel deletes with DEV's link (to put back). */
async function probeLinkState(host: Host, f: NicFacts, dev: string, timeoutMs: number): Promise<void> {
  const [r4, r6, a6] = await Promise.all([
    host
      .run(['ip', '-j', 'route', 'show', 'table', 'all', 'dev', dev], {timeoutMs})
      .catch(() => ({code: null, stdout: ''})),
    host
      .run(['ip', '-6', '-j', 'route', 'show', 'table', 'all', 'dev', dev], {timeoutMs})
      .catch(() => ({code: null, stdout: ''})),
    host.run(['ip', '-6', '-j', 'addr', 'show', 'dev', dev], {timeoutMs}).catch(() => ({code: null, stdout: ''})),
  ])
  f.routes = [...(r4.code === 0 ? parseRoutes(r4.stdout, 4) : []), ...(r6.code === 0 ? parseRoutes(r6.stdout, 6) : [])]
  f.addrs6 = a6.code === 0 ? parseGlobalAddrs6(a6.stdout) : []
  f.evidence.push(
    `${dev}: ${f.routes.length} route(s) and ${f.addrs6.length} global IPv6 address(es) the kernel deletes ` +
      `with the link`,
  )
}

// ---------------------------------------------------------------- effect: counters standing still

/** Sample each file twice, `seconds` apart: RS-separated blocks "file value". A constant script, files as arguments. */
export const COUNTERS_SCRIPT = [
  's="$1"; shift',
  'for round in 1 2; do',
  '  printf \'\\036%s\\n\' "$round"',
  '  for f in "$@"; do printf \'%s %s\\n\' "$f" "$(cat "$f" 2>/dev/null || echo none)"; done',
  '  [ "$round" = 1 ] && sleep "$s"',
  'done',
  'exit 0',
].join('\n')

export function countersArgv(files: string[], seconds = 1): string[] {
  return ['sh', '-c', COUNTERS_SCRIPT, 'sh', String(seconds), ...files]
}

/**
 * The files whose standing still proves a NIC carries nothing: the netdev's byte counters and the RDMA port's data
 * counters.
 */
export function counterFiles(nic: {netdev?: string; rdmaDevice?: string}): string[] {
  return [
    ...(nic.netdev
      ? [`/sys/class/net/${nic.netdev}/statistics/tx_bytes`, `/sys/class/net/${nic.netdev}/statistics/rx_bytes`]
      : []),
    ...(nic.rdmaDevice
      ? [
          `/sys/class/infiniband/${nic.rdmaDevice}/ports/1/counters/port_xmit_data`,
          `/sys/class/infiniband/${nic.rdmaDevice}/ports/1/counters/port_rcv_data`,
        ]
      : []),
  ]
}

/**
 * Judge of COUNTERS_SCRIPT: every counter read in both rounds and none moved. A counter that moved is traffic flowing.
 */
export function judgeCountersStill(stdout: string, code: number | null, expected: string[]): Judgement {
  if (code !== 0) return {ok: false, evidence: `counter sample exit ${code}: effect unverified`}
  const rounds = stdout
    .split('\u001E')
    .slice(1)
    .map(b => {
      const m = new Map<string, string>()
      for (const l of b.split('\n').slice(1)) {
        const sp = l.lastIndexOf(' ')
        if (sp > 0) m.set(l.slice(0, sp), l.slice(sp + 1).trim())
      }
      return m
    })
  if (rounds.length !== 2) return {ok: false, evidence: 'counter sample incomplete: effect unverified'}
  const [a, b] = rounds as [Map<string, string>, Map<string, string>]
  const unread = expected.filter(f => !/^\d+$/.test(a.get(f) ?? '') || !/^\d+$/.test(b.get(f) ?? ''))
  if (unread.length > 0) return {ok: false, evidence: `cannot read ${unread.join(', ')}: effect unverified`}
  const moved = expected.filter(f => a.get(f) !== b.get(f))
  const short = (f: string) => f.replace(/^\/sys\/class\/(net|infiniband)\//, '')
  if (moved.length > 0) {
    return {
      ok: false,
      evidence: `traffic still flows: ${moved.map(f => `${short(f)} ${a.get(f)} -> ${b.get(f)}`).join(', ')}`,
    }
  }
  return {ok: true, evidence: `no traffic for 1 s: ${expected.map(f => `${short(f)} stayed ${a.get(f)}`).join(', ')}`}
}

// ---------------------------------------------------------------- link down

interface IpLink {
  ifname?: string
  flags?: string[]
  operstate?: string
}

function linkOf(stdout: string, dev: string): IpLink | undefined {
  try {
    const list = JSON.parse(stdout) as IpLink[]
    return Array.isArray(list) ? list.find(l => l.ifname === dev) : undefined
  } catch {
    return undefined
  }
}

/** `ip -j link show dev DEV`: administratively down (no UP flag) and operstate DOWN. */
export function judgeLinkDown(dev: string, stdout: string, code: number | null): Judgement {
  const l = code === 0 ? linkOf(stdout, dev) : undefined
  if (!l) return {ok: false, evidence: `ip link show ${dev}: exit ${code}, no such link in the listing`}
  const up = (l.flags ?? []).includes('UP')
  if (up || l.operstate !== 'DOWN')
    return {
      ok: false,
      evidence: `${dev} is not down: flags ${(l.flags ?? []).join(',') || 'none'}, operstate ${l.operstate ?? '?'}`,
    }
  return {ok: true, evidence: `${dev}: admin down, operstate DOWN`}
}

/** Clean: the UP flag is back (the carrier may take seconds to return: reported, not required). */
export function judgeLinkUp(dev: string, stdout: string, code: number | null): Judgement {
  const l = code === 0 ? linkOf(stdout, dev) : undefined
  if (!l)
    return {
      ok: false,
      evidence: `ip link show ${dev}: exit ${code}, no such link in the listing: cleanliness unverified`,
    }
  if (!(l.flags ?? []).includes('UP'))
    return {ok: false, evidence: `${dev} is still administratively down (flags ${(l.flags ?? []).join(',') || 'none'})`}
  return {
    ok: true,
    evidence:
      `${dev}: admin UP, ` +
      `operstate ${l.operstate ?? '?'}${
        (l.flags ?? []).includes('LOWER_UP') ? ', carrier up' : ', carrier not ' + 'yet up'
      }`,
  }
}

/** Routes listed again after the revert: every saved route is back (by destination, table and gateway). */
export const ROUTES_SCRIPT = [
  'printf \'\\036%s\\n\' 4; ip -j route show table all dev "$1" || exit 1',
  'printf \'\\n\\036%s\\n\' 6; ip -6 -j route show table all dev "$1" || exit 1',
].join('\n')

export function judgeRoutesBack(routes: RouteEntry[], stdout: string, code: number | null): Judgement {
  if (code !== 0) return {ok: false, evidence: `route listing exit ${code}: cleanliness unverified`}
  const parts = stdout.split('\u001E')
  const v4 = parseRoutes(parts.find(p => p.startsWith('4\n'))?.slice(2) ?? '[]', 4)
  const v6 = parseRoutes(parts.find(p => p.startsWith('6\n'))?.slice(2) ?? '[]', 6)
  const have = [...v4, ...v6]
  const key = (r: RouteEntry) => `${r.family} ${r.dst} ${r.table ?? 'main'} ${r.gateway ?? ''}`
  const missing = routes.filter(r => !have.some(h => key(h) === key(r)))
  if (missing.length > 0) return {ok: false, evidence: `route(s) not restored: ${missing.map(key).join('; ')}`}
  return {ok: true, evidence: `${routes.length} route(s) restored`}
}

export function buildLinkDown(nic: NicFacts): MechanismPlan {
  const dev = nic.netdev!
  const routes = (nic.routes ?? []).filter(r => !r.multipath)
  const revert: string[][] = [['ip', 'link', 'set', 'dev', dev, 'up']]
  for (const a of nic.addrs6 ?? []) revert.push(['ip', '-6', 'addr', 'replace', a, 'dev', dev])
  for (const r of routes) revert.push(routeReplaceArgv(r, dev))
  const files = counterFiles(nic)
  return {
    inject: [['ip', 'link', 'set', 'dev', dev, 'down']],
    revert,
    verifyInjected: {
      name: `${dev} is down`,
      argv: ['ip', '-j', 'link', 'show', 'dev', dev],
      sudo: false,
      judge: (stdout, code) => judgeLinkDown(dev, stdout, code),
    },
    verifyClean: {
      name: `${dev} is up`,
      argv: ['ip', '-j', 'link', 'show', 'dev', dev],
      sudo: false,
      judge: (stdout, code) => judgeLinkUp(dev, stdout, code),
    },
    readOnlyProbes: [
      ['ip', '-j', 'link', 'show', 'dev', dev],
      ['ip', '-j', 'route', 'show', 'table', 'all', 'dev', dev],
      countersArgv(files),
    ],
    summary:
      `ip link set dev ${dev} down (${nic.label}${nic.rdmaDevice ? `, ${nic.rdmaDevice}` : ''}); revert: ` +
      `up, then ${routes.length} route(s) and ${(nic.addrs6 ?? []).length} IPv6 address(es) back`,
  }
}

/** The extra probes link-down needs beyond its MechanismPlan: traffic standing still, and routes back. */
export function linkDownEffectProbes(nic: NicFacts): {injected: Probe[]; clean: Probe[]} {
  const dev = nic.netdev!
  const files = counterFiles(nic)
  const routes = (nic.routes ?? []).filter(r => !r.multipath)
  return {
    injected: [
      {
        name: `${dev} carries no traffic`,
        argv: countersArgv(files),
        sudo: false,
        judge: (o, c) => judgeCountersStill(o, c, files),
      },
    ],
    clean: routes.length
      ? [
          {
            name: `${dev}'s routes are back`,
            argv: ['sh', '-c', ROUTES_SCRIPT, 'sh', dev],
            sudo: false,
            judge: (o, c) => judgeRoutesBack(routes, o, c),
          },
        ]
      : [],
  }
}

// ---------------------------------------------------------------- InfiniBand port disable

export function ibportstateArgv(rdma: string, op: 'off' | 'on' | 'query'): string[] {
  return ['ibportstate', '-C', rdma, '-P', '1', '-D', '0', '1', ...(op === 'query' ? [] : [op])]
}

export const IB_PORT_STATE_SCRIPT =
  'cat "/sys/class/infiniband/$1/ports/1/state" "/sys/class/infiniband/$1/ports/1/phys_state"'

/** sysfs port 1: "1: DOWN" and "3: Disabled" once disabled. */
export function judgeIbPortDisabled(rdma: string, stdout: string, code: number | null): Judgement {
  const [state, phys] = stdout
    .trim()
    .split('\n')
    .map(l => l.trim())
  if (code !== 0 || !phys) return {ok: false, evidence: `${rdma} port 1 state unreadable (exit ${code})`}
  if (!/^3:\s*Disabled/i.test(phys)) return {ok: false, evidence: `${rdma} port 1 is not disabled: ${state}, ${phys}`}
  return {ok: true, evidence: `${rdma} port 1: ${state}, ${phys}`}
}

export function judgeIbPortEnabled(rdma: string, stdout: string, code: number | null): Judgement {
  const [state, phys] = stdout
    .trim()
    .split('\n')
    .map(l => l.trim())
  if (code !== 0 || !phys)
    return {ok: false, evidence: `${rdma} port 1 state unreadable (exit ${code}): cleanliness unverified`}
  if (/^3:\s*Disabled/i.test(phys)) return {ok: false, evidence: `${rdma} port 1 is still disabled (${phys})`}
  return {
    ok: true,
    evidence:
      `${rdma} port 1 enabled ` +
      `again: ${state}, ${phys}${
        /ACTIVE/i.test(state ?? '') ? '' : ' (the subnet manager may take seconds to make ' + 'it ACTIVE)'
      }`,
  }
}

export function buildIbPortDisable(nic: NicFacts): MechanismPlan & {effect: Probe} {
  const rdma = nic.rdmaDevice!
  const files = counterFiles({rdmaDevice: rdma})
  return {
    inject: [ibportstateArgv(rdma, 'off')],
    revert: [ibportstateArgv(rdma, 'on')],
    verifyInjected: {
      name: `${rdma} port 1 is disabled`,
      argv: ['sh', '-c', IB_PORT_STATE_SCRIPT, 'sh', rdma],
      sudo: false,
      judge: (o, c) => judgeIbPortDisabled(rdma, o, c),
    },
    verifyClean: {
      name: `${rdma} port 1 is enabled`,
      argv: ['sh', '-c', IB_PORT_STATE_SCRIPT, 'sh', rdma],
      sudo: false,
      judge: (o, c) => judgeIbPortEnabled(rdma, o, c),
    },
    effect: {
      name: `${rdma} port 1 carries no traffic`,
      argv: countersArgv(files),
      sudo: false,
      judge: (o, c) => judgeCountersStill(o, c, files),
    },
    readOnlyProbes: [ibportstateArgv(rdma, 'query'), ['sh', '-c', IB_PORT_STATE_SCRIPT, 'sh', rdma]],
    summary:
      `ibportstate -C ${rdma} -P 1 -D 0 1 off (the local HCA port, by direct route); revert: on (enables ` +
      `only a disabled port)`,
  }
}
