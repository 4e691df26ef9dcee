import type {z} from 'zod'

import type {Deployment} from '../deployment/config.js'
import type {FaultExpectation} from '../checks/expectation.js'
import type {RankInfo, StatusReport} from '../engines/sglang/discovery/discover.js'
import type {Topology} from '../discovery/topo.js'
import type {RouterSettings} from '../engines/sglang/discovery/router-settings.js'
import type {HealthCheckSettings} from '../engines/sglang/discovery/transport-env.js'
import type {SglangTimeouts} from '../engines/sglang/discovery/sglang-timeouts.js'
import type {HeartbeatSettings} from '../engines/sglang/discovery/heartbeat-bound.js'
import {badInput, oneLine} from '../errors.js'
import type {Host} from '../hosts/host.js'
import {shellCommand} from '../hosts/quote.js'
import type {Calibration, PinState, Timeline} from '../model/timeline.js'
import {sleep} from '../util/time.js'

/**
 * What a fault is to the rest of pdchaos: a pure planner from what discovery saw (plus a few read-only host
 * facts gathered beforehand) to the exact commands that inject it, take it out, and prove each step from the
 * host's state. Faults never judge the deployment; they only say what they changed and how to see it.
 */

/**
 * packet-filter: netfilter (nft, iptables) on kernel traffic (TCP connections, or a kernel UDP interface).
 * tc-flower: a hardware-offloaded tc flower drop of RoCEv2 on a NIC. link-down: `ip link set DEV down`.
 * ib-port-disable: an InfiniBand HCA port disabled (ibportstate). sigstop: a rank stopped (SIGSTOP).
 */
export type MechanismName =
  | 'packet-filter'
  | 'tc-flower'
  | 'link-down'
  | 'ib-port-disable'
  | 'sigstop'
  | 'abort-requests'
  | 'twin-failpoint'
  | 'sigkill'

/**
 * What the runner observes while a fault is in place: pins (requests the fault holds, judged by the eviction check),
 * abort trials, the services' health (a fault whose expected outcome is a wedged instance: checkWedge), or the
 * gateway's circuit breaker and requests sent at it (checkBreakerTrip), or decode's halves of requests held when
 * prefill dies (checkDecodeRelease). Each kind is one module in src/experiment/
 * (observe-<kind>.ts), chosen through experiment/observers.ts; what it adds to a plan is ObservePlanFields[kind].
 */
export type Observe = 'pins' | 'trials' | 'health' | 'breaker' | 'decode-pins'

export interface Judgement {
  ok: boolean
  evidence: string
  /**
   * A packet filter's rules: packets they matched so far (the abort check reads it: did the widening hold anything?).
   */
  matchedPackets?: number
}

/**
 * A check made from host state: argv to run (read-only) and a pure judge of what it printed. The judge sees the
 * exit code only as one more fact: a tool that exits 0 without doing anything must still fail the judge.
 */
export interface Probe {
  name: string
  argv: string[]
  /** Needs privilege (sudo under a passwordless policy). */
  sudo: boolean
  judge(stdout: string, code: number | null): Judgement
}

/** What one mechanism (packet filter, signals, the twin's failure point) contributes to a plan. */
export interface MechanismPlan {
  inject: string[][]
  /** Idempotent: safe to run any number of times, by pdchaos or the lease's reverter. */
  revert: string[][]
  verifyInjected: Probe
  verifyClean: Probe
  readOnlyProbes: string[][]
  /** One line for the plan's description. */
  summary: string
}

/** What discovery saw, narrowed to what a fault plan reads. Synthetic in tests, from discover() in commands. */
export interface FaultDiscovery {
  ranks: RankInfo[]
  transport: StatusReport['transport']
  /** Ports of the services' HTTP APIs, the bootstrap server and the router: never a KV data connection. */
  servicePorts: number[]
  /** Set only when the prefill server says it is pdchaos's twin: the URL of its failure-point endpoint. */
  twinFailpointUrl?: string
  /** `nvidia-smi topo -m` as discovery read it (which NIC is PIX/PXB to each GPU), or why it could not. */
  topology?: Topology
  topologyError?: string
  /** How each server's /health judges it (SGLANG_HEALTH_CHECK_TIMEOUT, generation on or off). */
  health?: Partial<Record<'prefill' | 'decode', HealthCheckSettings>>
  /** SGLang's own PD timeouts, each with where it was read (engines/sglang/discovery/sglang-timeouts.ts). */
  sglangTimeouts?: SglangTimeouts
  /** Decode's heartbeat toward prefill (its environment), when it was read: how soon decode notices a lost prefill. */
  heartbeat?: HeartbeatSettings
  /**
   * The gateway: its URL, the workers' URLs as the deployment file names them, and its settings as `status` reads them.
   */
  gateway?: {routerUrl: string; prefillUrl: string; decodeUrl: string; settings?: RouterSettings}
  /** The prefill server's process (its HTTP and bootstrap server; the schedulers are its children) and HTTP port. */
  prefillServer?: {pid?: number; port: number}
  /** Each role's operator restart command as the deployment file states it (kill-prefill's revert). */
  restart?: Partial<Record<'prefill' | 'decode', string[]>>
}

