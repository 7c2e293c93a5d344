#!/usr/bin/env bash
# Redis for the store tests: one server on 127.0.0.1:56379, no persistence,
# daemonized with its pidfile and log under .services/redis. Reuses a server
# that is already answering from an earlier run.
set -euo pipefail
source "$(dirname "$0")/lib.sh"

PORT=56379
ensure_packages redis-server:redis-server redis-cli:redis-tools

DIR="$SERVICES_DIR/redis"
mkdir -p "$DIR"
# The start command lives in a file of its own so it can be rerun by hand.
cat >"$DIR/start.sh" <<START
#!/usr/bin/env bash
exec redis-server --bind 127.0.0.1 --port $PORT --protected-mode yes \\
  --daemonize yes --pidfile "$DIR/redis.pid" --logfile "$DIR/redis.log" \\
  --dir "$DIR" --save "" --appendonly no
START
chmod +x "$DIR/start.sh"

ping() { [ "$(redis-cli -h 127.0.0.1 -p "$PORT" ping 2>/dev/null)" = PONG ]; }
if ping; then
  echo "redis already running on 127.0.0.1:$PORT"
else
  "$DIR/start.sh"
  wait_for 30 ping
fi

export_env STRATA_REDIS_URL "redis://127.0.0.1:$PORT"
