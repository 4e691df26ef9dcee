import {createHash} from 'node:crypto'

import type {Judgement, MechanismPlan, NicFacts} from '../fault.js'

/**
 * RoCEv2 dropped in the NIC itself: tc flower filters on the netdev's clsact ingress and egress, matching UDP
 * destination port 4791 (every RoCEv2 packet, requests and acknowledgements alike) for IPv4 and IPv6, with `skip_sw`
 * so that the filter exists only in hardware (tc-flower(8): with skip_sw the add fails unless the driver offloads
 * it). Hardware RoCE never reaches the kernel stack, so a software filter (or netfilter) would be a silent no-op.
 *
 * Ours are told apart by their priorities (derived from the lease) and their action cookie (tc-actions(8)); revert
 * deletes exactly those, and the clsact qdisc only if pdchaos added it and it holds nothing else. Verified by effect:
 * the kernel's own listing (`tc -s -j filter show`) must show each filter in hardware (`in_hw`, not `not_in_hw`),
 * with skip_sw and the drop action, and reports the hardware's match counters.
 */

export const ROCE_V2_UDP_PORT = 4791

/** Two priorities per lease (IPv4, IPv6) in 40000-59999: a filter priority and protocol name one tcf_proto. */
export function tcPrefs(leaseId: string): {v4: number; v6: number} {
  const h = createHash('sha256').update(`pdchaos-tc:${leaseId}`).digest()
  const base = 40_000 + (h.readUInt32BE(0) % 10_000) * 2
  return {v4: base, v6: base + 1}
}

/** The action cookie that marks a lease's filters (16 bytes of hex, tc's maximum). */
export function tcCookie(leaseId: string): string {
  return createHash('sha256').update(`pdchaos:${leaseId}`).digest('hex').slice(0, 32)
}

/** Add clsact only where it is missing (another tool's clsact and filters are left alone). */
export const CLSACT_ADD_SCRIPT = 'tc qdisc show dev "$1" | grep -q "qdisc clsact" || tc qdisc add dev "$1" clsact'

/**
 * Revert, idempotent: delete our filters by direction, protocol, priority and handle (absent ones are fine), fail if
 * any is still listed, and delete clsact only when pdchaos added it ($4 = 1) and no filter is left on it.
 */
export const TC_REVERT_SCRIPT = [
  'dev="$1"; p4="$2"; p6="$3"; created="$4"',
  'for dir in ingress egress; do',
  '  tc filter del dev "$dev" "$dir" protocol ip pref "$p4" handle 1 flower 2>/dev/null',
  '  tc filter del dev "$dev" "$dir" protocol ipv6 pref "$p6" handle 1 flower 2>/dev/null',
  'done',
  'if tc qdisc show dev "$dev" 2>/dev/null | grep -q "qdisc clsact"; then',
  '  left=$(tc filter show dev "$dev" ingress; tc filter show dev "$dev" egress)',
  '  if printf "%s\\n" "$left" | grep -Eq "pref ($p4|$p6) "; then echo "pdchaos: tc filters pref $p4/$p6 still on ' +
    '$dev" >&2; exit 1; fi',
  '  if [ "$created" = 1 ] && [ -z "$left" ]; then tc qdisc del dev "$dev" clsact; fi',
  'fi',
  'exit 0',
].join('\n')

/** The kernel's listing of both directions, RS-separated (a netdev without clsact has no filters: []). */
export const TC_LIST_SCRIPT = [
  'dev="$1"',
  'tc qdisc show dev "$dev" >/dev/null || exit 3',
  'for dir in ingress egress; do',
  '  printf \'\\036%s\\n\' "$dir"',
  '  if tc qdisc show dev "$dev" | grep -q "qdisc clsact"; then tc -s -j filter show dev "$dev" "$dir" || exit 3; ' +
    'else echo "[]"; fi',
  'done',
].join('\n')

export function tcListArgv(dev: string): string[] {
  return ['sh', '-c', TC_LIST_SCRIPT, 'sh', dev]
}

interface TcAction {
  kind?: string
  control_action?: {type?: string}
  cookie?: string
  stats?: {packets?: number; hw_packets?: number; bytes?: number}
}

