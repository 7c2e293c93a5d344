#!/usr/bin/env bash
# The test suite's second pass, on Node 24 (`npm test` runs it after the Node 20
# pass; run it alone with `bash scripts/node24.sh [vitest args]` once the
# services are up). Node 24 comes from the npm registry: the `node` package
# installs its binaries through the per-platform package `node-linux-<arch>`,
# which this installs directly (no install script, nothing downloaded from
# elsewhere) into .node24/, a git-ignored directory. better-sqlite3's native
# addon is built for Node 20 in node_modules; Node 24 needs its own build, made
# from source against the headers that package ships, in .node24/node_modules,
# and scripts/node24-hooks.mjs sends every require or import of better-sqlite3
# there when the process runs on Node 24.
#
# Any failure here fails `npm test`: a missing Node 24 is an error, not a skip.
#
# The pass runs the whole suite except the files that test what lives in a
# sandbox's shell scripts, a container or a remote account rather than in Node
# (NODE24_EXCLUDED below): they take about half the suite's time on 2 cores
# and gain nothing from a second Node. The Node code of every sandbox and
# store still runs on 24 (sandbox-docker, sandbox-ssh, the bubblewrap and
# local conformance suites, the stores), and the AI SDK 7 tests, which need
# Node >= 22, run only here.
set -euo pipefail
cd "$(dirname "$0")/.."

NODE24_DIR=.node24
NODE24_HEADERS=24.18.1
NODE24_EXCLUDED=(
  test/sandbox-docker.conformance.test.ts
  test/sandbox-docker.containment.test.ts
  test/sandbox-docker.hostile.test.ts
  test/sandbox-ssh.conformance.test.ts
  test/sandbox-ssh-threats.test.ts
  test/sandbox-atomic.test.ts
)

case "$(uname -m)" in
  x86_64) arch=x64 ;;
  aarch64 | arm64) arch=arm64 ;;
  *) echo "node24: no Node 24 package for $(uname -m)" >&2; exit 1 ;;
esac
node_pkg="node-linux-$arch"
node24="$PWD/$NODE24_DIR/node_modules/$node_pkg/bin/node"
sqlite_version="$(node -p 'require("./node_modules/better-sqlite3/package.json").version')"

# The build matches when Node 24 loads it (through the hook) and opens a database.
sqlite_ok() {
  [ -x "$node24" ] && [ -f "$NODE24_DIR/node_modules/better-sqlite3/package.json" ] &&
    [ "$(node -p "require('./$NODE24_DIR/node_modules/better-sqlite3/package.json').version")" = "$sqlite_version" ] &&
    [ "$(node -p "require('./$NODE24_DIR/node_modules/node-headers/package.json').version" 2>/dev/null)" = "$NODE24_HEADERS" ] &&
    "$node24" --import ./scripts/node24-hooks.mjs -e 'const D = require("better-sqlite3"); new D(":memory:").prepare("select 1").get()' 2>/dev/null
}

if ! sqlite_ok; then
  started=$SECONDS
  echo "== node24: installing $node_pkg@24 and building better-sqlite3@$sqlite_version for it"
  rm -rf "$NODE24_DIR"
  mkdir -p "$NODE24_DIR"
  # better-sqlite3 12 is built against the headers of Node $NODE24_HEADERS, not the
  # runtime's: from 24.19 on, node::ObjectWrap's inline code registers a cleanup
  # hook whose removal aborts the process at exit (nodejs/node#65446; SIGABRT,
  # "Assertion failed: (env) != nullptr" in Statement::~Statement, in every
  # process that used a SqliteStore). The ABI is the same for every 24.x.
  # Built from source: a prebuilt download would match the Node running npm (20).
  printf '{ "private": true, "dependencies": { "%s": "^24.0.0", "node-headers": "npm:%s@%s", "better-sqlite3": "%s" } }\n' \
    "$node_pkg" "$node_pkg" "$NODE24_HEADERS" "$sqlite_version" >"$NODE24_DIR/package.json"
  # npm extracts every package before it runs any install script, so the headers are there when better-sqlite3 builds.
  # jobs=max: node-gyp compiles SQLite and the addon on every core instead of one.
  (cd "$NODE24_DIR" && npm_config_nodedir="$PWD/node_modules/node-headers" npm_config_build_from_source=true npm_config_jobs=max \
    npm install --no-audit --no-fund --loglevel=error)
  sqlite_ok || { echo "node24: better-sqlite3 does not load on Node 24" >&2; exit 1; }
  echo "== node24: ready in $((SECONDS - started)) s"
fi

echo "== tests on Node $("$node24" -v)"
exclude=()
for file in "${NODE24_EXCLUDED[@]}"; do exclude+=(--exclude "$file"); done
# Node 24 first on PATH, so the Node processes the tests start (tsx for the
# docs' snippets) are 24 too; the hook reaches them all through NODE_OPTIONS.
PATH="$(dirname "$node24"):$PATH" \
  NODE_OPTIONS="${NODE_OPTIONS:+$NODE_OPTIONS }--import $PWD/scripts/node24-hooks.mjs" \
  STRATA_NODE24_RUN=1 \
  "$node24" node_modules/vitest/vitest.mjs run "${exclude[@]}" "$@"
