#!/usr/bin/env bash
# A private OpenSSH server for the SshSandbox tests: 127.0.0.1:52222, public-key
# login only, for the unprivileged user strata-ssh (remote workspaces live in its
# home, so a test can never touch root's files). Host and client keys are made
# once under .services/sshd/ and reused.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

SSHD_DIR="$SERVICES_DIR/sshd"
PORT=52222
USER_NAME=strata-ssh
USER_HOME=/home/strata-ssh
CONFIG="$SSHD_DIR/sshd_config"
PIDFILE="$SSHD_DIR/sshd.pid"
HOST_KEY="$SSHD_DIR/ssh_host_ed25519_key"
CLIENT_KEY="$SSHD_DIR/client_ed25519"
mkdir -p "$SSHD_DIR"
chmod 700 "$SSHD_DIR"

# Debian starts the system sshd (on every interface) when the package is
# installed; ours runs privately on loopback, so keep the system one off.
without_service_start ensure_packages /usr/sbin/sshd:openssh-server ssh-keygen:openssh-client ssh:openssh-client
# The fault tests find the sshd processes of their own connection with `ss -p`
# and sample every argv on the host with `ps` (the secrets-out-of-argv tests).
ensure_packages ss:iproute2 ps:procps

if ! id "$USER_NAME" >/dev/null 2>&1; then
  useradd --system --create-home --home-dir "$USER_HOME" --shell /bin/sh "$USER_NAME"
fi
# useradd leaves the password field "!" (locked), and sshd refuses any login,
# keys included, to a locked account; "*" means no password, not locked.
usermod --password '*' "$USER_NAME"

[ -f "$HOST_KEY" ] || ssh-keygen -q -t ed25519 -N '' -C strata-test-host -f "$HOST_KEY"
[ -f "$CLIENT_KEY" ] || ssh-keygen -q -t ed25519 -N '' -C strata-test-client -f "$CLIENT_KEY"

# The user reads its own authorized_keys (sshd drops to the user to read it), so
# it lives in the user's home rather than under a clone whose parents it may not traverse.
install -d -m 700 -o "$USER_NAME" -g "$USER_NAME" "$USER_HOME/.ssh"
authorized="$USER_HOME/.ssh/authorized_keys"
touch "$authorized"
grep -qxF "$(cat "$CLIENT_KEY.pub")" "$authorized" || cat "$CLIENT_KEY.pub" >>"$authorized"
chown "$USER_NAME:$USER_NAME" "$authorized"
chmod 600 "$authorized"

cat >"$CONFIG" <<EOF
Port $PORT
ListenAddress 127.0.0.1
HostKey $HOST_KEY
PidFile $PIDFILE
AllowUsers $USER_NAME
PermitRootLogin no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
AuthorizedKeysFile .ssh/authorized_keys
# One connection runs many commands and file transfers side by side.
MaxSessions 64
MaxStartups 64:30:128
PrintMotd no
X11Forwarding no
AllowTcpForwarding no
AllowAgentForwarding no
Subsystem sftp internal-sftp
EOF

client_login() {
  ssh -i "$CLIENT_KEY" -p "$PORT" -o BatchMode=yes -o StrictHostKeyChecking=no \
    -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR "$USER_NAME@127.0.0.1" true
}

# The tests pin this checkout's host key, so the server on the port must be ours:
# another checkout's sshd (reused before host keys were checked) is replaced.
host_key_matches() {
  ssh-keyscan -p "$PORT" -t ed25519 127.0.0.1 2>/dev/null | grep -qF "$(cut -d' ' -f2 "$HOST_KEY.pub")"
}
port_holder() { ss -ltnpH "sport = :$PORT" 2>/dev/null | grep -o 'pid=[0-9]*' | head -n 1 | cut -d= -f2; }

running=""
if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then running="$(cat "$PIDFILE")"; fi
if [ -n "$running" ] && client_login 2>/dev/null && host_key_matches; then
  # sshd rereads its configuration on SIGHUP, so a changed config needs no restart.
  kill -HUP "$running"
  echo "sshd already running (pid $running)"
else
  for pid in $running $(port_holder); do
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  done
  mkdir -p /run/sshd # privilege separation directory
  /usr/sbin/sshd -t -f "$CONFIG"
  /usr/sbin/sshd -f "$CONFIG" -E "$SSHD_DIR/sshd.log"
  wait_for 20 client_login
  if ! host_key_matches; then
    echo "the sshd on 127.0.0.1:$PORT does not present this checkout's host key" >&2
    exit 1
  fi
fi

export_env STRATA_SSH_HOST 127.0.0.1
export_env STRATA_SSH_PORT "$PORT"
export_env STRATA_SSH_USER "$USER_NAME"
export_env STRATA_SSH_KEY "$CLIENT_KEY"
export_env STRATA_SSH_HOST_KEY "$HOST_KEY.pub"
echo "sshd on 127.0.0.1:$PORT for $USER_NAME"
