import type http from 'node:http'

import type {AttemptResult} from './answers.js'

/** One /generate request while the router works on it (generate.ts's retry loop and each attempt). */
export interface RouterRequest {
  res: http.ServerResponse
  request: Record<string, unknown>
  rid: string | null
  requestText: string
  stream: boolean
  sentAt: number
  maxAttempts: number
  /** The answer's truth line is written. */
  done: boolean
  clientGone: boolean
  /** Ends the attempt in flight when the client goes away. */
  cancelAttempt: (() => void) | undefined
  /** The retry backoff being waited out, if any. */
  backoff: {timer: NodeJS.Timeout; wake: () => void} | undefined
  last: AttemptResult | undefined
  attempts: number
}

/** A worker's answer to one leg: its response (paused), or its transport error. */
export type Leg = {res: http.IncomingMessage} | {error: string}
