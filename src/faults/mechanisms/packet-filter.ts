import {createHash} from 'node:crypto'
import {isIP} from 'node:net'

import {badInput, oneLine} from '../../errors.js'
import type {Host} from '../../hosts/host.js'
import type {Endpoint, FilterTool, Judgement, MechanismPlan} from '../fault.js'

/**
 * Packet-filter mechanism: drop (or rate-limit) chosen TCP traffic in objects pdchaos owns alone, one per lease,
 * so that a revert deletes exactly what this lease added and never touches anyone else's rules.
 * - nftables (preferred): table `inet pdchaos_<tag>` with base chains on the input and output hooks, built in one
 *   atomic nft transaction; revert = `add table; delete table` in one transaction (a no-op when already gone).
 * - iptables (fallback, IPv4 only): chain PDCHAOS-<tag> jumped from INPUT and OUTPUT; revert removes the jumps
 *   and the chain by a constant script, and fails only if something of ours is still there.
 * Every rule carries a comment naming its match, so verification finds each expected rule (and its counter).
 */

/**
 * Inbound traffic to a port (optionally of one address); both directions of one TCP connection; or UDP to or from a
 * port on one network interface, both directions (`iface-udp`: the twin's rail NIC, whose KV is kernel UDP to port
 * 4791 — never a hardware RoCE NIC, whose traffic netfilter never sees).
 */
export type FilterMatch =
  /** from: only packets from this source address (trip-breaker: the gateway's connections to prefill's HTTP port). */
  | {kind: 'to'; port: number; addr?: string; from?: string}
  | {kind: 'flow'; a: Endpoint; b: Endpoint}
  | {kind: 'iface-udp'; iface: string; port: number}

/** A Linux interface name as netfilter matches it (IFNAMSIZ 16, plain characters: it is quoted into an nft script). */
export const IFACE_NAME = /^[A-Za-z0-9_.:-]{1,15}$/

/**
 * Drop every matching packet, or only what exceeds a rate (slows a connection down instead of stopping it), or refuse
 * it with a TCP reset (the sender's connect fails at once instead of waiting out its own timeout).
 */
export type FilterAction = {kind: 'drop'} | {kind: 'rate'; kbytesPerSecond: number} | {kind: 'reject'}

export interface FilterSpec {
  tool: FilterTool
  leaseId: string
  matches: FilterMatch[]
  action?: FilterAction
}

export interface FilterPlan extends MechanismPlan {
  tool: FilterTool
  /** nft table or iptables chain name. */
  object: string
}

/** A short, plain name derived from the lease id (iptables chain names are at most 28 characters). */
export function filterTag(leaseId: string): string {
  if (/^[a-z0-9_]{1,20}$/.test(leaseId)) return leaseId
  return 'h' + createHash('sha256').update(leaseId).digest('hex').slice(0, 15)
}

export const nftTableName = (leaseId: string): string => `pdchaos_${filterTag(leaseId)}`
export const iptablesChainName = (leaseId: string): string => `PDCHAOS-${filterTag(leaseId)}`

const IPT_WAIT = ['-w', '5']

function checkPort(port: number): number {
  if (!Number.isInteger(port) || port < 1 || port > 65_535)
    throw badInput(`invalid TCP port ${port} in a packet-filter match`)
  return port
}

function family(addr: string): 'ip' | 'ip6' {
  const v = isIP(addr)
  if (v === 4) return 'ip'
  if (v === 6) return 'ip6'
  throw badInput(`invalid IP address ${JSON.stringify(addr)} in a packet-filter match`, 'give an IPv4 or IPv6 literal')
}

type Hook = 'input' | 'output'

interface Rule {
  key: string
  /** nft match expression (without counter/verdict). */
  nft: string
  /** iptables match arguments (without -j). */
  ipt: string[]
  /**
   * The hooks the rule sits on (default both): an interface match names the in-interface on input only, the
   * out-interface on output only.
   */
  hooks?: Hook[]
}

const hooksOf = (r: Rule): Hook[] => r.hooks ?? ['input', 'output']

