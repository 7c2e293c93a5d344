#!/usr/bin/env bash
# What the sandbox runtime's tests need on the host: bubblewrap (the bubblewrap
# provider), and the interpreters code.run is tested with (python3, bash; node
# is the test runner itself). The local, bubblewrap and ssh sandboxes all run on
# this machine, so installing them here makes them present in all three.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ensure_packages bwrap:bubblewrap /usr/bin/python3:python3 bash:bash
