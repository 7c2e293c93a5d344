#!/usr/bin/env bash
# bubblewrap for the BubblewrapSandbox tests, BusyBox (static) for the run of
# the sandbox's derived file operations over a BusyBox userland, prlimit for
# rlimit fallbacks and the workspace quota, setpriv to drop root, gcc for the
# containment tests' LD_PRELOAD probe library. Nothing to start; the check below fails early, with the
# reason, when this machine cannot create the namespaces bwrap needs.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
ensure_packages bwrap:bubblewrap busybox:busybox-static prlimit:util-linux setpriv:util-linux cc:gcc

if ! error=$(bwrap --unshare-user --unshare-pid --unshare-ipc --unshare-uts --unshare-net --die-with-parent \
  --ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/lib /lib --symlink usr/lib64 /lib64 \
  --proc /proc --dev /dev --tmpfs /tmp /bin/sh -c true 2>&1); then
  echo "bubblewrap cannot create a sandbox on this machine: $error" >&2
  echo "it needs user namespaces (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0)" >&2
  exit 1
fi