/** Each match as directed rules, each with the comment key that names it. */
function rulesOf(matches: FilterMatch[]): Rule[] {
  if (matches.length === 0)
    throw badInput('a packet filter needs at least one match', 'name the ports or connections to drop')
  const rules: Rule[] = []
  const seen = new Set<string>()
  const push = (r: Rule) => {
    if (seen.has(r.key)) return
    seen.add(r.key)
    rules.push(r)
  }
  for (const m of matches) {
    if (m.kind === 'to') {
      const port = checkPort(m.port)
      if (m.from !== undefined) {
        if (m.addr !== undefined)
          throw badInput('a packet-filter match names a source or a destination address, not both')
        const f = family(m.from)
        push({
          key: `from-${m.from}-to-${port}`,
          nft: `${f} saddr ${m.from} tcp dport ${port}`,
          ipt: ['-p', 'tcp', '-s', m.from, '--dport', String(port)],
        })
      } else if (m.addr === undefined) {
        push({key: `to-${port}`, nft: `tcp dport ${port}`, ipt: ['-p', 'tcp', '--dport', String(port)]})
      } else {
        const f = family(m.addr)
        push({
          key: `to-${m.addr}-${port}`,
          nft: `${f} daddr ${m.addr} tcp dport ${port}`,
          ipt: ['-p', 'tcp', '-d', m.addr, '--dport', String(port)],
        })
      }
    } else if (m.kind === 'iface-udp') {
      if (!IFACE_NAME.test(m.iface))
        throw badInput(`invalid interface name ${JSON.stringify(m.iface)} in a packet-filter match`)
      const port = checkPort(m.port)
      // Both ports: RoCEv2 puts 4791 in every packet's destination port; the twin's NIC also sends from it.
      for (const dir of ['dport', 'sport'] as const) {
        const ipt = dir === 'dport' ? '--dport' : '--sport'
        push({
          key: `udp-in-${m.iface}-${dir}-${port}`,
          nft: `iifname "${m.iface}" udp ${dir} ${port}`,
          ipt: ['-i', m.iface, '-p', 'udp', ipt, String(port)],
          hooks: ['input'],
        })
        push({
          key: `udp-out-${m.iface}-${dir}-${port}`,
          nft: `oifname "${m.iface}" udp ${dir} ${port}`,
          ipt: ['-o', m.iface, '-p', 'udp', ipt, String(port)],
          hooks: ['output'],
        })
      }
    } else {
      const fa = family(m.a.addr)
      if (family(m.b.addr) !== fa) throw badInput(`a connection ${m.a.addr} <-> ${m.b.addr} mixes address families`)
      for (const [dir, s, d] of [
        ['fwd', m.a, m.b],
        ['rev', m.b, m.a],
      ] as const) {
        checkPort(s.port)
        checkPort(d.port)
        push({
          key: `flow-${m.a.addr}-${m.a.port}-${m.b.addr}-${m.b.port}-${dir}`,
          nft: `${fa} saddr ${s.addr} tcp sport ${s.port} ${fa} daddr ${d.addr} tcp dport ${d.port}`,
          ipt: ['-p', 'tcp', '-s', s.addr, '--sport', String(s.port), '-d', d.addr, '--dport', String(d.port)],
        })
      }
    }
  }
  return rules
}

function describeMatch(m: FilterMatch): string {
  if (m.kind === 'to') return `tcp ${m.from === undefined ? '' : `from ${m.from} `}to ${m.addr ?? '*'}:${m.port}`
  if (m.kind === 'iface-udp') return `udp port ${m.port} in and out of ${m.iface}`
  return `tcp ${m.a.addr}:${m.a.port} <-> ${m.b.addr}:${m.b.port}`
}

export function buildFilter(spec: FilterSpec): FilterPlan {
  const action = spec.action ?? {kind: 'drop'}
  if (
    action.kind === 'rate' &&
    (!Number.isInteger(action.kbytesPerSecond) || action.kbytesPerSecond < 1 || action.kbytesPerSecond > 10_000_000)
  ) {
    throw badInput(`invalid rate ${action.kbytesPerSecond} kbytes/s`, 'give an integer from 1 to 10000000')
  }
  const rules = rulesOf(spec.matches)
  const verb =
    action.kind === 'drop'
      ? 'drop'
      : action.kind === 'reject'
        ? 'refuse (TCP reset)'
        : `limit to ${action.kbytesPerSecond} kbytes/s`
  const what = `${verb} ${spec.matches.map(describeMatch).join(', ')}`
  return spec.tool === 'nft'
    ? nftFilter(spec.leaseId, rules, action, what)
    : iptablesFilter(spec.leaseId, rules, action, what)
}

// ---------------------------------------------------------------- nftables

