import type {Role, ServerLayout, SimConfig} from '../sim-config.js'

export type {ServerLayout} from '../sim-config.js'

export interface RankCoords {
  /** The DP rank in the title: the attention DP rank with DP attention, the replica with plain DP, else none. */
  dp?: number
  pp: number
  /** The TP rank in the title (across DP groups with DP attention). */
  tp: number
  ep: number
  /** The bootstrap key: dp group and attention TP rank. */
  dpGroup: number
  attnTp: number
}

/**
 * The layout of a role: the one `sim up` was given, or the plain one (TP only, prefill on the first GPUs, decode
 * after).
 */
export function serverLayout(cfg: SimConfig, role: Role): ServerLayout {
  const given = cfg.layout?.[role]
  if (given) return given
  const tp = role === 'prefill' ? cfg.prefillTp : cfg.decodeTp
  // Over several nodes each node holds only this server's share, from GPU 0 (SGLang's default --base-gpu-id).
  if (cfg.dist?.role === role)
    return {tp, dp: 1, pp: 1, dpAttention: false, ep: 1, baseGpuId: 0, tpPerNode: tp / cfg.dist.nnodes}
  return {tp, dp: 1, pp: 1, dpAttention: false, ep: 1, baseGpuId: role === 'prefill' ? 0 : cfg.prefillTp}
}

/** Scheduler processes: DP attention splits the TP group, plain DP runs dp whole TP×PP groups. */
export function rankCount(l: ServerLayout): number {
  return l.tp * l.pp * (l.dpAttention ? 1 : l.dp)
}

export function attnTpSize(l: ServerLayout): number {
  return l.dpAttention ? l.tp / l.dp : l.tp
}

/** Flat rank k in SGLang's launch order: DP replica, then PP stage, then TP rank (so GPU = base + k). */
export function coordsOf(l: ServerLayout, k: number): RankCoords {
  const stage = l.tp * l.pp
  const replica = l.dpAttention ? 0 : Math.floor(k / stage)
  const pp = Math.floor((k % stage) / l.tp)
  const tp = k % l.tp
  const attnSize = attnTpSize(l)
  const dpGroup = l.dpAttention ? Math.floor(tp / attnSize) : replica
  // moe_ep_rank = tp_rank // (tp_size // ep_size)
  const ep = Math.floor(tp / (l.tp / l.ep))
  return {...(l.dp > 1 ? {dp: dpGroup} : {}), pp, tp, ep, dpGroup, attnTp: tp % attnSize}
}

/**
 * SGLang's scheduler title (`managers/scheduler.py`, `configure_scheduler_process`): `sglang::scheduler`, then `_DP<d>`
 * when a DP rank is set, `_PP<p>` when pp > 1, `_TP<t>` only when tp > 1, `_EP<e>` when ep > 1 (the twin has no
 * attention CP or MoE DP, whose `_ATTN_CP` / `_MOE_DP` would sit between PP and TP).
 */
export function titleOf(l: ServerLayout, k: number): string {
  const c = coordsOf(l, k)
  return (
    `sglang::scheduler${c.dp === undefined ? '' : `_DP${c.dp}`}${l.pp > 1 ? `_PP${c.pp}` : ''}` +
    `${l.tp > 1 ? `_TP${c.tp}` : ''}${l.ep > 1 ? `_EP${c.ep}` : ''}`
  )
}

/**
 * The GPU a flat rank computes on: base-gpu-id + k, through CUDA_VISIBLE_DEVICES when set. Over several nodes, k is the
 * global TP rank and its node's GPU is base + k % tp_per_node (engine.py, the scheduler launch loop).
 */
export function physicalGpu(l: ServerLayout, k: number): number {
  const local = l.baseGpuId + (l.tpPerNode ? k % l.tpPerNode : k)
  return l.cudaVisibleDevices ? l.cudaVisibleDevices[local]! : local
}

/** The key a prefill rank registers under at the bootstrap server (common/conn.py `_handle_route_put`). */
export function routeKeyOf(l: ServerLayout, k: number): {dp: number; cp: number; tp: number; pp: number} {
  const c = coordsOf(l, k)
  return {dp: c.dpGroup, cp: 0, tp: c.attnTp, pp: c.pp}
}

/** SGLang's launch flags for this server, as its command line (or config file) holds them. */
export function launchFlags(cfg: SimConfig, role: Role): Array<[string, string | true]> {
  const l = serverLayout(cfg, role)
  const custom = cfg.layout?.[role] !== undefined
  const port = cfg.dockerProxy ? cfg.dockerProxy[role] : cfg.ports[role]
  return [
    ['disaggregation-mode', role],
    ['host', cfg.host],
    ['port', String(port)],
    ['tp-size', String(l.tp)],
    ...(l.dp > 1 ? [['dp-size', String(l.dp)] as [string, string]] : []),
    ...(l.dpAttention ? [['enable-dp-attention', true] as [string, true]] : []),
    ...(l.pp > 1 ? [['pp-size', String(l.pp)] as [string, string]] : []),
    ...(l.ep > 1 ? [['ep-size', String(l.ep)] as [string, string]] : []),
    // The plain layout keeps the twin's old command line (decode's base GPU is implicit there).
    ...(custom || l.baseGpuId !== 0 ? [['base-gpu-id', String(l.baseGpuId)] as [string, string]] : []),
    ['disaggregation-bootstrap-port', String(cfg.ports.bootstrap)],
    ['disaggregation-transfer-backend', cfg.backend],
    // SGLang's multi-node flags, on every node's command line (discovery reads them from ps).
    ...(cfg.dist?.role === role
      ? ([
          ['dist-init-addr', cfg.dist.distInitAddr],
          ['nnodes', String(cfg.dist.nnodes)],
          ['node-rank', String(cfg.dist.nodeRank)],
        ] as Array<[string, string]>)
      : []),
  ]
}

export function launchArgv(flags: Array<[string, string | true]>): string[] {
  return flags.flatMap(([k, v]) => (v === true ? [`--${k}`] : [`--${k}`, v]))
}

/** The same flags as SGLang's YAML config file (`--config FILE`): one `key: value` per flag. */
export function launchYaml(flags: Array<[string, string | true]>): string {
  return (
    flags.map(([k, v]) => `${k}: ${v === true ? 'true' : /^[\w./:-]+$/.test(v) ? v : JSON.stringify(v)}`).join('\n') +
    '\n'
  )
}

/** The PUT /route body fields that place a prefill rank (CommonKVManager.register_to_bootstrap). */
export function registrationKey(l: ServerLayout, k: number): Record<string, number> {
  const c = coordsOf(l, k)
  // DP attention: one system DP group, the attention DP rank places the rank; plain DP: the system DP rank does.
  return {
    attn_tp_size: attnTpSize(l),
    attn_tp_rank: c.attnTp,
    attn_cp_size: 1,
    attn_cp_rank: 0,
    attn_dp_size: l.dpAttention ? l.dp : 1,
    attn_dp_rank: l.dpAttention ? c.dpGroup : 0,
    pp_size: l.pp,
    pp_rank: c.pp,
    system_dp_size: l.dpAttention ? 1 : l.dp,
    system_dp_rank: l.dpAttention ? 0 : c.dpGroup,
  }
}