interface TcFilter {
  protocol?: string
  pref?: number
  kind?: string
  options?: {
    handle?: number
    keys?: {ip_proto?: string; dst_port?: number | string}
    skip_sw?: boolean
    in_hw?: boolean
    not_in_hw?: boolean
    actions?: TcAction[]
  }
}

function parseDirections(stdout: string): Map<string, TcFilter[]> | undefined {
  const out = new Map<string, TcFilter[]>()
  for (const block of stdout.split('\u001E').slice(1)) {
    const nl = block.indexOf('\n')
    const dir = block.slice(0, nl).trim()
    try {
      const list = JSON.parse(block.slice(nl + 1).trim() || '[]') as TcFilter[]
      out.set(dir, Array.isArray(list) ? list : [])
    } catch {
      return undefined
    }
  }
  return out.has('ingress') && out.has('egress') ? out : undefined
}

const ours = (f: TcFilter, cookie: string): boolean => (f.options?.actions ?? []).some(a => a.cookie === cookie)

/**
 * Injected: on each direction, one IPv4 and one IPv6 flower filter of ours, UDP dport 4791, skip_sw, in hardware, drop.
 */
export function judgeTcInjected(leaseId: string, stdout: string, code: number | null): Judgement {
  const dirs = code === 0 ? parseDirections(stdout) : undefined
  if (!dirs) return {ok: false, evidence: `tc filter listing: exit ${code}, not the expected JSON`}
  const cookie = tcCookie(leaseId)
  const prefs = tcPrefs(leaseId)
  const problems: string[] = []
  let packets = 0
  for (const dir of ['ingress', 'egress']) {
    for (const [proto, pref] of [
      ['ip', prefs.v4],
      ['ipv6', prefs.v6],
    ] as const) {
      const f = dirs
        .get(dir)!
        .find(x => x.pref === pref && x.protocol === proto && x.kind === 'flower' && x.options && ours(x, cookie))
      const where = `${dir} ${proto} pref ${pref}`
      if (!f) {
        problems.push(`${where}: no filter of this lease`)
        continue
      }
      const o = f.options!
      if (o.keys?.ip_proto !== 'udp' || Number(o.keys?.dst_port) !== ROCE_V2_UDP_PORT)
        problems.push(`${where}: does not match udp dst_port ${ROCE_V2_UDP_PORT}`)
      if (!o.skip_sw) problems.push(`${where}: not skip_sw (a software filter never sees hardware RoCE)`)
      if (!o.in_hw || o.not_in_hw)
        problems.push(`${where}: not in hardware (${o.not_in_hw ? 'not_in_hw' : 'no in_hw'})`)
      const act = (o.actions ?? []).find(a => a.cookie === cookie)
      if (act?.kind !== 'gact' || act.control_action?.type !== 'drop')
        problems.push(`${where}: its action is not a drop`)
      packets += act?.stats?.hw_packets ?? act?.stats?.packets ?? 0
    }
  }
  if (problems.length > 0) return {ok: false, evidence: `tc flower: ${problems.join('; ')}`}
  return {
    ok: true,
    evidence:
      `tc flower drop of udp ${ROCE_V2_UDP_PORT} in hardware on ingress and egress (IPv4, ` +
      `IPv6): ${packets} packet(s) dropped so far`,
  }
}

/** Clean: none of the lease's filters on either direction (a netdev without clsact has none). */
export function judgeTcClean(leaseId: string, stdout: string, code: number | null): Judgement {
  const dirs = code === 0 ? parseDirections(stdout) : undefined
  if (!dirs) return {ok: false, evidence: `tc filter listing: exit ${code}: cleanliness unverified`}
  const cookie = tcCookie(leaseId)
  const prefs = tcPrefs(leaseId)
  const left = [...dirs.entries()].flatMap(([dir, list]) =>
    list
      .filter(
        f => f.options && (ours(f, cookie) || ((f.pref === prefs.v4 || f.pref === prefs.v6) && f.kind === 'flower')),
      )
      .map(f => `${dir} pref ${f.pref}`),
  )
  if (left.length > 0) return {ok: false, evidence: `tc filters of this lease still present: ${left.join(', ')}`}
  return {ok: true, evidence: 'no tc filter of this lease on ingress or egress'}
}