export function faultDiscovery(report: StatusReport, deployment: Deployment): FaultDiscovery {
  const portOf = (url: string): number => Number(new URL(url).port || (url.startsWith('https') ? 443 : 80))
  const s = deployment.services
  const servicePorts = [portOf(s.prefill.url), portOf(s.decode.url), portOf(s.router.url), s.prefill.bootstrapPort]
  if (s.router.metricsUrl) servicePorts.push(portOf(s.router.metricsUrl))
  const fp = report.services.prefill.twinFailpointPath
  const health: FaultDiscovery['health'] = {}
  for (const name of ['prefill', 'decode'] as const) {
    const hc = report.services[name].healthCheck
    if (hc) health[name] = hc
  }
  return {
    ranks: report.ranks,
    transport: report.transport,
    servicePorts: [...new Set(servicePorts)],
    ...(fp ? {twinFailpointUrl: new URL(fp, s.prefill.url).href} : {}),
    ...(report.topology ? {topology: report.topology} : {}),
    ...(report.topologyError ? {topologyError: report.topologyError} : {}),
    ...(Object.keys(health).length ? {health} : {}),
    ...(report.sglangTimeouts ? {sglangTimeouts: report.sglangTimeouts} : {}),
    ...(report.watchdog.heartbeat ? {heartbeat: report.watchdog.heartbeat} : {}),
    prefillServer: {
      ...(report.services.prefill.pid === undefined ? {} : {pid: report.services.prefill.pid}),
      port: portOf(s.prefill.url),
    },
    restart: {
      ...(s.prefill.restart ? {prefill: s.prefill.restart} : {}),
      ...(s.decode.restart ? {decode: s.decode.restart} : {}),
    },
    gateway: {
      routerUrl: s.router.url,
      prefillUrl: s.prefill.url,
      decodeUrl: s.decode.url,
      ...(report.services.router.routerSettings ? {settings: report.services.router.routerSettings} : {}),
    },
  }
}

export type FilterTool = 'nft' | 'iptables'

/** One endpoint of a TCP connection as ss shows it. */
export interface Endpoint {
  addr: string
  port: number
}

/** An established TCP connection from `ss -tnpH`, with the pids owning its local end (empty without privilege). */
export interface Connection {
  state: string
  local: Endpoint
  peer: Endpoint
  pids: number[]
}

/** Read-only facts a plan needs from the host, gathered before planning so that plan() stays pure. */
export interface HostFacts {
  /** Packet-filter tool found on the host (nft preferred), or undefined if neither works. */
  filterTool?: FilterTool
  /** Why that tool (or none) was chosen: versions and permission checks. */
  filterEvidence?: string
  /** Established TCP connections (ss -tnpH). */
  connections?: Connection[]
  /** The NIC(s) of the target GPU as sysfs, ethtool, tc and ip describe them (stall-kv off TCP). */
  nics?: NicFacts[]
  /** Processes read from /proc/<pid>/stat (kill-prefill: the prefill server's identity). */
  processes?: Array<{pid: number; startTicks: number; state: string}>
}

