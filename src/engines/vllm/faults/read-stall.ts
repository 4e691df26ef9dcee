import {type ProcessRow, type Listener, parseEnviron, parsePs, parseSsListeners} from '../../../discovery/proc.js'
import {PdError, oneLine} from '../../../errors.js'
import {ExitCode} from '../../../exit-codes.js'
import type {Host} from '../../../hosts/host.js'
import {type Judgement, runProbes} from '../../../faults/fault.js'
import {LeaseGuard} from '../../../faults/lease/lease-guard.js'
import {newLeaseId} from '../../../faults/lease/lease.js'
import {classifyDataPath, type DataPath} from '../../../faults/mechanisms/data-path.js'
import {buildFilter, detectFilterTool, type FilterPlan} from '../../../faults/mechanisms/packet-filter.js'
import type {VllmDeployment} from '../deployment-file.js'
import type {VllmStatusReport} from '../discover.js'

/**
 * The READ stall on vLLM (issue 31 item 3), the mechanism only: D's NIXL READ of P's blocks stops on P's data path
 * while both processes stay alive. Found over the Host interface as on a real host: the TCP listeners owned by P's
 * process tree (`ss -tlnpH`, pids from `ps`), minus P's HTTP port and its NIXL side-channel port
 * (VLLM_NIXL_SIDE_CHANNEL_PORT from /proc/<pid>/environ, and the deployment file's sideChannelPort), are P's data
 * listeners; inbound TCP to them is dropped by a packet filter (faults/mechanisms/packet-filter.ts: an nft table or
 * iptables chain owned by one fault lease, with a host-side reverter). A data path that is not positively TCP
 * (NIXL without UCX_TLS limited to tcp: UCX picks RDMA or cuda_ipc, which netfilter never sees) is refused.
 * Real NIXL has one agent (one UCX listener) per TP worker: without --gpu every data listener of P's tree is dropped
 * (the whole data path); `--gpu N` picks P's rank on GPU N (its index in P's CUDA_VISIBLE_DEVICES, or N itself when
 * that is unset), its process by title (`VLLM::Worker_TP<k>`, or `VLLM::EngineCore` at TP 1 where the worker runs in
 * it) and drops only the listeners that process owns; a GPU with no rank of P is refused, naming the ranks present.
 *
 * API: planReadStall(ctx, opts) -> plan (lines, ports, filter) or {refusal, hint}; installReadStall(ctx, plan) ->
 * handle with verify() (the rule's counter) and revert() (idempotent; also on Ctrl-C: a second signal reverts at once,
 * and the host reverts by itself at the lease's TTL).
 */

export const READ_STALL_FAULT = 'read-stall'

export interface ReadStallContext {
  host: Host
  deployment: VllmDeployment
  discovery: VllmStatusReport
  signal?: AbortSignal
  progress?: (line: string) => void
}

export interface ReadStallOptions {
  /** The fault lease's TTL: the host lifts the filter by itself then, whoever forgets it. */
  ttlMs: number
  /** --gpu: only the data listener of P's rank on this GPU. */
  gpu?: number
  /** The lease's fault name (lowercase, -): the experiment's, e.g. stall-kv. */
  fault?: string
  /** The command line recorded with the lease. */
  command?: string
}

export interface DataListener {
  address: string
  port: number
  pids: number[]
}

export interface ReadStallPlan {
  fault: string
  leaseId: string
  ttlMs: number
  stateDir: string
  dataPath: DataPath
  /** P's data listeners the filter drops TCP to. */
  listeners: DataListener[]
  /** Listeners of P's tree left alone, each with why. */
  excluded: string[]
  /** --gpu: the rank picked, its process and how the GPU was mapped to it. */
  rank?: PickedRank
  /** P's NIXL side-channel port(s) (left open): where the twin's heartbeats travel; real vLLM's ride NIXL. */
  sideChannelPorts: number[]
  filter: FilterPlan
  sudo: boolean
  lines: string[]
}

export type Refusal = {refusal: string; hint: string}

/** Every pid under (and including) root in a `ps` table. */
export function processTree(rows: ProcessRow[], root: number): Set<number> {
  const tree = new Set([root])
  for (let grew = true; grew; ) {
    grew = false
    for (const r of rows)
      if (tree.has(r.ppid) && !tree.has(r.pid)) {
        tree.add(r.pid)
        grew = true
      }
  }
  return tree
}

export interface TargetInput {
  tree: Set<number>
  listeners: Listener[]
  httpPort: number
  sideChannelPorts: number[]
  /** MASTER_PORT and the like: torch.distributed's store of P's TP group, never a KV data path. */
  otherPorts?: number[]
}

