import {type Attribution, CAUSE_NAMES, type ReleaseCause} from './release-cause.js'
import type {ReleasePath} from '../model/run.js'

/**
 * Which path released an abort trial's request. The answer's words tell prefill's own abort ("Aborted by
 * AbortReq.", CommonKVSender.abort in disaggregation/common/conn.py) from decode's ABORT reaching prefill over ZMQ
 * ("Request R was aborted by decode." in nixl/conn.py since #30352; later "Aborted by decode-side abort
 * notification."); the watchdog and SGLang's timeouts name themselves; decode's own log line says why decode let go.
 */
const PATH_OF: Partial<Record<ReleaseCause, ReleasePath>> = {
  abort: 'prefill-abort',
  'decode-abort': 'decode-abort',
  watchdog: 'watchdog',
  'bootstrap-timeout': 'timeout',
  'waiting-timeout': 'timeout',
  heartbeat: 'timeout',
  timeout: 'timeout',
  'transport-error': 'other',
  revert: 'other',
  gateway: 'other',
}

export const PATH_NAMES: Record<ReleasePath, string> = {
  'prefill-abort': "prefill's own abort",
  'decode-abort': "decode's ABORT reaching prefill over ZMQ",
  watchdog: 'the watchdog',
  timeout: 'an SGLang timeout',
  other: 'something other than an abort',
  completed: 'its own completion',
  'not-released': 'nothing (still held)',
  unknown: 'unknown',
}

export function releasePathOf(
  answer: {status: number} | undefined,
  released: Attribution | undefined,
): {path: ReleasePath; evidence: string[]} {
  if (!answer) return {path: 'not-released', evidence: ['no answer before the end of the run']}
  if (answer.status >= 200 && answer.status < 300) return {path: 'completed', evidence: [`answered ${answer.status}`]}
  if (!released) return {path: 'unknown', evidence: []}
  const path = PATH_OF[released.cause] ?? 'unknown'
  // A cause that names no path (a transfer failure from another rank, no words at all) is unknown, and says why.
  const why = path === 'unknown' ? [`the evidence names ${CAUSE_NAMES[released.cause]}, not a path`] : []
  const unread = path === 'unknown' || path === 'decode-abort' ? released.logsUnread : []
  return {path, evidence: [...released.evidence, ...why, ...unread]}
}
