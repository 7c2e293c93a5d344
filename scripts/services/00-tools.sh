#!/usr/bin/env bash
# Command-line tools the tests use directly: ripgrep (the filesystem backend's grep engine).
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ensure_packages rg:ripgrep