/** P's data listeners from the host's listening sockets, pure; a refusal when none is left. */
export function dataListeners(i: TargetInput): {listeners: DataListener[]; excluded: string[]} | Refusal {
  const mine = i.listeners.filter(l => l.pids.some(p => i.tree.has(p)))
  const excluded: string[] = []
  const out: DataListener[] = []
  const seen = new Set<number>()
  for (const l of mine) {
    const why =
      l.port === i.httpPort
        ? "P's HTTP port"
        : i.sideChannelPorts.includes(l.port)
          ? "P's NIXL side channel (VLLM_NIXL_SIDE_CHANNEL_PORT: the handshake, heartbeats and notifications)"
          : (i.otherPorts ?? []).includes(l.port)
            ? "torch.distributed's store (MASTER_PORT)"
            : undefined
    if (why) excluded.push(`${l.address}:${l.port} (${why})`)
    else if (!seen.has(l.port)) {
      seen.add(l.port)
      out.push({address: l.address, port: l.port, pids: l.pids.filter(p => i.tree.has(p))})
    }
  }
  if (out.length === 0)
    return {
      refusal:
        `no data listener of P found: P's process tree (${i.tree.size} process(es)) listens on ` +
        `${mine.map(l => l.port).join(', ') || 'no TCP port'}, all of them HTTP or side channel`,
      hint: 'check `ss -tlnp` on the host as root (socket owners need root), and that P runs NIXL over TCP',
    }
  return {listeners: out, excluded}
}

const positivePort = (v: unknown): number | undefined => {
  const n = Number(v)
  return Number.isInteger(n) && n > 0 && n < 65_536 ? n : undefined
}

interface HostFacts {
  tree: Set<number>
  rows: ProcessRow[]
  listeners: Listener[]
  env: Record<string, string> | undefined
}

export interface PickedRank {
  rank: number
  pid: number
  title: string
  /** How GPU N was mapped to the rank. */
  how: string
}

/** P's TP ranks by process title: `<prefix>::Worker_TP<k>` in P's tree, or the engine core alone (TP 1). Pure. */
export function ranksOf(rows: ProcessRow[], tree: Set<number>): Map<number, {pid: number; title: string}> {
  const mine = rows.filter(r => tree.has(r.pid))
  const out = new Map<number, {pid: number; title: string}>()
  for (const r of mine) {
    const m = /::Worker_TP(\d+)\b/.exec(r.args)
    if (m) out.set(Number(m[1]), {pid: r.pid, title: r.args.trim()})
  }
  const core = mine.find(r => /::EngineCore\b/.test(r.args))
  if (out.size === 0 && core) out.set(0, {pid: core.pid, title: core.args.trim()})
  return out
}

/** P's rank on GPU `gpu` (CUDA_VISIBLE_DEVICES order: worker k uses the k-th visible device), or a refusal. Pure. */
export function pickRank(
  gpu: number,
  ranks: Map<number, {pid: number; title: string}>,
  cudaVisible: string | undefined,
): PickedRank | Refusal {
  const visible = cudaVisible?.split(',').map(x => x.trim())
  const rank = visible ? visible.indexOf(String(gpu)) : gpu
  const how = visible
    ? `GPU ${gpu} is entry ${rank} of P's CUDA_VISIBLE_DEVICES=${cudaVisible}`
    : `GPU ${gpu} = local rank ${gpu} (P's CUDA_VISIBLE_DEVICES unset)`
  const got = ranks.get(rank)
  if (rank >= 0 && got) return {rank, ...got, how}
  const present = [...ranks.entries()]
    .sort(([a], [b]) => a - b)
    .map(([k, r]) => `rank ${k}${visible?.[k] === undefined ? '' : ` (GPU ${visible[k]})`}: ${r.title} pid ${r.pid}`)
  const gpus = [...ranks.keys()].sort((a, b) => a - b).map(k => visible?.[k] ?? String(k))
  return {
    refusal:
      `--gpu ${gpu}: P has no TP rank on GPU ${gpu} ` +
      `(${present.length} rank(s): ${present.join('; ') || 'none found'})`,
    hint: gpus.length > 0 ? `pass --gpu ${gpus.join(' or ')}, or drop --gpu for every rank` : 'drop --gpu',
  }
}

