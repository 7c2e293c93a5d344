#!/usr/bin/env bash
# The test command (`npm test`): installs and starts every service the tests
# use (from Debian's packages, on loopback), then type-checks, lints and runs
# the whole suite on the Node that runs npm (20), then again on Node 24
# (scripts/node24.sh, which installs it from the npm registry; see there for
# the files it leaves to the first pass). A service that cannot start, or a
# Node 24 that cannot be installed, fails the run; nothing is skipped.
set -euo pipefail
cd "$(dirname "$0")/.."

[ -d node_modules ] || npm install --no-audit --no-fund
rm -f .services/env
for service in scripts/services/[0-9]*.sh; do
  echo "== starting $(basename "$service" .sh)"
  bash "$service"
done
# shellcheck disable=SC1091
[ -f .services/env ] && source .services/env
export STRATA_SERVICES_REQUIRED=1

echo "== typecheck"; npx tsc --noEmit -p .
echo "== lint"; npx eslint .
echo "== tests on Node $(node -v)"; npx vitest run "$@"
bash scripts/node24.sh "$@"
