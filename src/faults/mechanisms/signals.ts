import type {MechanismPlan} from '../fault.js'
import {notStoppedProbe, stoppedProbe, type ProcIdentity} from './proc-identity.js'

/**
 * SIGSTOP / SIGCONT by identity. The check of the start time runs ON THE HOST in the same shell that sends the
 * signal, so nothing between planning and signalling (a restart, a recycled pid) can redirect it: a constant
 * script with pid, expected start and signal as positional parameters.
 *
 * Exit codes: 0 signalled (or, for CONT, nothing to do: the process is gone or its pid now belongs to another
 * process — the stopped process no longer exists, which keeps the revert idempotent); 3 refused (STOP of a
 * process that is gone or recycled); 2 bad arguments; other = kill failed.
 */
export const SIGNAL_SCRIPT = [
  'set -f',
  'pid="$1"; want="$2"; sig="$3"',
  'case "$pid:$want:$sig" in *[!0-9:A-Z]*|:*|*::*|*:) echo "pdchaos-signal: bad arguments" >&2; exit 2;; esac',
  'case "$sig" in STOP|CONT) ;; *) echo "pdchaos-signal: only STOP and CONT" >&2; exit 2;; esac',
  'if ! stat=$(cat "/proc/$pid/stat" 2>/dev/null); then',
  '  echo "pdchaos-signal: pid $pid is gone, not signalled"',
  '  [ "$sig" = CONT ] && exit 0 || exit 3',
  'fi',
  'rest=${stat##*")"}',
  'set -- $rest',
  // After the last ")" field 3 (state) is $1, so field 22 (start time) is $20.
  'start=${20}',
  'if [ "$start" != "$want" ]; then',
  '  echo "pdchaos-signal: pid $pid now has start time $start, not $want: a different process, not signalled"',
  '  [ "$sig" = CONT ] && exit 0 || exit 3',
  'fi',
  'kill -s "$sig" "$pid" || exit 1',
  'echo "pdchaos-signal: SIG$sig sent to pid $pid (start $want)"',
].join('\n')

export function signalArgv(id: ProcIdentity, signal: 'STOP' | 'CONT'): string[] {
  return ['sh', '-c', SIGNAL_SCRIPT, 'pdchaos-signal', String(id.pid), String(id.startTicks), signal]
}

export type SigstopPlan = MechanismPlan

/** Stop one process by identity; the revert continues it (idempotent, refuses a recycled pid). */
export function buildSigstop(id: ProcIdentity, label: string): SigstopPlan {
  return {
    inject: [signalArgv(id, 'STOP')],
    revert: [signalArgv(id, 'CONT')],
    verifyInjected: stoppedProbe(id, label),
    verifyClean: notStoppedProbe(id, label),
    readOnlyProbes: [
      ['cat', `/proc/${id.pid}/stat`],
      ['sh', '-c', 'command -v kill'],
    ],
    summary: `SIGSTOP ${label} (pid ${id.pid}, start ${id.startTicks}), SIGCONT on revert; both refuse a recycled pid`,
  }
}
