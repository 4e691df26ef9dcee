import type {ReleaseText} from '../engine.js'

/**
 * The words SGLang (and its gateway, and the twin speaking as SGLang) use when a request's KV is let go, as data the
 * checks match against (checks/release-cause.ts `releaseCauseOf`, checks/decode-release.ts `releasePath`). Moved here
 * from those checks unchanged, in the order they are tried: the first text that matches names the cause.
 * - SGLang, python/sglang/srt/disaggregation/prefill.py handle_inflight_transfer_failure: "Prefill transfer failed
 *   for request rank=N req.rid='…' req.bootstrap_room=… with exception KVTransferError(bootstrap_room=…): <reason>";
 *   the reason is the backend's: NIXL "NIXL transfer encountered ERR room=…" (nixl/conn.py transfer_worker),
 *   Mooncake "Failed to send kv chunk of … to …" (mooncake/conn.py), an abort "Aborted by AbortReq."
 *   (common/conn.py), a timeout "… timed out after Xs in KVPoll.…", or just "KV transfer failed" when the failure
 *   came from another TP rank (the answer is written by rank 0, which only saw the all-reduced Failed).
 * - sgl-model-gateway: "No available servers: …" (code server_selection_failed) when no worker could be picked
 *   (pd_router.rs handle_server_selection_error).
 * - the twin: the same sentence, its transport errors carrying "transport error (UCX Endpoint timeout: Transport
 *   retry count exceeded …)"; its watchdog "Request … evicted by the disaggregation watchdog after …".
 * - decode letting go: the prefill rank fails the room with "Request R was aborted by decode." (nixl/conn.py, after
 *   #30352) or, in later versions, "Aborted by decode-side abort notification." / "Aborted by peer notification.";
 *   decode's own line: "… timed out after Xs in KVPoll.WaitingForInput" (decode.py pop_transferred), or "Lost
 *   connection with prefill instance (bootstrap_addr: …)" after heartbeat failures (common/conn.py
 *   _handle_node_failure).
 */

/** Every cause a release can have: SGLang's, the gateway's, and pdchaos's own (the revert; nothing named). */
export type ReleaseCause =
  | 'watchdog'
  | 'bootstrap-timeout'
  | 'waiting-timeout'
  | 'heartbeat'
  | 'transport-error'
  | 'transfer-failed'
  | 'abort'
  | 'decode-abort'
  | 'revert'
  | 'timeout'
  | 'gateway'
  | 'unknown'

/** How a report names each cause. */
export const CAUSE_NAMES: Record<ReleaseCause, string> = {
  watchdog: 'the watchdog',
  'bootstrap-timeout': "SGLang's bootstrap timeout (prefill, SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT)",
  'waiting-timeout': "decode's waiting timeout (SGLANG_DISAGGREGATION_WAITING_TIMEOUT)",
  heartbeat: "decode's heartbeat failure (it lost the prefill instance)",
  'transport-error': 'a transport error',
  'transfer-failed': 'a KV transfer failure (its reason not stated: it came from another TP rank)',
  abort: 'an abort (/abort_request)',
  'decode-abort': "decode letting go of its half (its ABORT reached prefill; decode's own reason not shown)",
  revert: 'the revert of the fault',
  timeout: 'an SGLang timeout',
  gateway: 'the gateway (no worker available)',
  unknown: 'an unknown cause',
}

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

/** An answer's or a log line's text → its cause, tried in this order (the first match wins). */
export const SGLANG_RELEASE_TEXTS: readonly ReleaseText<ReleaseCause>[] = [
  {cause: 'gateway', re: /server_selection_failed|No available servers/},
  {cause: 'watchdog', re: /evicted by the disaggregation watchdog|watchdog/i},
  {cause: 'abort', re: /Aborted by AbortReq/i},
  {
    cause: 'decode-abort',
    re: /was aborted by decode|Aborted by decode-side abort notification|Aborted by peer notification/i,
  },
  {
    cause: 'timeout',
    re: /timed out after [\d.]+\s*s in KVPoll\.(\w+)/i,
    byState: {Bootstrapping: 'bootstrap-timeout', WaitingForInput: 'waiting-timeout'},
  },
  {cause: 'heartbeat', re: /Lost connection with prefill instance/i},
  ...TRANSPORT.map(re => ({cause: 'transport-error' as const, re})),
  {cause: 'transfer-failed', re: /(Prefill|Decode) transfer failed|KV transfer failed|KVTransferError/i},
]

/** Which of decode's paths let go of its half, as decode's answer names it (checks/decode-release.ts). */
export type DecodeReleasePath =
  | 'heartbeat'
  | 'waiting-timeout'
  | 'decode-watchdog'
  | 'prefill-reported'
  | 'abort'
  | 'unknown'

export const SGLANG_DECODE_RELEASE_PATHS: ReadonlyArray<{path: DecodeReleasePath; re: RegExp; words: string}> = [
  {path: 'heartbeat', re: /Lost connection with prefill instance|failed due to prefill down/, words: 'heartbeat'},
  {path: 'waiting-timeout', re: /timed out after [\d.]+s in KVPoll\.WaitingForInput/, words: 'waiting timeout'},
  {path: 'abort', re: /Aborted by AbortReq|Abort/, words: 'abort'},
  {path: 'prefill-reported', re: /Failed to get kvcache from prefill instance/, words: "prefill's own Failed status"},
  {path: 'decode-watchdog', re: /watchdog/i, words: "decode's watchdog"},
]