function nftFilter(leaseId: string, rules: Rule[], action: FilterAction, what: string): FilterPlan {
  const table = nftTableName(leaseId)
  const verdict =
    action.kind === 'drop'
      ? 'counter drop'
      : action.kind === 'reject'
        ? 'counter reject with tcp reset'
        : `limit rate over ${action.kbytesPerSecond} kbytes/second burst 64 kbytes counter drop`
  // One nft invocation = one transaction: the table appears with every rule, or not at all.
  const lines = [
    `add table inet ${table}`,
    // Priority -10: before the usual filter chains, so an accept elsewhere does not matter (a drop is final anyway).
    `add chain inet ${table} input { type filter hook input priority -10; policy accept; }`,
    `add chain inet ${table} output { type filter hook output priority -10; policy accept; }`,
  ]
  for (const chain of ['input', 'output'] as const) {
    for (const r of rules)
      if (hooksOf(r).includes(chain))
        lines.push(`add rule inet ${table} ${chain} ${r.nft} ${verdict} comment "${r.key}"`)
  }
  return {
    tool: 'nft',
    object: `inet ${table}`,
    inject: [['nft', lines.join('\n')]],
    revert: [['nft', 'add', 'table', 'inet', table, ';', 'delete', 'table', 'inet', table]],
    verifyInjected: {
      name: `nft table inet ${table} holds its rules`,
      argv: ['nft', '-j', 'list', 'table', 'inet', table],
      sudo: true,
      judge: (stdout, code) =>
        judgeNftInjected(
          table,
          rules.map(r => ({key: r.key, chains: hooksOf(r)})),
          stdout,
          code,
        ),
    },
    verifyClean: {
      name: `nft table inet ${table} is gone`,
      argv: ['nft', '-j', 'list', 'tables'],
      sudo: true,
      judge: (stdout, code) => judgeNftClean(table, stdout, code),
    },
    readOnlyProbes: [
      ['nft', '--version'],
      ['nft', '-j', 'list', 'tables'],
    ],
    summary: `nft table inet ${table} (input+output hooks): ${what}`,
  }
}

interface NftObject {
  table?: {family: string; name: string}
  chain?: {family: string; table: string; name: string; hook?: string}
  rule?: {family: string; table: string; chain: string; comment?: string; expr?: Array<Record<string, unknown>>}
}

function parseNftJson(stdout: string): NftObject[] | undefined {
  try {
    const doc = JSON.parse(stdout) as {nftables?: NftObject[]}
    return Array.isArray(doc.nftables) ? doc.nftables : undefined
  } catch {
    return undefined
  }
}

function counterOf(expr: Array<Record<string, unknown>> | undefined): number {
  for (const e of expr ?? []) {
    const c = e.counter as {packets?: number} | undefined
    if (c && typeof c.packets === 'number') return c.packets
  }
  return 0
}

/** Each expected rule by its comment key, on both hooks unless it names its own (a plain string: both). */
export type ExpectedRule = string | {key: string; chains: readonly string[]}

export function judgeNftInjected(
  table: string,
  keys: readonly ExpectedRule[],
  stdout: string,
  code: number | null,
): Judgement {
  const objs = parseNftJson(stdout)
  if (code !== 0 || !objs)
    return {ok: false, evidence: `nft list table inet ${table}: exit ${code}, ${objs ? 'no table' : 'no JSON listing'}`}
  const hooks = new Set(objs.filter(o => o.chain?.table === table).map(o => o.chain!.hook))
  const missing: string[] = []
  let packets = 0
  const expected = keys.map(k => (typeof k === 'string' ? {key: k, chains: ['input', 'output']} : k))
  for (const chain of ['input', 'output']) {
    if (!hooks.has(chain)) missing.push(`${chain} hook`)
    for (const {key, chains} of expected) {
      if (!chains.includes(chain)) continue
      const rule = objs.find(o => o.rule?.table === table && o.rule.chain === chain && o.rule.comment === key)?.rule
      if (!rule) missing.push(`${chain}:${key}`)
      else packets += counterOf(rule.expr)
    }
  }
  if (missing.length > 0) return {ok: false, evidence: `nft table inet ${table} lacks ${missing.join(', ')}`}
  return {
    ok: true,
    evidence:
      `nft table inet ${table}: ${keys.length} rule(s) on their input/output hooks, ${packets} packet(s) ` +
      `matched so far`,
    matchedPackets: packets,
  }
}

