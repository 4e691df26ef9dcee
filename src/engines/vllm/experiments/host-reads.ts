import {joinUrl, requestJson} from '../../../deployment/http.js'
import {badInput, PdError} from '../../../errors.js'
import {ExitCode} from '../../../exit-codes.js'
import type {Host} from '../../../hosts/host.js'

/** Reads every vLLM experiment makes of a host and its servers, each with a deadline and the run's stop. */

export const stoppedError = (what = 'nothing to revert'): PdError =>
  new PdError(`interrupted: ${what}`, {exit: ExitCode.stopped})

/** Sleep until `untilMs` or the stop, whichever is first (the stop rejects with exit 3). */
export function sleepUntil(untilMs: number, signal: AbortSignal, what?: string): Promise<void> {
  return new Promise((ok, no) => {
    if (signal.aborted) return no(stoppedError(what))
    const t = setTimeout(done, Math.max(0, untilMs - Date.now()))
    function done(): void {
      signal.removeEventListener('abort', onAbort)
      ok()
    }
    function onAbort(): void {
      clearTimeout(t)
      no(stoppedError(what))
    }
    signal.addEventListener('abort', onAbort, {once: true})
  })
}

/** The model a server serves (GET /v1/models, as any OpenAI client would learn it). */
export async function servedModel(url: string, signal: AbortSignal): Promise<string> {
  const {json} = await requestJson({service: 'prefill', url: joinUrl(url, '/v1/models'), timeoutMs: 10_000, signal})
  const id = (json as {data?: Array<{id?: unknown}>}).data?.[0]?.id
  if (typeof id !== 'string') throw badInput(`${url}/v1/models names no model`, 'check that it is a vLLM server')
  return id
}

/** A server's log as the deployment file says it is kept, read over the Host interface (its last 8 MiB). */
export async function readLog(host: Host, file: string | undefined, signal: AbortSignal): Promise<string | undefined> {
  if (file === undefined) return undefined
  const r = await host.run(['tail', '-c', '8388608', file], {timeoutMs: 20_000, signal})
  return r.code === 0 ? r.stdout : undefined
}

/** The host's offset from UTC in minutes (`date +%z`), for the log's local timestamps. */
export async function utcOffsetMin(host: Host, signal: AbortSignal): Promise<number | undefined> {
  const r = await host.run(['date', '+%z'], {timeoutMs: 10_000, signal})
  const m = /^([+-])(\d\d)(\d\d)/.exec(r.stdout.trim())
  return m ? (m[1] === '-' ? -1 : 1) * (Number(m[2]) * 60 + Number(m[3])) : undefined
}