async function readHostFacts(ctx: ReadStallContext, pid: number): Promise<HostFacts | Refusal> {
  const t = {timeoutMs: 10_000, ...(ctx.signal ? {signal: ctx.signal} : {})}
  const ps = await ctx.host.run(['ps', '-eo', 'pid=,ppid=,stat=,args='], t)
  const ss = await ctx.host.run(['ss', '-tlnpH'], {...t, sudo: true})
  if (ss.code !== 0)
    return {
      refusal: `cannot list listening sockets (ss -tlnpH: exit ${ss.code}, ${oneLine(ss.stderr) || 'no output'})`,
      hint: 'install iproute2 (ss) on the host and run as root or with passwordless sudo',
    }
  const environ = await ctx.host.run(['cat', `/proc/${pid}/environ`], {...t, sudo: true})
  const rows = parsePs(ps.stdout)
  return {
    tree: processTree(rows, pid),
    rows,
    listeners: parseSsListeners(ss.stdout),
    env: environ.code === 0 ? parseEnviron(environ.stdout) : undefined,
  }
}

/** The plan, read from the host (changes nothing), or the one-line reason the READ cannot be stalled here. */
export async function planReadStall(ctx: ReadStallContext, opts: ReadStallOptions): Promise<ReadStallPlan | Refusal> {
  const p = ctx.discovery.servers.find(s => s.role === 'prefill')
  if (p?.pid === undefined)
    return {
      refusal: `P's server process was not found: ${p?.problems.join('; ') || 'no prefill server'}`,
      hint: 'run `pdchaos status -c FILE` to see what discovery read on the host',
    }
  const facts = await readHostFacts(ctx, p.pid)
  if ('refusal' in facts) return facts
  const dataPath = classifyDataPath({
    backend: ctx.deployment.backend ?? 'nixl',
    source: `P's environment (/proc/${p.pid}/environ)`,
    ...(facts.env ? {env: facts.env} : {}),
  })
  if (dataPath.kind !== 'tcp')
    return {
      refusal:
        `P's KV data path is ${dataPath.kind === 'rdma' ? 'RDMA' : 'unknown'} (${dataPath.evidence}): ` +
        'a packet filter would not stall it',
      hint: 'run P with UCX_TLS limited to tcp (e.g. UCX_TLS=tcp,self,sm) for this experiment, or stall another way',
    }
  const side = [positivePort(facts.env?.VLLM_NIXL_SIDE_CHANNEL_PORT), ctx.deployment.services.prefill.sideChannelPort]
  const sideChannelPorts = [...new Set(side.filter((x): x is number => x !== undefined))]
  const found = dataListeners({
    tree: facts.tree,
    listeners: facts.listeners,
    httpPort: Number(new URL(ctx.deployment.services.prefill.url).port || 80),
    sideChannelPorts,
    otherPorts: [positivePort(facts.env?.MASTER_PORT)].filter((x): x is number => x !== undefined),
  })
  if ('refusal' in found) return found
  const picked = opts.gpu === undefined ? undefined : pickRankListeners(opts.gpu, facts, found)
  if (picked && 'refusal' in picked) return picked
  const tool = await detectFilterTool(ctx.host)
  if (!tool.tool)
    return {
      refusal: `no usable packet filter on the host (${tool.evidence})`,
      hint: 'install nftables (or iptables) and run as root or with passwordless sudo',
    }
  const fault = opts.fault ?? READ_STALL_FAULT
  const leaseId = newLeaseId(fault)
  const filter = buildFilter({
    tool: tool.tool,
    leaseId,
    matches: (picked?.listeners ?? found.listeners).map(l => ({kind: 'to' as const, port: l.port})),
  })
  const plan = {
    fault,
    leaseId,
    ttlMs: opts.ttlMs,
    stateDir: ctx.deployment.stateDir ?? '/run/pdchaos',
    dataPath,
    ...found,
    ...(picked ? {listeners: picked.listeners, excluded: picked.excluded, rank: picked.rank} : {}),
    sideChannelPorts,
    filter,
    sudo: true,
  }
  return {...plan, lines: renderReadStallPlan(plan)}
}

/** --gpu: only the listeners the rank's process owns; the other ranks' listeners are left alone. */
function pickRankListeners(
  gpu: number,
  facts: HostFacts,
  found: {listeners: DataListener[]; excluded: string[]},
): {rank: PickedRank; listeners: DataListener[]; excluded: string[]} | Refusal {
  const rank = pickRank(gpu, ranksOf(facts.rows, facts.tree), facts.env?.CUDA_VISIBLE_DEVICES)
  if ('refusal' in rank) return rank
  const listeners = found.listeners.filter(l => l.pids.includes(rank.pid))
  if (listeners.length === 0)
    return {
      refusal:
        `--gpu ${gpu}: P's rank ${rank.rank} (${rank.title} pid ${rank.pid}) owns none of P's data listeners ` +
        `(${found.listeners.map(l => `${l.port} pid ${l.pids.join(',')}`).join('; ')})`,
      hint: "drop --gpu to stall every rank's data path, or check `ss -tlnp` on the host as root",
    }
  const others = found.listeners
    .filter(l => !listeners.includes(l))
    .map(l => `${l.address}:${l.port} (another rank's data listener, pid ${l.pids.join(', ')})`)
  return {rank, listeners, excluded: [...found.excluded, ...others]}
}