/** Can a flower drop be offloaded on this NIC? The reason it cannot, and what would make it possible. */
export function tcFlowerSupport(nic: NicFacts): {ok: true} | {ok: false; why: string; fix: string} {
  const dev = nic.netdev ?? nic.legend ?? nic.label
  if (nic.hwTcOffload === undefined)
    return {
      ok: false,
      why: `\`ethtool -k ${dev}\` could not be read`,
      fix: `install ethtool on the host (pdchaos must see \`hw-tc-offload: on\` for ${dev})`,
    }
  if (nic.hwTcOffload !== 'on') {
    const fixed = /fixed/.test(nic.hwTcOffload)
    return {
      ok: false,
      why: `${dev} does not offload tc filters (\`ethtool -k ${dev}\`: hw-tc-offload: ${nic.hwTcOffload})`,
      fix: fixed
        ? `a NIC whose driver offloads tc flower (e.g. a ConnectX with hw-tc-offload), or --allow-link-down`
        : `turn the feature on yourself (\`ethtool -K ${dev} hw-tc-offload on\`; pdchaos does not change NIC ` +
          `features), or --allow-link-down`,
    }
  }
  if (!nic.tc?.version)
    return {ok: false, why: 'tc (iproute2) is not installed on the host', fix: 'install iproute2 (tc)'}
  const missing = Object.entries(nic.tc.modules)
    .filter(([, v]) => v === 'missing')
    .map(([m]) => m)
  if (missing.length > 0)
    return {
      ok: false,
      why: `the kernel lacks ${missing.join(', ')} (flower classifier, drop action, clsact qdisc)`,
      fix: `a kernel with ${missing.join(', ')}`,
    }
  return {ok: true}
}

export function buildTcFlower(nic: NicFacts, leaseId: string): MechanismPlan {
  const dev = nic.netdev!
  const prefs = tcPrefs(leaseId)
  const cookie = tcCookie(leaseId)
  const filter = (dir: 'ingress' | 'egress', proto: 'ip' | 'ipv6', pref: number): string[] => [
    'tc',
    'filter',
    'add',
    'dev',
    dev,
    dir,
    'protocol',
    proto,
    'pref',
    String(pref),
    'handle',
    '1',
    'flower',
    'skip_sw',
    'ip_proto',
    'udp',
    'dst_port',
    String(ROCE_V2_UDP_PORT),
    'action',
    'gact',
    'drop',
    'cookie',
    cookie,
  ]
  const created = nic.hasClsact ? '0' : '1'
  return {
    inject: [
      ['sh', '-c', CLSACT_ADD_SCRIPT, 'sh', dev],
      filter('ingress', 'ip', prefs.v4),
      filter('ingress', 'ipv6', prefs.v6),
      filter('egress', 'ip', prefs.v4),
      filter('egress', 'ipv6', prefs.v6),
    ],
    revert: [['sh', '-c', TC_REVERT_SCRIPT, 'sh', dev, String(prefs.v4), String(prefs.v6), created]],
    verifyInjected: {
      name: `tc flower drop of RoCEv2 in hardware on ${dev}`,
      argv: tcListArgv(dev),
      sudo: true,
      judge: (o, c) => judgeTcInjected(leaseId, o, c),
    },
    verifyClean: {
      name: `no tc filter of this lease on ${dev}`,
      argv: tcListArgv(dev),
      sudo: true,
      judge: (o, c) => judgeTcClean(leaseId, o, c),
    },
    readOnlyProbes: [['ethtool', '-k', dev], ['tc', '-j', 'qdisc', 'show', 'dev', dev], tcListArgv(dev)],
    summary:
      `tc flower skip_sw drop of udp dst_port ${ROCE_V2_UDP_PORT} on ${dev} ingress and egress ` +
      `(prefs ${prefs.v4}/${prefs.v6}, cookie ${cookie.slice(0, 8)}…)`,
  }
}