/** One NIC of a GPU, resolved on the host (read-only): what it is and what can stall it. */
export interface NicFacts {
  /** The matrix label and the NIC Legend's name (`NIC3`, `mlx5_3`; on the twin the netdev itself). */
  label: string
  legend?: string
  /** The RDMA device behind it, if any (/sys/class/infiniband). None: a kernel-only netdev. */
  rdmaDevice?: string
  /** Its network interface (/sys/class/infiniband/<dev>/ports/1/gid_attrs/ndevs/0 or device/net/*). */
  netdev?: string
  /** The netdev is in this network namespace but sysfs shows another's: whether an RDMA device backs it is unknown. */
  rdmaUnknown?: boolean
  /** /sys/class/infiniband/<dev>/ports/1/link_layer: Ethernet (RoCE) or InfiniBand. */
  linkLayer?: string
  /** Port 1 state and physical state as sysfs prints them ("4: ACTIVE", "5: LinkUp"). */
  portState?: string
  portPhysState?: string
  /** `ethtool -k DEV`: the hw-tc-offload feature as printed ("on", "off", "off [fixed]"), undefined if not probed. */
  hwTcOffload?: string
  /** tc's version line and the kernel pieces a flower drop needs (cls_flower, act_gact, sch_ingress for clsact). */
  tc?: {version?: string; modules: Record<string, string>}
  /** A clsact qdisc was already on the netdev before pdchaos (then pdchaos never deletes it). */
  hasClsact?: boolean
  /** `command -v ibportstate` (InfiniBand only). */
  ibportstate?: string
  /** The netdev's routes and global IPv6 addresses, which `ip link set down` deletes (link-down restores them). */
  routes?: RouteEntry[]
  addrs6?: string[]
  /** Each probe's result in one line, for the plan's notes and refusals. */
  evidence: string[]
}

/** A route as `ip -j route show table all dev DEV` prints it (the fields pdchaos restores). */
export interface RouteEntry {
  family: 4 | 6
  type?: string
  dst: string
  gateway?: string
  table?: string
  protocol?: string
  scope?: string
  prefsrc?: string
  metric?: number
  flags?: string[]
  /** A multipath route: pdchaos cannot rebuild it. */
  multipath?: boolean
}

export interface FaultContext<P> {
  discovery: FaultDiscovery
  params: P
  /** Measured on unfaulted requests before any fault: a fault that plans from timing (abort offsets) reads it here. */
  calibration?: Calibration
  /** The watchdog contract the run is judged by. */
  contract?: Timeline['contract']
  /** The lease this plan is injected under: names the host-side objects (nft table, iptables chain). */
  leaseId: string
  facts: HostFacts
}

/** A process or connection the fault acts on, with the identity that makes it safe to act on later. */
export interface FaultTarget {
  service: 'prefill' | 'decode'
  tpRank: number
  pid: number
  startTicks?: number
  gpu?: number
  /** Ports whose inbound traffic is dropped (drop-dest-info). */
  ports?: number[]
  /** Connections whose both directions are dropped or slowed (stall-kv, abort-mid-transfer widening). */
  connections?: Array<{local: Endpoint; peer: Endpoint}>
  /** The NIC(s) a NIC-wide stall acts on (netdev or RDMA device names, comma-separated). */
  nic?: string
}

/** One abort trial: a request with pdchaos's own rid, aborted at an offset inside the transfer window. */
export interface AbortTrial {
  index: number
  rid: string
  /** Milliseconds after the request is sent at which both aborts are fired. */
  offsetMs: number
  aborts: Array<{service: 'prefill' | 'decode'; method: 'POST'; path: '/abort_request'; body: {rid: string}}>
}

/** The transfer window abort trials aim at, and how it was widened (the abort check judges coverage by it). */
export interface TransferWindow {
  startMs: number
  endMs: number
  why: string
  widening: 'packet-filter' | 'twin-failpoint' | 'none'
}

/** A plan, whatever its fault observes. */
export interface PlanBase {
  /** The fault's name as users type it (a key of registry.ts, which checks it before any plan is made). */
  fault: string
  mechanism: MechanismName
  leaseId: string
  targets: FaultTarget[]
  /** Commands that inject the fault, in order. Empty when the fault changes nothing on the host. */
  inject: string[][]
  /** Commands that take it out: idempotent, safe to run any number of times, by pdchaos or the lease's reverter. */
  revert: string[][]
  /** Inject and revert need privilege. */
  sudo: boolean
  /** Every probe must judge ok after inject (empty: nothing on the host to check). */
  verifyInjected: Probe[]
  /** Every probe must judge ok after revert. */
  verifyClean: Probe[]
  /** What --dry-run runs: read-only checks that the tools, permissions and targets exist. */
  readOnlyProbes: string[][]
  description: string
  /**
   * Why the requested variant was not used (e.g. a packet filter refused on RDMA); informational once a plan exists.
   */
  refusals?: string[]
  notes?: string[]
  /**
   * What the deployment is expected to do, for the checks (machine-readable; the notes say it in words): a stall that
   * the transport turns into an error before the watchdog deadline, or a wedged instance's health bounds.
   */
  expected?: FaultExpectation
}

