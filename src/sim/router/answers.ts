import http from 'node:http'

import {stringifyRoomJson} from '../server/json-room.js'

/** What one attempt produced: an answer the router builds, or decode's response to pass through. */
export type Answer =
  | {kind: 'built'; status: number; contentType: string; body: string; error?: string}
  | {kind: 'pass'; status: number; res: http.IncomingMessage}

export interface AttemptResult {
  answer: Answer
  room: bigint | null
  prefillStatus: number | null
  decodeStatus: number | null
}

/** A request body with the bootstrap fields set; the room is written as a bare integer (it exceeds 2^53). */
export function injectBootstrap(body: Record<string, unknown>, host: string, port: number, room: bigint): string {
  const rest: Record<string, unknown> = {}
  for (const [k, v] of Object.entries(body)) {
    if (k !== 'bootstrap_host' && k !== 'bootstrap_port' && k !== 'bootstrap_room') rest[k] = v
  }
  return stringifyRoomJson({...rest, bootstrap_host: host, bootstrap_port: port, bootstrap_room: room})
}

/** routers/error.rs status_code_to_str, for the statuses the router answers with. */
const STATUS_TYPE: Record<number, string> = {
  400: 'bad_request',
  404: 'not_found',
  408: 'request_timeout',
  429: 'too_many_requests',
  500: 'internal_server_error',
  502: 'bad_gateway',
  503: 'service_unavailable',
  504: 'gateway_timeout',
}

/** routers/error.rs create_error: {"error": {"message", "type", "code"}}. */
export function gatewayError(
  status: number,
  code: string,
  message: string,
): {error: {message: string; type: string; code: string}} {
  return {error: {message, type: STATUS_TYPE[status] ?? 'unknown_status_code', code}}
}

/** An answer the router builds: create_error's JSON body, its message kept as the truth line's error. */
export const built = (status: number, code: string, message: string): Answer => ({
  kind: 'built',
  status,
  contentType: 'application/json',
  body: JSON.stringify(gatewayError(status, code, message)),
  error: message,
})

/** A JSON answer to the client. */
export const sendJson = (res: http.ServerResponse, status: number, obj: unknown): void => {
  const text = JSON.stringify(obj)
  res.writeHead(status, {'content-type': 'application/json', 'content-length': Buffer.byteLength(text)})
  res.end(text)
}

/**
 * How pd_router.rs maps a worker's error status to the router's answer (process_prefill_response and
 * handle_decode_error_response): 400, 404, 500, 502 and 503 keep their status, anything else becomes a 500.
 */
export function mapWorkerError(status: number, side: 'prefill' | 'decode'): {status: number; code: string} {
  switch (status) {
    case 400:
      return {status, code: `${side}_bad_request`}
    case 404:
      return {status, code: `${side}_not_found`}
    case 500:
      return {status, code: `${side}_internal_error`}
    case 502:
      return {status, code: `${side}_bad_gateway`}
    case 503:
      return {status, code: `${side}_unavailable`}
    default:
      return {status: 500, code: `${side}_error`}
  }
}

/** Rust's StatusCode Display: "500 Internal Server Error". */
export const statusDisplay = (status: number): string =>
  `${status} ${http.STATUS_CODES[status] ?? '<unknown status code>'}`

/** grpc/utils.rs error_type_from_status: the error_type label of smg_worker_errors_total. */
export function errorTypeFromStatus(status: number): string {
  switch (status) {
    case 400:
      return 'invalid_request'
    case 401:
      return 'auth_error'
    case 403:
      return 'permission_denied'
    case 404:
      return 'not_found'
    case 408:
      return 'timeout'
    case 429:
      return 'rate_limit_exceeded'
    case 501:
      return 'not_supported'
    case 502:
      return 'upstream_error'
    case 503:
      return 'service_unavailable'
    default:
      return 'internal_error'
  }
}

export function readAll(res: http.IncomingMessage): Promise<{text: string} | {error: string}> {
  return new Promise(resolve => {
    const chunks: Buffer[] = []
    res.on('data', (c: Buffer) => chunks.push(c))
    res.on('end', () => resolve({text: Buffer.concat(chunks).toString('utf8')}))
    res.on('error', e => resolve({error: e.message}))
    res.on('aborted', () => resolve({error: 'connection closed before message completed'}))
    res.on('close', () => {
      if (!res.complete) resolve({error: 'connection closed before message completed'})
    })
    res.resume()
  })
}

/** A finished answer is drained (its connection goes back to the pool intact); one still streaming is closed. */
export const letGo = (r: http.IncomingMessage): void => {
  if (r.complete) r.resume()
  else r.destroy()
}
