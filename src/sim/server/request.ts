import type {ServerResponse} from 'node:http'

export type QueueName = 'bootstrap' | 'waiting' | 'inflight' | 'prealloc' | 'transfer' | 'running'

/** One /generate request inside a server's scheduler. */
export interface Req {
  rid: string
  room: string
  /** host:port of the prefill bootstrap server the request names. */
  addr: string
  tokens: number
  maxNewTokens: number
  stream: boolean
  res: ServerResponse
  arrivedAt: number
  queue: QueueName | 'done'
  /** When it entered the bootstrap (prefill) / prealloc (decode) queue. */
  bootstrapAt: number
  inflightAt?: number
  transferAt?: number
  finishAt?: number
  runningAt?: number
  /** Tokens already streamed (SSE). */
  streamed?: number
  kvTokens: number
  state?: number
  /** Why the room failed, as the rank that failed it says (its failure_exception()), with that rank. */
  failure?: {tpRank: number; text: string}
  disconnectTimer?: NodeJS.Timeout
  headersSent?: boolean
}

/** Token count as the twin counts it: input_ids length, or ceil(text length / 4). */
export function countTokens(body: Record<string, unknown>): number {
  if (Array.isArray(body.input_ids)) return Math.max(1, body.input_ids.length)
  if (typeof body.text === 'string') return Math.max(1, Math.ceil(body.text.length / 4))
  return 1
}
