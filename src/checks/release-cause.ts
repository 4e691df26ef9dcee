/**
 * What released a pin, read from its answer's error text (the prefill's 500 body, passed on by the router). The
 * texts are SGLang's and the twin's own:
 * - SGLang, python/sglang/srt/disaggregation/prefill.py handle_inflight_transfer_failure: "Prefill transfer failed
 *   for request rank=N req.rid='…' req.bootstrap_room=… with exception KVTransferError(bootstrap_room=…): <reason>";
 *   the reason is the backend's: NIXL "NIXL transfer encountered ERR room=…" (nixl/conn.py transfer_worker),
 *   Mooncake "Failed to send kv chunk of … to …" (mooncake/conn.py), an abort "Aborted by AbortReq."
 *   (common/conn.py), a timeout "… timed out after Xs in KVPoll.…", or just "KV transfer failed" when the failure
 *   came from another TP rank (the answer is written by rank 0, which only saw the all-reduced Failed).
 * - sgl-model-gateway: "No available servers: …" (code server_selection_failed) when no worker could be picked.
 * - the twin: the same sentence, its transport errors carrying "transport error (UCX Endpoint timeout: Transport
 *   retry count exceeded …)"; its watchdog "Request … evicted by the disaggregation watchdog after …".
 */

export type ReleaseCause = 'watchdog' | 'transport-error' | 'transfer-failed' | 'abort' | 'timeout' | 'gateway' | 'unknown'

const TRANSPORT = [
  /NIXL transfer encountered ERR/i,
  /transport error/i,
  /Transport retry count exceeded/i,
  /Endpoint timeout/i,
  /UCS_ERR_\w+/,
  /IBV_WC_\w+_ERR/,
  /Failed to send kv chunk/i,
  /KVSender failed to (post|create) transfer/i,
  /Failed to (post|create) sliced KV transfer/i,
]

export function releaseCauseOf(detail: string | undefined): {cause: ReleaseCause; evidence: string} {
  const text = detail ?? ''
  const quote = (m: RegExpExecArray) => `"${text.slice(Math.max(0, m.index - 40), m.index + m[0].length + 80).trim()}"`
  if (!text) return {cause: 'unknown', evidence: 'the answer carried no error text'}
  // The gateway's own 503 when no worker is available (unhealthy, or its circuit breaker open): the final attempt
  // reached no worker (sgl-model-gateway pd_router.rs handle_server_selection_error).
  let m = /server_selection_failed|No available servers/.exec(text)
  if (m) return {cause: 'gateway', evidence: quote(m)}
  m = /evicted by the disaggregation watchdog|watchdog/i.exec(text)
  if (m) return {cause: 'watchdog', evidence: quote(m)}
  m = /Aborted by AbortReq/i.exec(text)
  if (m) return {cause: 'abort', evidence: quote(m)}
  m = /timed out after [\d.]+\s*s in KVPoll\.\w+/i.exec(text)
  if (m) return {cause: 'timeout', evidence: quote(m)}
  for (const re of TRANSPORT) {
    m = re.exec(text)
    if (m) return {cause: 'transport-error', evidence: quote(m)}
  }
  m = /(Prefill|Decode) transfer failed|KV transfer failed|KVTransferError/i.exec(text)
  if (m) return {cause: 'transfer-failed', evidence: quote(m)}
  return {cause: 'unknown', evidence: `"${text.slice(0, 160)}"`}
}
