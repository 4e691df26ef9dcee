import {PdError, oneLine} from '../errors.js'
import {ExitCode} from '../exit-codes.js'
import {SAFE_SH, throwIfUnsafe} from '../faults/lease/host-safety.js'
import {checkStateDir} from '../faults/lease/lease.js'
import type {Host} from '../hosts/host.js'
import {HALT_FILE, HALT_MAX_BYTES, type HaltRecord, haltText, parseHalt} from '../model/halt.js'

/**
 * The halt file on a host, written and read as the leases are (faults/lease/host-safety.ts): the state dir and the file
 * checked first (ours or root's, writable by nobody else, no symlink: status 13, exit 2 naming it), the state dir made
 * private when missing, the file written under a temporary name and renamed, read only as a regular file and only up
 * to HALT_MAX_BYTES. A halt file is data, never run. Every script gets its arguments as positional parameters.
 */

export interface HaltHost {
  /** The host's name in the deployment file ("host" for a file with one host). */
  name: string
  host: Host
  /** The deployment's state dir on that host. */
  stateDir: string
}

const OP_TIMEOUT_MS = 10_000
const READ = `head -c ${HALT_MAX_BYTES + 1} "$H"`

// $1 dir, $2 the record's text. Prints WRITTEN, or ALREADY and the halt that is there (kept: the first halt's who and
// why stay until resume).
const WRITE_SH =
  SAFE_SH +
  `pd_make "$1" || exit $?
H="$1/${HALT_FILE}"
pd_check_if f "$H" || exit 13
if [ -e "$H" ]; then echo ALREADY; ${READ}; exit 0; fi
rm -f -- "$H.tmp.$$"
printf '%s\\n' "$2" > "$H.tmp.$$" && mv -f -- "$H.tmp.$$" "$H" || { rm -f -- "$H.tmp.$$"; exit 1; }
echo WRITTEN`

// $1 dir. Prints NONE, or HALTED and the record.
const READ_SH =
  SAFE_SH +
  `pd_safe_tree "$1" || exit 13
H="$1/${HALT_FILE}"
pd_check_if f "$H" || exit 13
[ -e "$H" ] || { echo NONE; exit 0; }
echo HALTED; ${READ}`

// $1 dir. Prints NONE, or WAS and the record it removed.
const REMOVE_SH =
  SAFE_SH +
  `pd_safe_tree "$1" || exit 13
H="$1/${HALT_FILE}"
pd_check_if f "$H" || exit 13
[ -e "$H" ] || { echo NONE; exit 0; }
t=$(${READ}) || t=
rm -f -- "$H" || exit 1
echo WAS; printf '%s' "$t"`

/** $1 dir: PRESENT when a halt file (or anything by its name) is there. Shell builtins only: the cheap poll. */
export const POLL_SH = `if [ -e "$1/${HALT_FILE}" ] || [ -L "$1/${HALT_FILE}" ]; then echo PRESENT; fi`

async function runScript(
  h: HaltHost,
  script: string,
  args: string[],
  what: string,
  o: {timeoutMs?: number; signal?: AbortSignal},
): Promise<{head: string; body: string}> {
  checkStateDir(h.stateDir)
  const res = await h.host.run(['sh', '-c', script, 'sh', h.stateDir, ...args], {
    timeoutMs: o.timeoutMs ?? OP_TIMEOUT_MS,
    sudo: true,
    ...(o.signal ? {signal: o.signal} : {}),
  })
  throwIfUnsafe(res, h.host.describe())
  const nl = res.stdout.indexOf('\n')
  const head = (nl < 0 ? res.stdout : res.stdout.slice(0, nl)).trim()
  if (res.code !== 0 || head === '')
    throw new PdError(
      `cannot ${what} ${h.stateDir}/${HALT_FILE} on ${h.host.describe()}: ` +
        `${oneLine(res.stderr) || `exit ${res.code}`}`,
      {exit: ExitCode.unreachable, suggestion: 'check the deployment stateDir and the sudo policy'},
    )
  return {head, body: nl < 0 ? '' : res.stdout.slice(nl + 1)}
}

const recordOf = (body: string, h: HaltHost): HaltRecord =>
  parseHalt(Buffer.byteLength(body) > HALT_MAX_BYTES ? '' : body, h.name)

/** Halt the deployment on this host; a halt already there is kept (and returned). */
export async function writeHalt(
  h: HaltHost,
  halt: HaltRecord,
  o: {timeoutMs?: number; signal?: AbortSignal} = {},
): Promise<{written: boolean; halt: HaltRecord}> {
  const r = await runScript(h, WRITE_SH, [haltText(halt)], 'write', o)
  return r.head === 'WRITTEN'
    ? {written: true, halt: {...halt, host: h.name}}
    : {written: false, halt: recordOf(r.body, h)}
}

/** The halt on this host, if any. */
export async function readHalt(
  h: HaltHost,
  o: {timeoutMs?: number; signal?: AbortSignal} = {},
): Promise<HaltRecord | undefined> {
  const r = await runScript(h, READ_SH, [], 'read', o)
  return r.head === 'HALTED' ? recordOf(r.body, h) : undefined
}

/** Lift the halt on this host; the halt removed, if there was one. */
export async function removeHalt(
  h: HaltHost,
  o: {timeoutMs?: number; signal?: AbortSignal} = {},
): Promise<HaltRecord | undefined> {
  const r = await runScript(h, REMOVE_SH, [], 'remove', o)
  return r.head === 'WAS' ? recordOf(r.body, h) : undefined
}

/** Whether a halt file is there (one `sh` of builtins: the per-second poll); its record is read with readHalt. */
export async function haltPresent(h: HaltHost, o: {timeoutMs?: number} = {}): Promise<boolean> {
  checkStateDir(h.stateDir)
  const res = await h.host.run(['sh', '-c', POLL_SH, 'sh', h.stateDir], {
    timeoutMs: o.timeoutMs ?? OP_TIMEOUT_MS,
    sudo: true,
  })
  return res.code === 0 && res.stdout.includes('PRESENT')
}