export function renderReadStallPlan(p: Omit<ReadStallPlan, 'lines'>): string[] {
  return [
    `READ stall: ${p.filter.summary}`,
    `  data path: ${p.dataPath.kind} (${p.dataPath.evidence})`,
    ...(p.rank ? [`  P's rank ${p.rank.rank} on the GPU: ${p.rank.title} pid ${p.rank.pid} (${p.rank.how})`] : []),
    ...p.listeners.map(l => `  P's data listener ${l.address}:${l.port} (pid ${l.pids.join(', ')})`),
    ...p.excluded.map(e => `  left alone: ${e}`),
    `  lease ${p.leaseId}, TTL ${(p.ttlMs / 1000).toFixed(0)} s (the host lifts the filter by itself then)`,
  ]
}

export interface ReadStallHandle {
  leaseId: string
  /** Host clock of the first inject command's start (epoch ms of this process). */
  injectedAt: number
  /** The filter's rules and their counter now (matchedPackets: packets dropped so far). */
  verify(): Promise<Judgement>
  /** Lift the filter and prove it gone; idempotent. */
  revert(): Promise<{clean: boolean; evidence: string[]; revertedAt: number}>
}

/**
 * Install the filter under a fault lease and prove it in place. A guard (actOn 'second') reverts on a second Ctrl-C at
 * once; the first is the caller's stop, whose flow must call revert(). Not in place: reverted, and a PdError (exit 5).
 */
export async function installReadStall(ctx: ReadStallContext, plan: ReadStallPlan): Promise<ReadStallHandle> {
  const guard = new LeaseGuard(ctx.host, plan.stateDir, {actOn: 'second'}).install()
  let done: Awaited<ReturnType<ReadStallHandle['revert']>> | undefined
  const revert = async (): Promise<NonNullable<typeof done>> => {
    if (done) return done
    const r = await guard.revert(plan.leaseId).then(
      x => ({status: x.status as string, exitCode: x.exitCode}),
      (e: unknown) => ({status: `failed (${oneLine(e)})`, exitCode: null}),
    )
    const clean = await runProbes(ctx.host, [plan.filter.verifyClean], 10_000)
    done = {
      clean: clean.ok && (r.exitCode === 0 || r.status === 'already-reverted'),
      evidence: [`revert ${r.status} (exit ${r.exitCode})`, ...clean.results.map(x => x.evidence)],
      revertedAt: Date.now(),
    }
    if (done.clean) guard.dispose()
    return done
  }
  try {
    await guard.create({
      id: plan.leaseId,
      fault: plan.fault,
      params: {mechanism: 'packet-filter', ports: plan.listeners.map(l => l.port)},
      ttlMs: plan.ttlMs,
      revert: plan.filter.revert,
      command: `inject ${plan.fault}`,
    })
  } catch (error) {
    guard.dispose()
    throw error
  }
  const injectedAt = Date.now()
  const failed: string[] = []
  for (const argv of plan.filter.inject) {
    const r = await ctx.host.run(argv, {timeoutMs: 10_000, sudo: plan.sudo})
    if (r.code !== 0) failed.push(`\`${argv[0]}\` exited ${r.code}: ${oneLine(r.stderr).slice(0, 200)}`)
  }
  const verify = async (): Promise<Judgement> =>
    (await runProbes(ctx.host, [plan.filter.verifyInjected], 10_000)).results[0]!
  const v = await verify()
  if (failed.length > 0 || !v.ok) {
    const back = await revert()
    throw new PdError(`the READ stall did not take: ${[...failed, v.evidence].join('; ')}`, {
      exit: back.clean ? ExitCode.unreachable : ExitCode.cleanupUnverified,
      suggestion: back.clean ? "check the host's packet filter (nft list ruleset)" : 'run `pdchaos recover`',
    })
  }
  ctx.progress?.(`READ stall in place: ${v.evidence}`)
  return {leaseId: plan.leaseId, injectedAt, verify, revert}
}
