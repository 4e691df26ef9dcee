#!/usr/bin/env bash
# Install what the tests need, only where missing; idempotent and quiet.
#   Debian packages (as root): openssh-server openssh-client iptables nftables iproute2 prometheus-pushgateway prometheus systemd chromium procps libxml2-utils tcsh fish
#   /run/sshd (sshd refuses to start as root without it)
#   npm packages of this repo: `npm ci` (or `npm install` without a lock file), skipped when node_modules already
#   matches the lock file (npm ci would wipe node_modules under any test running at the same time).
#
# usage: install-test-deps.sh [--dry-run] [--force-npm] [--no-npm]
set -euo pipefail

dry=0
npm_mode=auto
for arg in "$@"; do
  case "$arg" in
    --dry-run) dry=1 ;;
    --force-npm) npm_mode=force ;;
    --no-npm) npm_mode=skip ;;
    -h|--help) sed -n '2,8p' "$0"; exit 0 ;;
    *) echo "install-test-deps: unknown argument '$arg' (see --help)" >&2; exit 2 ;;
  esac
done

repo="$(cd "$(dirname "$0")/.." && pwd)"
log="$(mktemp "${TMPDIR:-/tmp}/pdchaos-install-XXXXXX.log")"
trap 'rm -f "$log"' EXIT

fail() {
  echo "install-test-deps: $1" >&2
  if [ -s "$log" ]; then echo "--- last lines of output ---" >&2; tail -n 20 "$log" >&2; fi
  exit 1
}
run() { # run quietly, keep the output for the failure message
  if [ "$dry" = 1 ]; then echo "would run: $*"; return 0; fi
  "$@" >>"$log" 2>&1
}

packages=(openssh-server openssh-client iptables nftables iproute2 prometheus-pushgateway prometheus systemd chromium procps libxml2-utils tcsh fish)
missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
  [ "$status" = installed ] || missing+=("$p")
done

if [ ${#missing[@]} -gt 0 ]; then
  [ "$(id -u)" = 0 ] || fail "missing packages (${missing[*]}) and not root: run as root or install them yourself"
  command -v apt-get >/dev/null 2>&1 || fail "missing packages (${missing[*]}) and no apt-get on this system"
  echo "install-test-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  run apt-get update -q || fail "apt-get update failed"
  run apt-get install -y -q --no-install-recommends "${missing[@]}" || fail "apt-get install ${missing[*]} failed"
fi

if [ "$(id -u)" = 0 ]; then
  run mkdir -p -m 0755 /run/sshd || fail "cannot create /run/sshd"
fi

# npm: a lock file newer than node_modules' own record (or no node_modules) means an install is due.
cd "$repo"
need_npm=0
case "$npm_mode" in
  force) need_npm=1 ;;
  skip) need_npm=0 ;;
  auto)
    hidden=node_modules/.package-lock.json
    if [ ! -f "$hidden" ]; then need_npm=1
    elif [ -f package-lock.json ] && [ package-lock.json -nt "$hidden" ]; then need_npm=1
    elif [ package.json -nt "$hidden" ]; then need_npm=1
    elif ! npm ls --silent >/dev/null 2>&1; then need_npm=1
    fi ;;
esac
if [ "$need_npm" = 1 ]; then
  command -v npm >/dev/null 2>&1 || fail "npm not found (Node 20 is needed)"
  if [ -f package-lock.json ]; then
    echo "install-test-deps: npm ci"
    run npm ci --engine-strict --no-audit --no-fund --loglevel=error || fail "npm ci failed"
  else
    echo "install-test-deps: npm install"
    run npm install --engine-strict --no-audit --no-fund --loglevel=error || fail "npm install failed"
  fi
fi
exit 0
