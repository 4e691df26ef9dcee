/**
 * IPC between a server process and its TP-rank processes. Each scheduler-loop iteration sends ONE `step`
 * to every rank (the ops of that iteration, then the rooms to poll) and awaits every rank's `polled`
 * answer: that round trip is the twin's gloo all-reduce.
 */
/** The twin's own failure points, for users who cannot change the host's packet filter (no root). */
export type TwinFailpoint = 'drop-dest-info' | 'stall-kv'

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

export interface StepMsg {t: 'step'; seq: number; ops: RankOp[]; rooms: string[]}
export interface PolledMsg {t: 'polled'; seq: number; states: number[]; failedRooms?: number}
export interface ReadyMsg {t: 'ready'; tpRank: number; pid: number; zmqPort: number; dataPort?: number}
export interface FatalMsg {t: 'fatal'; tpRank: number; message: string}

export type ToRank = StepMsg
export type FromRank = PolledMsg | ReadyMsg | FatalMsg

/** The GPU a rank holds: prefill rank k -> GPU k; decode rank k -> GPU prefillTp + k. */
export const gpuIndex = (role: 'prefill' | 'decode', tpRank: number, prefillTp: number): number =>
  role === 'prefill' ? tpRank : prefillTp + tpRank
