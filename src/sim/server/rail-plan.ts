/**
 * The twin's rail NICs (`sim up --rail-nics`) and UCX's reliable-connection (RC) settings: pure data, shared by the
 * lifecycle (which creates the interfaces), the servers (which carry KV over them) and the nvidia-smi stand-in.
 *
 * A rail-optimized 8-GPU host has one NIC per GPU behind the GPU's own PCIe switch (`nvidia-smi topo -m`: GPU g is
 * PIX to NIC g). Here each NIC is a veth `rail<g>` with its own address 198.18.<g>.1/24 (RFC 2544's benchmarking
 * range, unlikely to clash with a real network), its peer end `rsw<g>` a port of the bridge `railsw` (the rail
 * switch). A GPU's KV leaves by its own rail as UDP datagrams to port 4791, RoCEv2's port, so netfilter sees them on
 * that interface: `-o rail<g>` as they leave, `-i rail<k>` as they arrive at GPU k.
 */

/** RoCEv2's UDP destination port (IANA). */
export const ROCE_V2_PORT = 4791
/** The IB path MTU the twin's datagrams carry at most (RoCE's 4096), over an Ethernet MTU with room for it. */
export const RAIL_PAYLOAD_BYTES = 4096
export const RAIL_ETH_MTU = 9000

export interface RailNic {
  gpu: number
  /** The netdev, as `ip link` and the nvidia-smi stand-in's NIC Legend name it. */
  name: string
  addr: string
  prefixLen: number
  mac: string
  /** The veth's other end: a port of the rail switch (bridge). */
  peer: string
  peerMac: string
}

export interface RailsConfig {
  /** The bridge every rail's peer end is a port of. */
  bridge: string
  nics: RailNic[]
  /** The policy-routing table of rail g is tableBase + g; its rule's priority rulePrefBase + g. */
  tableBase: number
  rulePrefBase: number
  /** Where the `lookup local` rule moves to (from priority 0) so that the rails' rules come first. */
  localRulePref: number
}

const hex2 = (n: number): string => n.toString(16).padStart(2, '0')

/**
 * One NIC per GPU: rail<g>, 198.18.<g>.1/24, locally administered MACs 02:00:c6:12:<g>:01 (its peer :02). `only`:
 * the GPUs of this node (a twin that spans nodes); numbering stays global, so addresses and MACs stay unique across
 * the nodes' rails and one rail fabric can join their switches.
 */
export function railPlan(gpus: number, only?: readonly number[]): RailsConfig {
  const nics: RailNic[] = []
  for (let g = 0; g < gpus; g++) {
    if (only && !only.includes(g)) continue
    nics.push({
      gpu: g,
      name: `rail${g}`,
      addr: `198.18.${g}.1`,
      prefixLen: 24,
      mac: `02:00:c6:12:${hex2(g)}:01`,
      peer: `rsw${g}`,
      peerMac: `02:00:c6:12:${hex2(g)}:02`,
    })
  }
  return {bridge: 'railsw', nics, tableBase: 4791_00, rulePrefBase: 50, localRulePref: 100}
}

export const railOfGpu = (rails: RailsConfig | undefined, gpu: number): RailNic | undefined =>
  rails?.nics.find(n => n.gpu === gpu)

// ---- UCX's RC transport settings, read from the rank's environment as UCX reads them ----

/**
 * uct_rc_iface_common_config_table (openucx/ucx src/uct/ib/rc/base/rc_iface.c:40-46): TIMEOUT "1.0s", RETRY_COUNT "7".
 * The table is reached through the "RC_" sub-table prefix and then overridden with the transport's own prefix
 * (ucs_config_apply_config_vars, src/ucs/config/parser.c:1913-1931): UCX_RC_MLX5_TIMEOUT beats UCX_RC_TIMEOUT.
 */
export const UCX_RC_DEFAULTS = {timeout: '1.0s', retryCount: 7}
/** UCT_RC_QP_MAX_RETRY_COUNT (src/uct/ib/rc/base/rc_iface.h:24): larger values are cut to it, with a warning. */
export const UCX_RC_MAX_RETRY_COUNT = 7
/** UCT_IB_FABRIC_TIME_MAX (src/uct/ib/base/ib_device.h:50). */
const IB_FABRIC_TIME_MAX = 32

export type RcTransport = 'rc_mlx5' | 'rc_verbs'

export interface UcxRcSettings {
  transport: RcTransport
  /** The value as written (or UCX's default), and the variable it came from. */
  timeoutText: string
  timeoutFrom: string
  /** The configured timeout in seconds, and what the QP really gets: 4.096 us x 2^exponent (0: none, infinite). */
  timeoutS: number
  qpTimeoutExponent: number
  qpTimeoutS: number
  retryCount: number
  retryCountFrom: string
  /** What UCX would have warned about (a value out of range, an unparsable one). */
  warnings: string[]
}

/**
 * ucs_config_sscanf_time (src/ucs/config/parser.c:497-529): a number, then s, ms, us, ns or m (minutes); none is
 * seconds.
 */