/** What a plan of a fault observed by abort trials adds: the trials, and the window they sweep. */
export interface TrialsPlanFields {
  trials: AbortTrial[]
  /** The window the trials sweep (ms after send) and what holds it open. */
  transferWindow?: TransferWindow
}

/**
 * What each observation kind adds to a plan: the kind's module (src/experiment/observe-<kind>.ts) reads it. A new kind
 * adds its row here and its module to experiment/observers.ts.
 */
export interface ObservePlanFields {
  pins: object
  trials: TrialsPlanFields
  health: object
  breaker: object
  'decode-pins': object
}

/** The plan of a fault observed as `K`. */
export type PlanOf<K extends Observe> = PlanBase & ObservePlanFields[K]

/**
 * The plan of any fault: the plan of one of the kinds (what a kind adds is read only by that kind's module, which
 * narrows it with PlanOf<K>).
 */
export type FaultPlan = {[K in Observe]: PlanOf<K>}[Observe]

/** What one scenario holds while it runs: the planner batches only scenarios whose footprints do not overlap. */
export interface Footprint {
  /** Runs alone (restart, SIGSTOP wedging an instance): why. */
  exclusive?: string
  gpus: number[]
  /** Packet-filter ports: 'zmq:all', 'zmq:<rank>' (a prefill rank's ZMQ input), 'kv:<gpu>' (data connections). */
  ports: string[]
  /** The PD queue its pins are held in. */
  queue?: 'bootstrap' | 'inflight'
}

/**
 * The footprint's port names: `kv:<gpu>` (a GPU's KV data connections), and `zmq:<rank>` / `zmq:all` (a prefill TP
 * rank's ZMQ input, or every rank's). ZMQ ports belong to a prefill instance: on another prefill instance the same name
 * is another port. The planner asks these two, and never reads a port's name itself.
 */
export function isPrefillInstancePort(port: string): boolean {
  return port.startsWith('zmq:')
}

/** Whether two footprint ports name the same port (equal, or `zmq:all` and any ZMQ port) on one instance. */
export function portsOverlap(a: string, b: string): boolean {
  if (a === b) return true
  return isPrefillInstancePort(a) && isPrefillInstancePort(b) && (a === 'zmq:all' || b === 'zmq:all')
}

/** What the planner knows of the deployment before discovery runs per batch. */
export interface FootprintContext {
  /**
   * The data path as the suite runner saw it: 'packet-filter' when it is kernel TCP, anything else when it is not
   * ('sigstop' is what older callers pass for "not TCP": stall-kv never stops a process, it acts on the GPU's NIC).
   */
  autoMechanism?: 'packet-filter' | 'sigstop' | 'nic'
}

/**
 * A fault, whole in one file: its params (one strict zod object; the oclif flags and the suite file's `params`
 * are derived from it), where its pins are held, its footprint for the planner, the mechanisms it may use, and
 * plan/verify/revert (plan() returns the commands and the probes that prove each step). K: what the runner observes
 * (`observe`), which types what its plan carries (PlanOf<K>): a fault that declares it, e.g. `Fault<Params,
 * 'trials'>`, must return its trials from plan().
 */
// biome-ignore lint/suspicious/noExplicitAny: the registry holds faults of every params type side by side
export interface Fault<P = any, K extends Observe = Observe> {
  name: string
  summary: string
  /** Strict zod object of the params a user may set; `.describe()` texts become flag and schema help. */
  params: z.ZodObject
  /** A param's flag name where it is not the kebab-case of its key. */
  flagNames?: Readonly<Record<string, string>>
  /** Cross-param rules zod cannot say per field: the param concerned and why ("needs --gpu N"), or undefined. */
  refine?(params: P, label: (key: string) => string): {key: string; why: string} | undefined
  mechanisms: readonly MechanismName[]
  /** What the runner observes while the fault is in place: its kind's module in experiment/ (observers.ts). */
  observe: K
  /**
   * Where its pins are held while the fault is in place ('trials' for abort trials). Absent: the fault holds no pins
   * (observe 'health': its expected outcome is a wedged instance, not a held request).
   */
  pins?: PinState | 'trials'
  /**
   * The role whose ranks on every node it acts on, for these params (drop-dest-info without --rank: every prefill
   * rank): on an instance over several nodes the runner plans it on each node's ranks, under a lease on each host.
   */
  onEveryNode?(params: P): 'prefill' | 'decode' | undefined
  footprint(params: P, ctx: FootprintContext): Footprint
  /** Read-only host probes the plan needs (run before plan(); also what --dry-run runs). */
  gather(host: Host, discovery: FaultDiscovery, params: P, opts?: {timeoutMs?: number}): Promise<HostFacts>
  /** Pure: the plan, or a badInput naming why no safe plan exists. */
  plan(ctx: FaultContext<P>): PlanOf<K>
}

