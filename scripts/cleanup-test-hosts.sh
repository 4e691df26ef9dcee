#!/usr/bin/env bash
# Remove what pdchaos tests may have left behind, and nothing else:
#   - processes started from test temp dirs ($TMPDIR/pdchaos-test-*): twins (their state dirs, service files, PATH),
#     sshd started with a pdchaos-test config, anything whose command line or environment points into such a dir;
#   - network namespaces named pdc-* (every process inside is killed first), veth links pdc-h* / pdc-n*;
#   - the test temp dirs themselves ($TMPDIR/pdchaos-test-*, and $TMPDIR/pdchaos-sshd-* of test/harness/sshd.ts) and the
#     namespace markers.
# Safe to run at any time between test runs; idempotent. Needs root for the namespace part.
#
# usage: cleanup-test-hosts.sh [--only TOKEN] [--keep-dirs] [--dry-run] [--verbose]
#   --only TOKEN   restrict to namespaces pdc-TOKEN*, temp dirs pdchaos-test-TOKEN* (for tests that must not
#                  disturb other test runs going on at the same time)
set -uo pipefail

only=''
keep_dirs=0
dry=0
verbose=0
while [ $# -gt 0 ]; do
  case "$1" in
    --only) only="${2:-}"; shift 2 || { echo "cleanup-test-hosts: --only needs a value" >&2; exit 2; } ;;
    --keep-dirs) keep_dirs=1; shift ;;
    --dry-run) dry=1; shift ;;
    --verbose|-v) verbose=1; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) echo "cleanup-test-hosts: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$only" in *[!A-Za-z0-9_-]*) echo "cleanup-test-hosts: --only takes letters, digits, - and _ only" >&2; exit 2 ;; esac

tmp="${TMPDIR:-/tmp}"
tmp="${tmp%/}"
dir_prefix="$tmp/pdchaos-test-$only"
# sshd started by test/harness/sshd.ts without a dir of its own lives in pdchaos-sshd-*: included unless --only.
sshd_prefix="$tmp/pdchaos-sshd-"
ns_prefix="pdc-$only"
marker_dir="$tmp/pdchaos-test-registry/netns"
removed=0

say() { [ "$verbose" = 1 ] && echo "cleanup-test-hosts: $*" >&2; return 0; }
act() { say "$*"; removed=$((removed + 1)); [ "$dry" = 1 ] || "$@" >/dev/null 2>&1 || true; }

# Our own ancestry: never signalled, whatever their environment says.
declare -A protected=()
p=$$
while [ -n "$p" ] && [ "$p" -gt 1 ] 2>/dev/null; do
  protected[$p]=1
  p=$(awk '/^PPid:/ {print $2}' "/proc/$p/status" 2>/dev/null)
done

kill_pids() { # kill -9 each pid not protected
  for pid in "$@"; do
    [ -n "${protected[$pid]:-}" ] && continue
    [ -d "/proc/$pid" ] || continue
    act kill -9 "$pid"
  done
}

# 1. Processes pointing into a test temp dir (command line, or an environment value such as PATH or PDCHAOS_SIM_DIR).
victims=()
# The pattern is written so that grep's own command line does not match it.
tmp_re="$(printf '%s' "$tmp" | sed 's/[][\\.*^$+?(){}|]/\\&/g')"
pattern="$tmp_re/pdchaos-test[-]$only"
[ -z "$only" ] && pattern="$tmp_re/pdchaos-(test|sshd)[-]"
for f in $(grep -laE -- "$pattern" /proc/[0-9]*/cmdline /proc/[0-9]*/environ 2>/dev/null); do
  pid="${f#/proc/}"
  victims+=("${pid%%/*}")
done
# Twins' own records: pids in service files, if the process still is a twin process (title or node), never a recycled pid.
for d in "$dir_prefix"*/; do
  [ -d "$d" ] || continue
  for f in "$d"services/*.json "$d"*/services/*.json; do
    [ -f "$f" ] || continue
    for pid in $(grep -oE '"(pid|rankPids)"[[:space:]]*:[[:space:]]*(\[[0-9, ]*\]|[0-9]+)' "$f" | grep -oE '[0-9]+'); do
      cmd=$(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null) || continue
      case "$cmd" in sglang::*|sgl-model-gateway*|*node*) victims+=("$pid") ;; esac
    done
  done
done
[ ${#victims[@]} -gt 0 ] && kill_pids "${victims[@]}"

# 2. Namespaces: kill everything inside, then delete. Deleting one also removes its veth pair.
if command -v ip >/dev/null 2>&1; then
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}'); do
    case "$ns" in "$ns_prefix"*) ;; *) continue ;; esac
    for _ in 1 2 3 4 5 6 7 8 9 10; do
      pids=$(ip netns pids "$ns" 2>/dev/null)
      [ -z "$pids" ] && break
      # shellcheck disable=SC2086
      kill_pids $pids
      [ "$dry" = 1 ] && break
      sleep 0.05
    done
    act ip netns del "$ns"
    act rm -f "$marker_dir/$ns.json"
  done
  # Links: with --only, those named in the matched markers; otherwise every pdc-h* / pdc-n* left in the root namespace.
  if [ -z "$only" ]; then
    for link in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E '^pdc-[hn][0-9]+$'); do
      act ip link del "$link"
    done
  fi
  for m in "$marker_dir/$ns_prefix"*.json; do
    [ -f "$m" ] || continue
    link=$(grep -oE '"hostLink":"pdc-h[0-9]+"' "$m" | cut -d'"' -f4)
    [ -n "$link" ] && ip link show "$link" >/dev/null 2>&1 && act ip link del "$link"
    act rm -f "$m"
  done
fi

# 3. The temp dirs (after their processes are gone).
if [ "$keep_dirs" = 0 ]; then
  extra=()
  [ -z "$only" ] && extra=("$sshd_prefix"*)
  for d in "$dir_prefix"* "${extra[@]}"; do
    [ -e "$d" ] || continue
    [ "$d" = "$tmp/pdchaos-test-registry" ] && continue
    act rm -rf "$d"
  done
fi

if [ "$dry" = 1 ]; then echo "cleanup-test-hosts: would remove $removed item(s)"; else say "removed $removed item(s)"; fi
exit 0
