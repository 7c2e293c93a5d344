# Shared helpers for the service scripts. Sourced, not run.
# Each service script installs what it needs from Debian's packages, starts the
# service on loopback with its data under .services/, and appends the
# environment variables the tests read to .services/env.

STRATA_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SERVICES_DIR="$STRATA_ROOT/.services"
mkdir -p "$SERVICES_DIR"

# Installs the Debian packages whose command is missing. Usage: ensure_packages cmd:pkg ...
ensure_packages() {
  local missing=()
  for pair in "$@"; do
    local cmd="${pair%%:*}" pkg="${pair#*:}"
    command -v "$cmd" >/dev/null 2>&1 || [ -x "$cmd" ] || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ ! -f "$SERVICES_DIR/.apt-updated" ]; then
    apt-get update -q >/dev/null && touch "$SERVICES_DIR/.apt-updated"
  fi
  echo "installing: ${missing[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
}

# Records a variable for the tests: export_env NAME VALUE
export_env() {
  export "$1=$2"
  # One line per name: a service started again replaces its line rather than adding another.
  if [ -f "$SERVICES_DIR/env" ]; then
    grep -v "^export $1=" "$SERVICES_DIR/env" >"$SERVICES_DIR/env.new" || true
    mv "$SERVICES_DIR/env.new" "$SERVICES_DIR/env"
  fi
  echo "export $1='$2'" >>"$SERVICES_DIR/env"
}

# Waits until a command succeeds, up to N seconds: wait_for N cmd...
wait_for() {
  local seconds="$1"; shift
  for _ in $(seq 1 $((seconds * 5))); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.2
  done
  echo "timed out waiting for: $*" >&2
  return 1
}

# Runs a command (an install) with Debian's automatic service start turned off:
# our services run privately on loopback, never as the system's daemons.
without_service_start() {
  if [ -e /usr/sbin/policy-rc.d ]; then "$@"; return; fi
  printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
  chmod +x /usr/sbin/policy-rc.d
  local rc=0
  "$@" || rc=$?
  rm -f /usr/sbin/policy-rc.d
  return "$rc"
}