// The twin's own copy of UCX's time syntax (it imports no CLI code); CLI's: engines/sglang/discovery/transport-env.ts
// parseUcxTime
export function parseUcxTime(raw: string): number | undefined {
  const m = /^\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)(m|s|ms|us|ns)?$/.exec(raw)
  if (!m) return undefined
  const v = Number(m[1])
  const perSec: Record<string, number> = {'': 1, s: 1, m: 1 / 60, ms: 1e3, us: 1e6, ns: 1e9}
  const s = v / perSec[m[2] ?? '']!
  return Number.isFinite(s) ? s : undefined
}

/** uct_ib_to_qp_fabric_time (src/uct/ib/base/ib_device.c:1252-1264): the QP's local ACK timeout exponent. */
// The twin's own copy of the QP-timeout formula (imports no CLI code); CLI's: engines/sglang/discovery/transport-env.ts
// qpAckTimeout
export function qpFabricTime(seconds: number): {exponent: number; seconds: number} {
  const to = Math.log(seconds / 4.096e-6) / Math.log(2)
  let exponent: number
  if (!(to >= 1)) exponent = 1
  else if (Math.floor(to + 0.5) >= IB_FABRIC_TIME_MAX) exponent = 0
  else exponent = Math.floor(to + 0.5)
  return {exponent, seconds: exponent === 0 ? Infinity : 4.096e-6 * 2 ** exponent}
}

/** rc_mlx5 unless UCX_TLS names only the verbs flavour (rc_v / rc_verbs) of RC. */
export function rcTransportOf(env: NodeJS.ProcessEnv): RcTransport {
  const tls = (env.UCX_TLS ?? '')
    .split(',')
    .map(t => t.trim().replace(/^\^/, ''))
    .filter(Boolean)
  const verbs = tls.some(t => t === 'rc_v' || t === 'rc_verbs')
  const mlx5 = tls.some(t => t === 'rc_x' || t === 'rc_mlx5' || t === 'rc' || t === 'all')
  return verbs && !mlx5 ? 'rc_verbs' : 'rc_mlx5'
}

export function ucxRcSettings(env: NodeJS.ProcessEnv = process.env): UcxRcSettings {
  const transport = rcTransportOf(env)
  const own = transport === 'rc_mlx5' ? 'UCX_RC_MLX5_' : 'UCX_RC_VERBS_'
  const warnings: string[] = []
  const pick = (field: string): {text: string; from: string} | undefined => {
    for (const name of [`${own}${field}`, `UCX_RC_${field}`]) {
      const v = env[name]
      if (v !== undefined && v !== '') return {text: v, from: name}
    }
    return undefined
  }
  let timeout = pick('TIMEOUT') ?? {text: UCX_RC_DEFAULTS.timeout, from: 'default'}
  let timeoutS = parseUcxTime(timeout.text)
  if (timeoutS === undefined || timeoutS < 0) {
    warnings.push(
      `Invalid value for ${timeout.from}: '${timeout.text}'. Expected: time value: <number>[s|us|ms|ns]; ` +
        `using ${UCX_RC_DEFAULTS.timeout}`,
    )
    timeout = {text: UCX_RC_DEFAULTS.timeout, from: 'default'}
    timeoutS = 1
  }
  let retry = pick('RETRY_COUNT') ?? {text: String(UCX_RC_DEFAULTS.retryCount), from: 'default'}
  let retryCount = /^\s*\d+\s*$/.test(retry.text) ? Number(retry.text) : NaN
  if (!Number.isSafeInteger(retryCount)) {
    warnings.push(
      `Invalid value for ${retry.from}: '${retry.text}'. Expected: unsigned integer; ` +
        `using ${UCX_RC_DEFAULTS.retryCount}`,
    )
    retry = {text: String(UCX_RC_DEFAULTS.retryCount), from: 'default'}
    retryCount = UCX_RC_DEFAULTS.retryCount
  }
  if (retryCount > UCX_RC_MAX_RETRY_COUNT) {
    // uct_rc_iface_config_limit_value (rc_iface.c:530-540)
    warnings.push(`using maximal value for RETRY_COUNT (${UCX_RC_MAX_RETRY_COUNT}) instead of ${retryCount}`)
    retryCount = UCX_RC_MAX_RETRY_COUNT
  }
  const qp = qpFabricTime(timeoutS)
  return {
    transport,
    timeoutText: timeout.text,
    timeoutFrom: timeout.from,
    timeoutS,
    qpTimeoutExponent: qp.exponent,
    qpTimeoutS: qp.seconds,
    retryCount,
    retryCountFrom: retry.from,
    warnings,
  }
}

/** How long a stalled rail is waited out before the endpoint fails: every transmission unacknowledged for a timeout. */
// The twin's own copy of the give-up bound (imports no CLI code); CLI's: transport-env.ts rcLimitsFromEnv giveUpSeconds
export const rcGiveUpS = (s: Pick<UcxRcSettings, 'qpTimeoutS' | 'retryCount'>): number =>
  s.qpTimeoutS * (s.retryCount + 1)
