/**
 * IPC between a server process and its TP-rank processes. Each scheduler-loop iteration sends ONE `step`
 * to every rank (the ops of that iteration, then the rooms to poll) and awaits every rank's `polled`
 * answer: that round trip is the twin's gloo all-reduce.
 */
/** The twin's own failure points, for users who cannot change the host's packet filter (no root). */
/**
 * refuse-generate: the prefill HTTP server resets every /generate connection (as a packet filter's TCP reset would).
 */
export type TwinFailpoint = 'drop-dest-info' | 'stall-kv' | 'refuse-generate'

export type PrefillOp =
  | {op: 'create'; room: string; rid: string}
  | {op: 'failpoint'; name: TwinFailpoint; enabled: boolean; tpRanks: number[]}
  | {op: 'send'; room: string; tokens: number}
  | {op: 'abort'; room: string}
  | {op: 'clear'; room: string}

export type DecodeOp =
  | {op: 'create'; room: string; rid: string; addr: string; tokens: number}
  | {op: 'send_metadata'; room: string}
  | {op: 'abort'; room: string}
  | {op: 'clear'; room: string}
  | {op: 'node_failure'; addr: string}

export type RankOp = PrefillOp | DecodeOp

export interface StepMsg {
  t: 'step'
  seq: number
  ops: RankOp[]
  rooms: string[]
}
/** `reasons`: [index into the step's rooms, why] for the rooms this rank reports Failed (its failure_exception). */
export interface PolledMsg {
  t: 'polled'
  seq: number
  states: number[]
  reasons?: Array<[number, string]>
}
export interface ReadyMsg {
  t: 'ready'
  tpRank: number
  pid: number
  zmqPort: number
  dataPort?: number
}
/**
 * Between steps, something this rank's next poll would report differently may have happened (a ZMQ message, a
 * transfer's completion): the scheduler's next iteration comes at once instead of after its back-off. SGLang's
 * scheduler loop never sleeps, so it polls again within an iteration; the twin's loop backs off while nothing moves
 * (scheduler-core.ts) and this is what keeps its reaction as prompt. One per step at most (rank-main.ts).
 */
export interface ChangedMsg {
  t: 'changed'
}
export interface FatalMsg {
  t: 'fatal'
  tpRank: number
  message: string
}

/**
 * Rail NICs (`sim up --rail-nics`): the NIC of a rank's GPU runs in its server process (a NIC keeps acknowledging
 * while the rank is stopped). A rank posts RDMA WRITEs to it and gets their completions; a decode rank gets the
 * notifications of WRITEs that landed on its GPU.
 */
export interface RdmaWriteMsg {
  t: 'rdma_write'
  wrId: number
  dest: {addr: string; port: number}
  room: string
  bytes: number
  notify: boolean
}
export interface RdmaCqeMsg {
  t: 'rdma_cqe'
  wrId: number
  error?: string
}
export interface RdmaNotifMsg {
  t: 'rdma_notif'
  room: string
  prefillRank: number
}

export type ToRank = StepMsg | RdmaCqeMsg | RdmaNotifMsg
export type FromRank = PolledMsg | ReadyMsg | FatalMsg | RdmaWriteMsg | ChangedMsg

/** The GPU a rank holds: prefill rank k -> GPU k; decode rank k -> GPU prefillTp + k. */
export const gpuIndex = (role: 'prefill' | 'decode', tpRank: number, prefillTp: number): number =>
  role === 'prefill' ? tpRank : prefillTp + tpRank
