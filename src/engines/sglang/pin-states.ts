import type {PinState} from '../../model/timeline.js'
import type {PinStateName} from '../engine.js'

/**
 * The KVPoll states SGLang holds a pinned request's KV in, where, and what lets go of it there (KVPoll:
 * python/sglang/srt/disaggregation/base/conn.py; the queues: disaggregation/prefill.py and decode.py; the timeouts:
 * common/conn.py, cited row by row in docs/faults.md's table of SGLang's PD timeouts). The run model names a pin's
 * state with the same words (model/timeline.ts `PinState`, a journal field, so it stays in model/).
 */
export const SGLANG_PIN_STATES: ReadonlyArray<PinStateName & {kvPoll: PinState['kvPoll']}> = [
  {
    name: 'Bootstrapping',
    kvPoll: 'Bootstrapping',
    where: "prefill's bootstrap queue (decode's destination info has not arrived; drop-dest-info)",
    releasedBy:
      "prefill's bootstrap timeout (SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT), the watchdog if its scope is all",
  },
  {
    name: 'WaitingForInput',
    kvPoll: 'WaitingForInput',
    where: "decode's transfer queue (decode's half, waiting for prefill's KV; kill-prefill)",
    releasedBy: "decode's heartbeat failure or its waiting timeout (SGLANG_DISAGGREGATION_WAITING_TIMEOUT)",
  },
  {
    name: 'Transferring',
    kvPoll: 'Transferring',
    where: "prefill's inflight queue (its KV is being sent; stall-kv, abort-mid-transfer)",
    releasedBy: 'the watchdog, a transport error, an abort',
  },
]