export function judgeNftClean(table: string, stdout: string, code: number | null): Judgement {
  const objs = parseNftJson(stdout)
  if (code !== 0 || !objs) return {ok: false, evidence: `cannot list nft tables (exit ${code}): cleanliness unverified`}
  const left = objs.filter(o => o.table?.name === table)
  if (left.length > 0)
    return {
      ok: false,
      evidence: `nft table ${left.map(o => `${o.table!.family} ${table}`).join(', ')} is still present`,
    }
  return {ok: true, evidence: `nft lists ${objs.filter(o => o.table).length} table(s), none named ${table}`}
}

// ---------------------------------------------------------------- iptables

/**
 * Revert for the iptables fallback, a constant script (the chain arrives as $1): remove every jump to the chain
 * from INPUT and OUTPUT (bounded), flush and delete the chain, then succeed only if iptables-save shows none of it.
 */
export const IPTABLES_REVERT_SCRIPT = [
  'c="$1"',
  'for h in INPUT OUTPUT; do i=0; while [ "$i" -lt 32 ] && iptables -w 5 -D "$h" -j "$c" 2>/dev/null; do ' +
    'i=$((i+1)); done; done',
  'if iptables -w 5 -n -L "$c" >/dev/null 2>&1; then iptables -w 5 -F "$c"; iptables -w 5 -X "$c"; fi',
  'if iptables-save -t filter | awk -v c="$c" \'$1 == ":" c || ($1 == "-A" && $NF == c) || ($1 == "-A" && $2 == c) ' +
    '{ f = 1 } END { exit !f }\'; then echo "pdchaos: chain $c is still present" >&2; exit 1; fi',
  'exit 0',
].join('\n')

function iptablesFilter(leaseId: string, rules: Rule[], action: FilterAction, what: string): FilterPlan {
  const chain = iptablesChainName(leaseId)
  if (action.kind === 'rate')
    throw badInput(
      'rate limiting needs nftables on the host (the iptables fallback only drops)',
      'install nftables, or run without widening the window',
    )
  const target = action.kind === 'reject' ? ['REJECT', '--reject-with', 'tcp-reset'] : ['DROP']
  const v6 = rules.find(r => r.nft.startsWith('ip6 ') || r.nft.includes(' ip6 '))
  if (v6)
    throw badInput(`the iptables fallback handles IPv4 only, and ${v6.key} is IPv6`, 'install nftables on the host')
  const inject: string[][] = [['iptables', ...IPT_WAIT, '-N', chain]]
  for (const r of rules)
    inject.push(['iptables', ...IPT_WAIT, '-A', chain, ...r.ipt, '-m', 'comment', '--comment', r.key, '-j', ...target])
  // Jumps last: the chain is complete before any packet is sent into it.
  inject.push(
    ['iptables', ...IPT_WAIT, '-I', 'INPUT', '1', '-j', chain],
    ['iptables', ...IPT_WAIT, '-I', 'OUTPUT', '1', '-j', chain],
  )
  return {
    tool: 'iptables',
    object: `chain ${chain}`,
    inject,
    revert: [['sh', '-c', IPTABLES_REVERT_SCRIPT, 'sh', chain]],
    verifyInjected: {
      name: `iptables chain ${chain} holds its rules and is jumped to`,
      argv: ['iptables-save', '-c', '-t', 'filter'],
      sudo: true,
      judge: (stdout, code) =>
        judgeIptablesInjected(
          chain,
          rules.map(r => r.key),
          stdout,
          code,
          target[0],
        ),
    },
    verifyClean: {
      name: `iptables chain ${chain} is gone`,
      argv: ['iptables-save', '-t', 'filter'],
      sudo: true,
      judge: (stdout, code) => judgeIptablesClean(chain, stdout, code),
    },
    readOnlyProbes: [
      ['iptables', '--version'],
      ['iptables-save', '-t', 'filter'],
    ],
    summary: `iptables chain ${chain} (jumped from INPUT and OUTPUT): ${what}`,
  }
}

interface SaveLine {
  counter: number
  words: string[]
}

function parseSave(stdout: string): SaveLine[] {
  const out: SaveLine[] = []
  for (const raw of stdout.split('\n')) {
    let line = raw.trim()
    let counter = 0
    const m = /^\[(\d+):(\d+)\]\s+/.exec(line)
    if (m) {
      counter = Number(m[1])
      line = line.slice(m[0].length)
    }
    if (line) out.push({counter, words: line.split(/\s+/)})
  }
  return out
}