/**
 * Whether a scenario's footprint depends on the data path (its `auto` mechanism, or a widening that follows it): the
 * planner must then know the data path before it batches. Asked of the footprint itself, so no fault is named here.
 */
export function followsDataPath<P>(fault: Fault<P>, params: P): boolean {
  const under = (ctx: FootprintContext) => JSON.stringify(fault.footprint(params, ctx))
  const unknown = under({})
  return unknown !== under({autoMechanism: 'packet-filter'}) || unknown !== under({autoMechanism: 'nic'})
}

/** A fault scenario's fault and its params, parsed once (faults/params.ts) where the scenario is read. */
export interface FaultScenario<P = unknown> {
  fault: Fault<P>
  params: P
}

/** THE rendering of a command for people and for the lease: every argument through shellCommand(). */
export function renderArgv(argv: readonly string[]): string {
  return shellCommand(argv)
}

export function renderPlan(plan: FaultPlan): {
  inject: string[]
  revert: string[]
  verifyInjected: string[]
  verifyClean: string[]
  readOnlyProbes: string[]
} {
  return {
    inject: plan.inject.map(renderArgv),
    revert: plan.revert.map(renderArgv),
    verifyInjected: plan.verifyInjected.map(p => renderArgv(p.argv)),
    verifyClean: plan.verifyClean.map(p => renderArgv(p.argv)),
    readOnlyProbes: plan.readOnlyProbes.map(renderArgv),
  }
}

/** Run one probe on the host with a deadline and judge it. A probe that cannot run judges not ok (with why). */
export async function runProbe(
  host: Host,
  probe: Probe,
  timeoutMs = 5000,
): Promise<Judgement & {probe: string; ms: number}> {
  const started = performance.now()
  try {
    const res = await host.run(probe.argv, {timeoutMs, sudo: probe.sudo})
    const j = probe.judge(res.stdout, res.code)
    if (!j.ok && res.stderr.trim()) j.evidence += ` (stderr: ${oneLine(res.stderr).slice(0, 200)})`
    return {...j, probe: probe.name, ms: performance.now() - started}
  } catch (error) {
    return {
      ok: false,
      evidence: `${probe.name}: could not run: ${oneLine(error)}`,
      probe: probe.name,
      ms: performance.now() - started,
    }
  }
}

/** Run every probe; ok only when all are. */
export async function runProbes(
  host: Host,
  probes: Probe[],
  timeoutMs = 5000,
): Promise<{ok: boolean; results: Array<Judgement & {probe: string; ms: number}>}> {
  const results = await Promise.all(probes.map(p => runProbe(host, p, timeoutMs)))
  return {ok: results.every(r => r.ok), results}
}

const LEASE_ID = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$/

/** Lease ids end up in rids, table names and file names: plain characters only. */
export function checkLeaseId(id: string): string {
  if (!LEASE_ID.test(id))
    throw badInput(
      `invalid lease id ${JSON.stringify(id)}`,
      'use 1-64 letters, digits, _ . or - (starting with a letter or digit)',
    )
  return id
}

export function describeRank(r: {service: string; tpRank: number; pid: number; gpu?: number}): string {
  return `${r.service} TP${r.tpRank} (pid ${r.pid}${r.gpu === undefined ? '' : `, GPU ${r.gpu}`})`
}

/**
 * Poll the probes until all judge ok or the deadline passes (a signal or a rule takes a moment to show in /proc
 * or a listing). Returns the last judgement either way; the deadline is mandatory.
 */
export async function waitProbes(
  host: Host,
  probes: Probe[],
  deadlineMs: number,
  intervalMs = 50,
): Promise<{ok: boolean; results: Array<Judgement & {probe: string; ms: number}>; waitedMs: number}> {
  const started = performance.now()
  const until = started + deadlineMs
  for (;;) {
    const r = await runProbes(host, probes, Math.max(1000, Math.min(5000, deadlineMs)))
    if (r.ok || performance.now() + intervalMs > until) return {...r, waitedMs: performance.now() - started}
    await sleep(intervalMs)
  }
}
