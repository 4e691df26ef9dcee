import {execFile} from 'node:child_process'
import {createHash} from 'node:crypto'
import {existsSync, readFileSync, writeFileSync} from 'node:fs'

import {badInput, unavailable} from './sim-error.js'
import type {RailsConfig} from '../server/rail-plan.js'

/**
 * `sim up --rail-nics`: the rail NICs in the twin host's network namespace, made with iproute2 (this kernel has
 * veth and bridge, but no dummy interfaces, VRF or tc flower):
 *
 *   rail<g> (198.18.<g>.1/24, MTU 9000) ==veth== rsw<g> -- bridge railsw (the rail switch)
 *
 * Every rail address is local to the one namespace, and the kernel would deliver traffic between local addresses
 * over `lo`. So that a GPU's KV really leaves by its rail and arrives by its peer's, the `lookup local` rule moves
 * from priority 0 to 100 and each rail gets a rule before it: locally sent packets from 198.18.<g>.1 use table
 * 479100+g, whose only route is 198.18.0.0/16 out of rail<g>; the peers' MACs are permanent neighbours; the frame
 * crosses the bridge to rail<k>, which accepts a local source (accept_local=1). Netfilter then sees each datagram
 * leave (OUTPUT/POSTROUTING, -o rail<g>) and arrive (PREROUTING/INPUT, -i rail<k>). Nothing else changes: every other
 * destination still finds the local table first (no rule of ours matches it).
 *
 * A twin that spans nodes (--only) makes on each node the rails of that node's GPUs and its own bridge; a rail fabric
 * (a link made a port of each node's railsw) joins the switches. The peers on other nodes are reached by the same
 * rules and routes: their MACs are learnt by ARP, which each rail answers only for its own address (arp_ignore=1),
 * as separate NICs do, so a frame for GPU k's address always arrives by rail<k>.
 */

const IP = 'ip'

/** A tag on every interface of this twin's rails (`ip -d link` shows it as alias), so only its owner removes them. */
export function railOwnerTag(stateDir: string): string {
  return `pdchaos-twin:${createHash('sha256').update(stateDir).digest('hex').slice(0, 12)}`
}

function run(argv: string[], input?: string): Promise<{code: number; stdout: string; stderr: string}> {
  return new Promise(resolve => {
    const child = execFile(argv[0]!, argv.slice(1), {timeout: 10_000, encoding: 'utf8'}, (err, stdout, stderr) => {
      const code = err ? (typeof (err as {code?: unknown}).code === 'number' ? (err as {code: number}).code : 127) : 0
      resolve({code, stdout, stderr: stderr || (err && code === 127 ? err.message : '')})
    })
    // `ip -batch -` can exit before it has read all its input (a line it refuses ends it): the write then fails with
    // EPIPE, which unhandled would kill sim up; the exit code and stderr above say what went wrong.
    child.stdin?.on('error', () => {})
    child.stdin?.end(input ?? '')
  })
}

const batch = (lines: string[], force = false) =>
  run([IP, ...(force ? ['-force'] : []), '-batch', '-'], lines.join('\n') + '\n')

function sysctl(path: string, value: string): void {
  try {
    writeFileSync(path, value)
  } catch {
    /* absent (no IPv6) or read-only: the path works without it */
  }
}

const linkExists = (name: string): boolean => existsSync(`/sys/class/net/${name}`)

function aliasOf(name: string): string {
  try {
    return readFileSync(`/sys/class/net/${name}/ifalias`, 'utf8').trim()
  } catch {
    return ''
  }
}

/** `ip -batch` lines that create the switch and one veth per GPU, each tagged as this twin's. */
function linkCommands(rails: RailsConfig, tag: string): string[] {
  // The switch has no address and answers no ARP (else it would answer for every local rail address, with its own MAC,
  // to a peer on another node, and the KV would arrive on the bridge, not on the destination's rail).
  const links: string[] = [
    `link add ${rails.bridge} type bridge`,
    `link set dev ${rails.bridge} alias ${tag}:switch`,
    `link set dev ${rails.bridge} arp off`,
  ]
  for (const n of rails.nics) {
    links.push(
      `link add ${n.name} address ${n.mac} type veth peer name ${n.peer} address ${n.peerMac}`,
      `link set dev ${n.name} alias ${tag}:gpu${n.gpu}`,
      `link set dev ${n.peer} alias ${tag}:gpu${n.gpu}:switch-port`,
      `link set dev ${n.name} mtu 9000`,
      `link set dev ${n.peer} mtu 9000`,
      `link set dev ${n.peer} master ${rails.bridge}`,
      `addr add ${n.addr}/${n.prefixLen} dev ${n.name}`,
    )
  }
  return links
}

/** Each rail's sysctls, once its links exist. */
function railSysctls(rails: RailsConfig, names: string[]): void {
  // No IPv6 chatter (DAD, router solicitations) on the rails; a local source accepted on a rail (the peer GPU's).
  for (const dev of names) sysctl(`/proc/sys/net/ipv6/conf/${dev}/disable_ipv6`, '1')
  for (const n of rails.nics) {
    sysctl(`/proc/sys/net/ipv4/conf/${n.name}/accept_local`, '1')
    sysctl(`/proc/sys/net/ipv4/conf/${n.name}/rp_filter`, '0')
    // ARP for the rails of other nodes: answer only for this rail's own address, ask from it (one NIC per address).
    sysctl(`/proc/sys/net/ipv4/conf/${n.name}/arp_ignore`, '1')
    sysctl(`/proc/sys/net/ipv4/conf/${n.name}/arp_announce`, '2')
  }
}