function commentOf(words: string[]): string | undefined {
  const i = words.indexOf('--comment')
  return i >= 0 ? words[i + 1]?.replace(/^"|"$/g, '') : undefined
}

export function judgeIptablesInjected(
  chain: string,
  keys: string[],
  stdout: string,
  code: number | null,
  target = 'DROP',
): Judgement {
  if (code !== 0) return {ok: false, evidence: `iptables-save exit ${code}`}
  const lines = parseSave(stdout)
  const missing: string[] = []
  if (!lines.some(l => l.words[0] === `:${chain}`)) missing.push('the chain')
  for (const hook of ['INPUT', 'OUTPUT']) {
    if (!lines.some(l => l.words[0] === '-A' && l.words[1] === hook && l.words.at(-1) === chain))
      missing.push(`the jump from ${hook}`)
  }
  let packets = 0
  for (const key of keys) {
    const rule = lines.find(
      l =>
        l.words[0] === '-A' &&
        l.words[1] === chain &&
        commentOf(l.words) === key &&
        l.words[l.words.indexOf('-j') + 1] === target,
    )
    if (!rule) missing.push(`rule ${key}`)
    else packets += rule.counter
  }
  if (missing.length > 0) return {ok: false, evidence: `iptables lacks ${missing.join(', ')} of ${chain}`}
  return {
    ok: true,
    evidence:
      `iptables chain ${chain}: ${keys.length} ${target} rule(s), jumped from INPUT and OUTPUT, ${packets} ` +
      `packet(s) matched so far`,
    matchedPackets: packets,
  }
}

export function judgeIptablesClean(chain: string, stdout: string, code: number | null): Judgement {
  if (code !== 0) return {ok: false, evidence: `iptables-save exit ${code}: cleanliness unverified`}
  const left = parseSave(stdout).filter(
    l => l.words[0] === `:${chain}` || (l.words[0] === '-A' && (l.words[1] === chain || l.words.at(-1) === chain)),
  )
  if (left.length > 0)
    return {ok: false, evidence: `iptables still has ${left.length} line(s) of ${chain}: ${left[0]!.words.join(' ')}`}
  return {ok: true, evidence: `iptables-save shows no chain ${chain} and no jump to it`}
}

// ---------------------------------------------------------------- detection

export interface ToolDetection {
  tool?: FilterTool
  evidence: string
}

/**
 * Which packet filter the host has and may use: a version AND a privileged read-only listing must both work
 * (a binary that exists but cannot list rules would inject nothing). nft first.
 */
export async function detectFilterTool(host: Host, timeoutMs = 5000): Promise<ToolDetection> {
  const tries: Array<{tool: FilterTool; version: string[]; list: string[]}> = [
    {tool: 'nft', version: ['nft', '--version'], list: ['nft', '-j', 'list', 'tables']},
    {tool: 'iptables', version: ['iptables', '--version'], list: ['iptables-save', '-t', 'filter']},
  ]
  const notes: string[] = []
  for (const t of tries) {
    try {
      const v = await host.run(t.version, {timeoutMs})
      if (v.code !== 0) {
        notes.push(`${t.tool}: not usable (${oneLine(v.stderr) || `exit ${v.code}`})`)
        continue
      }
      const l = await host.run(t.list, {timeoutMs, sudo: true})
      const listed = t.tool === 'nft' ? l.code === 0 && parseNftJson(l.stdout) !== undefined : l.code === 0
      if (!listed) {
        notes.push(
          `${t.tool}: ${oneLine(v.stdout)} but listing rules failed (${oneLine(l.stderr) || `exit ${l.code}`})`,
        )
        continue
      }
      return {tool: t.tool, evidence: [...notes, `${t.tool}: ${oneLine(v.stdout)}, rules listable`].join('; ')}
    } catch (error) {
      notes.push(`${t.tool}: ${oneLine(error)}`)
    }
  }
  return {evidence: notes.join('; ') || 'no packet filter found'}
}

/** The error when a plan needs a packet filter and the host has none usable. */
export function noFilterTool(evidence: string | undefined): Error {
  return badInput(
    `no usable packet filter on the host (${evidence ?? 'not probed'})`,
    'install nftables (or iptables) and run as root or with passwordless sudo',
  )
}
