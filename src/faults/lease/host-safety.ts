import {PdError} from '../../errors.js'
import {ExitCode} from '../../exit-codes.js'

/**
 * Who may have put what in the state dir (issue 12, S1). Leases run their revert scripts as whoever pdchaos runs as
 * on the host, often root: a script, lease or lock that another user could write, or plant through a symlink, would
 * be root code from a stranger. So every host-side script starts with these functions and refuses, before it reads
 * or runs anything, a state dir (or a dir above it, or a file in it) that
 *   - is a symbolic link,
 *   - is not owned by the user the script runs as, or by root,
 *   - can be written by group or others (a world-writable sticky dir such as /tmp is allowed above the state dir:
 *     others cannot rename or remove what is ours there), or carries an ACL (the state dir and its files only).
 * Checks happen on the host, in the same shell that then acts, and the state dir and everything it holds belong to
 * us and are writable by nobody else once checked, so nothing can be swapped between the check and its use.
 *
 * A refusal is one stderr line `PDCHAOS-UNSAFE <path> TAB <owner> TAB <uid> TAB <why>` and status 13.
 */
export const UNSAFE_EXIT = 13

export const SAFE_SH = String.raw`pd_me=$(id -u)
pd_who=root; [ "$pd_me" = 0 ] || pd_who="uid $pd_me or root"
pd_refuse() {
  pd_on=? pd_ou=?
  read -r _ _ pd_on _ <<PDEOF
$(ls -ld -- "$1" 2>/dev/null)
PDEOF
  read -r _ _ pd_ou _ <<PDEOF
$(ls -ldn -- "$1" 2>/dev/null)
PDEOF
  printf 'PDCHAOS-UNSAFE %s\t%s\t%s\t%s\n' "$1" "$pd_on" "$pd_ou" "$2" >&2
  return 13
}
# $1 path, $2 kind: d (a dir of ours), f (a file of ours), a (a dir above the state dir).
pd_check() {
  if [ -L "$1" ]; then pd_refuse "$1" "is a symbolic link"; return; fi
  pd_m= pd_u=
  read -r pd_m _ pd_u _ <<PDEOF
$(ls -ldn -- "$1" 2>/dev/null)
PDEOF
  case $2:$pd_m in
    ?:) pd_refuse "$1" "cannot be read"; return;;
    d:d*|a:d*|f:-*) ;;
    f:*) pd_refuse "$1" "is not a regular file"; return;;
    *) pd_refuse "$1" "is not a directory"; return;;
  esac
  if [ "$pd_u" != "$pd_me" ] && [ "$pd_u" != 0 ]; then pd_refuse "$1" "is owned by another user, not by $pd_who"; return; fi
  case $2:$pd_m in
    a:?????????[tT]*) ;;
    *:?????w*|*:????????w*) pd_refuse "$1" "can be written by group or others (mode $pd_m)"; return;;
  esac
  case $2:$pd_m in
    a:*) ;;
    *:??????????+*) pd_refuse "$1" "has an access control list (mode $pd_m)"; return;;
  esac
  return 0
}
# $1 path: check it when it exists (a dangling symlink exists for this purpose).
pd_check_if() { if [ -e "$1" ] || [ -L "$1" ]; then pd_check "$1" "$2"; fi; }
# $1 state dir: it, every dir above it (as resolved, symlinks followed) and its own subdirs. Nothing yet: fine.
pd_safe_tree() {
  case $1 in /*) ;; *) pd_refuse "$1" "is not an absolute path"; return;; esac
  if [ ! -e "$1" ] && [ ! -L "$1" ]; then return 0; fi
  pd_check "$1" d || return
  pd_p=$(cd -P -- "$1" 2>/dev/null && pwd -P) || { pd_refuse "$1" "cannot be entered"; return; }
  [ "$pd_p" != / ] || { pd_refuse "$1" "is the root directory"; return; }
  while pd_p=${'${pd_p%/*}'}; [ -n "$pd_p" ]; do pd_check "$pd_p" a || return; done
  pd_check / a || return
  for pd_d in "$1/leases" "$1/leases/done" "$1/bin"; do pd_check_if "$pd_d" d || return; done
}
# $1 state dir: create it and its lease dirs private (0700) when missing, then check the tree.
pd_make() {
  umask 077
  if [ ! -e "$1" ] && [ ! -L "$1" ]; then mkdir -p -- "$1" || return 1; fi
  pd_safe_tree "$1" || return
  for pd_d in "$1/leases" "$1/leases/done"; do
    if [ ! -e "$pd_d" ] && [ ! -L "$pd_d" ]; then mkdir -- "$pd_d" || return 1; fi
  done
  pd_safe_tree "$1"
}
# $1 leases dir, $2 id: every file of that lease that exists.
pd_safe_lease() {
  for pd_f in "$1/$2.json" "$1/$2.revert.sh" "$1/$2.reverting.sh" "$1/$2.claim" "$1/$2.log" "$1/done/$2.json" "$1/done/$2.revert.sh"; do
    pd_check_if "$pd_f" f || return
  done
}
`

export interface UnsafeFinding {
  path: string
  owner: string
  uid: string
  why: string
}

const UNSAFE_LINE = /^PDCHAOS-UNSAFE ([^\t\n]*)\t([^\t\n]*)\t([^\t\n]*)\t([^\t\n]*)$/m

/** The refusal a host-side script reported on stderr, if any. */
export function findUnsafe(stderr: string): UnsafeFinding | undefined {
  const m = UNSAFE_LINE.exec(stderr)
  return m ? {path: m[1]!, owner: m[2]!, uid: m[3]!, why: m[4]!} : undefined
}

/** "/s/leases/x.revert.sh (owner nobody, uid 65534) is owned by another user, not by uid 0 or root" */
export function describeUnsafe(f: UnsafeFinding): string {
  return `${f.path} (owner ${f.owner}, uid ${f.uid}) ${f.why}`
}

/** Bad input (exit 2): the deployment's state dir holds what pdchaos will not trust, named with its owner. */
export function unsafeError(f: UnsafeFinding, where: string): PdError {
  return new PdError(`refusing the state dir on ${where}: ${describeUnsafe(f)}`, {
    exit: ExitCode.badInput, code: 'E_UNSAFE_STATE_DIR',
    suggestion: 'the state dir, the dirs above it and its files must belong to the user pdchaos runs as on the host (or root) and be writable by nobody else: remove what another user put there, fix the owner and mode, or choose another stateDir',
  })
}

/** Throw the refusal when a host-side script reported one (status 13). */
export function throwIfUnsafe(res: {code: number | null; stderr: string}, where: string): void {
  if (res.code !== UNSAFE_EXIT) return
  const f = findUnsafe(res.stderr)
  if (f) throw unsafeError(f, where)
}
