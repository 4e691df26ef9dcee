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
 *     others cannot rename or remove what is ours there), or carries an ACL (the state dir and its files only),
 *   - (a file) is not a regular file (a FIFO would block the script reading it, a device act or never end), or is
 *     larger than MAX_LEASE_FILE_BYTES.
 * Checks happen on the host, in the same shell that then acts, and the state dir and everything it holds belong to
 * us and are writable by nobody else once checked, so nothing can be swapped between the check and its use.
 *
 * A refusal is one stderr line `PDCHAOS-UNSAFE <path> TAB <owner> TAB <uid> TAB <why>` and status 13.
 */
export const UNSAFE_EXIT = 13

/**
 * The most a lease file, a claim or the run lock may hold (each is a few hundred bytes; a revert script a few kB).
 * A larger one is refused like an unsafe one, before any script reads it; a lease's log (appended, never read) is
 * not held to it.
 */
export const MAX_LEASE_FILE_BYTES = 1024 * 1024

// Few processes: one ls per group of paths (a fork costs tens of ms on a loaded host), the rest shell builtins.
export const SAFE_SH =
  "pd_tab='\t'\n" +
  `pd_max=${MAX_LEASE_FILE_BYTES}\n` +
  String.raw`pd_refuse() {
  pd_on=? pd_ou=?
  read -r _ _ pd_on _ <<PDEOF
$(LC_ALL=C ls -ld -- "$1" 2>/dev/null)
PDEOF
  read -r _ _ pd_ou _ <<PDEOF
$(LC_ALL=C ls -ldn -- "$1" 2>/dev/null)
PDEOF
  printf 'PDCHAOS-UNSAFE %s\t%s\t%s\t%s\n' "$1" "$pd_on" "$pd_ou" "$2" >&2
  return 13
}
pd_who() { pd_me=$(id -u); if [ "$pd_me" = 0 ]; then echo root; else echo "uid $pd_me or root"; fi; }
# $1 first (stop at the first refusal) or all (report every one), $2 kind: d (a dir of ours), f (a file of ours),
# a (a dir above the state dir), t (d for $pd_sd and what is under it, a for the rest); then paths that exist.
# One ls for all of them.
pd_scan() {
  pd_mode=$1 pd_k=$2; shift 2
  [ $# -gt 0 ] || return 0
  pd_ls=$(LC_ALL=C ls -ldn -- "$@" 2>/dev/null)
  pd_seen=0 pd_bad=0
  while read -r pd_m _ pd_u _ pd_sz _ _ _ pd_n; do
    [ -n "$pd_m" ] || continue
    pd_seen=$((pd_seen + 1)) pd_why=
    # A device lists "major, minor" where a size stands: one word more before the name.
    case $pd_m in [cb]*) pd_n=${'${pd_n#* }'} pd_sz=;; esac
    pd_n=${'${pd_n%% -> *}'}
    pd_kind=$pd_k
    if [ "$pd_k" = t ]; then case $pd_n in "$pd_sd"|"$pd_sd"/*) pd_kind=d;; *) pd_kind=a;; esac; fi
    case $pd_kind:$pd_m in
      ?:l*) pd_why="is a symbolic link";;
      d:d*|a:d*) ;;
      # Read by these scripts (sed, cat, sh): never a node that blocks (a FIFO), acts (a device) or has no end.
      f:-*) case $pd_n in *.log) ;; *) [ "$pd_sz" -le "$pd_max" ] 2>/dev/null ||
        pd_why="is larger than 1 MiB ($pd_sz bytes), more than a lease or lock file ever holds";; esac;;
      f:p*) pd_why="is a FIFO (named pipe), not a regular file";;
      f:c*) pd_why="is a character device, not a regular file";;
      f:b*) pd_why="is a block device, not a regular file";;
      f:s*) pd_why="is a socket, not a regular file";;
      f:d*) pd_why="is a directory, not a regular file";;
      f:*) pd_why="is not a regular file";;
      *) pd_why="is not a directory";;
    esac
    if [ -z "$pd_why" ] && [ "$pd_u" != 0 ] && [ ! -O "$pd_n" ]; then
      pd_why="is owned by another user, not by $(pd_who)"
    fi
    if [ -z "$pd_why" ]; then
      case $pd_kind:$pd_m in
        a:?????????[tT]*) ;;
        *:?????w*|*:????????w*) pd_why="can be written by group or others (mode $pd_m)";;
        a:*) ;;
        *:??????????+*) pd_why="has an access control list (mode $pd_m)";;
      esac
    fi
    if [ -n "$pd_why" ]; then
      pd_refuse "$pd_n" "$pd_why"
      pd_bad=13
      [ "$pd_mode" = all ] || return 13
    fi
  done <<PDEOF
$pd_ls
PDEOF
  # A path another party removed meanwhile (a revert finishing) is not unsafe; one still there but not listed is.
  if [ "$pd_seen" -lt $# ]; then
    pd_want=0
    for pd_x do if [ -e "$pd_x" ] || [ -L "$pd_x" ]; then pd_want=$((pd_want + 1)); fi; done
    [ "$pd_seen" -ge "$pd_want" ] || { pd_refuse "$1" "cannot be listed"; return 13; }
  fi
  return $pd_bad
}
# $1 kind, then paths: check those that exist (a dangling symlink exists for this purpose).
pd_check_if() {
  pd_kk=$1; shift
  pd_list=
  for pd_x do if [ -e "$pd_x" ] || [ -L "$pd_x" ]; then pd_list="$pd_list$pd_x$pd_tab"; fi; done
  [ -n "$pd_list" ] || return 0
  pd_old=$IFS pd_opts=$-; IFS=$pd_tab; set -f
  set -- $pd_list
  IFS=$pd_old; case $pd_opts in *f*) ;; *) set +f;; esac
  pd_scan first "$pd_kk" "$@"
}
# $1 state dir: it, every dir above it (as resolved, symlinks followed) and its own subdirs. Nothing yet: fine.
pd_safe_tree() {
  case $1 in /*) ;; *) pd_refuse "$1" "is not an absolute path"; return;; esac
  if [ ! -e "$1" ] && [ ! -L "$1" ]; then return 0; fi
  [ ! -L "$1" ] || { pd_refuse "$1" "is a symbolic link"; return; }
  pd_here=$PWD
  cd -P -- "$1" 2>/dev/null || { pd_refuse "$1" "cannot be entered"; return; }
  pd_p=$PWD
  cd -- "$pd_here" 2>/dev/null || cd /
  [ "$pd_p" != / ] || { pd_refuse "$1" "is the root directory"; return; }
  pd_sd=$1 pd_up=
  while pd_p=${'${pd_p%/*}'}; [ -n "$pd_p" ]; do pd_up="$pd_up$pd_p$pd_tab"; done
  for pd_x in "$1/leases" "$1/leases/done" "$1/bin"; do
    if [ -e "$pd_x" ] || [ -L "$pd_x" ]; then pd_up="$pd_up$pd_x$pd_tab"; fi
  done
  pd_old=$IFS pd_opts=$-; IFS=$pd_tab; set -f
  set -- "$1" $pd_up /
  IFS=$pd_old; case $pd_opts in *f*) ;; *) set +f;; esac
  pd_scan first t "$@"
}
# $1 state dir: create it and its lease dirs private (0700) when missing, then check the tree.
pd_make() {
  umask 077
  if [ -e "$1" ] || [ -L "$1" ]; then
    pd_safe_tree "$1" || return
    [ -d "$1/leases/done" ] || mkdir -p -- "$1/leases/done" || return 1
    pd_check_if d "$1/leases" "$1/leases/done"
  else
    mkdir -p -- "$1/leases/done" || return 1
    pd_safe_tree "$1"
  fi
}
# $1 leases dir, $2 id: every file of that lease that exists.
pd_safe_lease() {
  pd_check_if f "$1/$2.json" "$1/$2.revert.sh" "$1/$2.reverting.sh" "$1/$2.claim" "$1/$2.log" \
    "$1/done/$2.json" "$1/done/$2.revert.sh"
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
    exit: ExitCode.badInput,
    code: 'E_UNSAFE_STATE_DIR',
    suggestion:
      'the state dir, the dirs above it and its files must belong to the user pdchaos runs as on the host (or ' +
      'root) and be writable by nobody else: remove what another user put there, fix the owner and mode, or choose ' +
      'another stateDir',
  })
}

/** Throw the refusal when a host-side script reported one (status 13). */
export function throwIfUnsafe(res: {code: number | null; stderr: string}, where: string): void {
  if (res.code !== UNSAFE_EXIT) return
  const f = findUnsafe(res.stderr)
  if (f) throw unsafeError(f, where)
}