/** `ip -batch` lines that bring the rails up and route each rail's traffic out of its own NIC. */
function routingCommands(rails: RailsConfig, rulesShown: string): string[] {
  const localAt0 = /^0:\s+from all lookup local\s*$/m.test(rulesShown)
  const localMoved = new RegExp(`^${rails.localRulePref}:\\s+from all lookup local\\s*$`, 'm').test(rulesShown)
  const routing: string[] = [
    `link set dev ${rails.bridge} up`,
    ...rails.nics.flatMap(n => [`link set dev ${n.peer} up`, `link set dev ${n.name} up`]),
  ]
  // The local rule is added at its new place before it leaves priority 0: local delivery never lapses.
  if (!localMoved) routing.push(`rule add pref ${rails.localRulePref} lookup local`)
  if (localAt0) routing.push('rule del pref 0 lookup local')
  for (const n of rails.nics) {
    const table = rails.tableBase + n.gpu
    routing.push(
      `rule add pref ${rails.rulePrefBase + n.gpu} from ${n.addr} iif lo lookup ${table}`,
      `route add 198.18.0.0/16 dev ${n.name} table ${table}`,
    )
    for (const peer of rails.nics)
      if (peer.gpu !== n.gpu) routing.push(`neigh replace ${peer.addr} lladdr ${peer.mac} dev ${n.name} nud permanent`)
  }
  return routing
}

/** Create the rails of `rails` for the twin in `stateDir`; replaces its own leftovers, refuses anyone else's. */
export async function createRails(rails: RailsConfig, stateDir: string): Promise<void> {
  if (process.getuid?.() !== 0) {
    throw badInput(
      '--rail-nics creates network interfaces (one veth per GPU) and policy-routing rules, which needs root ' +
        '(CAP_NET_ADMIN)',
      'run sim up as root, best inside a network namespace of its own: ip netns exec NS pdchaos sim up --rail-nics …',
    )
  }
  const tag = railOwnerTag(stateDir)
  const names = [rails.bridge, ...rails.nics.flatMap(n => [n.name, n.peer])]
  const foreign = names.filter(n => linkExists(n) && !aliasOf(n).startsWith(tag))
  if (foreign.length > 0) {
    throw badInput(
      `cannot create the rail NICs: interface ${foreign.join(', ')} already exists here and is not this twin's ` +
        `(another twin with --rail-nics in this network namespace?)`,
      'stop the other twin (pdchaos sim down --state-dir …), or run this one in a network namespace of its own',
    )
  }
  if (names.some(linkExists)) await destroyRails(rails, stateDir)

  const links = linkCommands(rails, tag)
  const made = await batch(links)
  if (made.code !== 0) {
    await destroyRails(rails, stateDir)
    throw unavailable(
      `could not create the rail NICs: ${made.stderr.trim().split('\n').join(' | ') || `ip exited ${made.code}`}`,
      'run `ip link` to see what is there',
    )
  }
  railSysctls(rails, names)

  const rules = await run([IP, 'rule', 'show'])
  const routing = routingCommands(rails, rules.stdout)
  const routed = await batch(routing)
  if (routed.code !== 0) {
    await destroyRails(rails, stateDir)
    throw unavailable(
      `could not route the rail NICs: ${routed.stderr.trim().split('\n').join(' | ') || `ip exited ${routed.code}`}`,
      'run `ip rule` and `ip link` to see what is there',
    )
  }
}

/**
 * Remove this twin's rails (only interfaces carrying its tag) and its rules; put `lookup local` back at priority 0
 * once no rail rule is left. Best effort and idempotent: what is already gone is skipped.
 */
export async function destroyRails(rails: RailsConfig, stateDir: string): Promise<void> {
  if (process.getuid?.() !== 0) return
  const tag = railOwnerTag(stateDir)
  const lines: string[] = []
  for (const n of rails.nics)
    lines.push(`rule del pref ${rails.rulePrefBase + n.gpu} from ${n.addr} iif lo lookup ${rails.tableBase + n.gpu}`)
  for (const n of rails.nics)
    if (linkExists(n.name) && aliasOf(n.name).startsWith(tag)) lines.push(`link del ${n.name}`) // its peer goes with it
  if (linkExists(rails.bridge) && aliasOf(rails.bridge).startsWith(tag)) lines.push(`link del ${rails.bridge}`)
  await batch(lines, true)
  const rules = (await run([IP, 'rule', 'show'])).stdout
  const railRulesLeft = rails.nics.some(n => new RegExp(`^${rails.rulePrefBase + n.gpu}:\\s`, 'm').test(rules))
  if (railRulesLeft) return
  const restore: string[] = []
  if (!/^0:\s+from all lookup local\s*$/m.test(rules)) restore.push('rule add pref 0 lookup local')
  if (new RegExp(`^${rails.localRulePref}:\\s+from all lookup local\\s*$`, 'm').test(rules))
    restore.push(`rule del pref ${rails.localRulePref} lookup local`)
  if (restore.length > 0) await batch(restore, true)
}
