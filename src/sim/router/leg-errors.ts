import {type Answer, built, mapWorkerError, readAll, statusDisplay} from './answers.js'
import type {Leg, RouterRequest} from './request-state.js'

/**
 * handle_decode_error_response: decode's transport error or error status as the router answers it (undefined when
 * the client went away while decode's body was read).
 */
export async function decodeError(req: RouterRequest, leg: Leg): Promise<Answer | undefined> {
  if ('error' in leg) return built(502, 'decode_server_error', `Decode server error: ${leg.error}`)
  const dres = leg.res
  const ds = dres.statusCode ?? 0
  const read = await readAll(dres)
  if (req.clientGone) return undefined
  if (req.stream) {
    let message: unknown
    if ('error' in read) message = `Decode server error: ${read.error}`
    else {
      try {
        message = JSON.parse(read.text)
      } catch {
        message = read.text
      }
    }
    const sse = `data: {'error': ${JSON.stringify({message, status: ds})}}`
    return {
      kind: 'built',
      status: ds,
      contentType: 'text/event-stream',
      body: sse,
      error: `decode status ${ds}`,
    }
  }
  const mapped = mapWorkerError(ds, 'decode')
  if ('error' in read) return built(mapped.status, 'decode_read_failed', `Decode server error: ${read.error}`)
  let message = read.text
  try {
    const j = JSON.parse(read.text) as {error?: {message?: unknown}; message?: unknown}
    if (typeof j?.error?.message === 'string') message = j.error.message
    else if (typeof j?.message === 'string') message = j.message
  } catch {}
  return built(mapped.status, mapped.code, message)
}

/** process_prefill_response on a failed prefill: its transport error or error status as the router answers it. */
export async function prefillError(req: RouterRequest, leg: Leg): Promise<Answer | undefined> {
  if ('error' in leg) {
    return built(502, 'prefill_server_error', `Prefill server error: ${leg.error}. This will cause decode timeout.`)
  }
  const ps = leg.res.statusCode ?? 0
  const read = await readAll(leg.res)
  if (req.clientGone) return undefined
  const mapped = mapWorkerError(ps, 'prefill')
  const text = 'error' in read ? 'Unknown prefill error' : read.text
  return built(mapped.status, mapped.code, `Prefill server error (${statusDisplay(ps)}): ${text}`)
}
