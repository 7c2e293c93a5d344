#!/usr/bin/env bash
# A private Docker daemon for the DockerSandbox tests, and the two test images,
# built locally because no registry is reachable:
#   strata-test/busybox  a static busybox and its applets
#   strata-test/gnu      GNU coreutils, dash, grep, sed, awk, findutils, procps, setsid and setpriv copied from the host
# The daemon listens on a unix socket only, keeps its data apart from any system
# Docker, and creates no bridge or iptables rules (sandboxes run with --network none).
set -euo pipefail
source "$(dirname "$0")/lib.sh"

DOCKER_DIR="$SERVICES_DIR/docker"
# A unix socket path must fit in 107 bytes and CI clones into directories of any
# length, so the socket and the daemon's runtime state live at fixed short paths.
SOCKET=/run/strata-docker.sock
EXEC_ROOT=/run/strata-docker
DATA_ROOT=/var/lib/strata-docker
PIDFILE="$DOCKER_DIR/dockerd.pid"
LOG="$DOCKER_DIR/dockerd.log"
mkdir -p "$DOCKER_DIR"

# Debian starts a package's daemons when it is installed; ours runs privately, so
# keep the system ones off while installing.
without_service_start ensure_packages dockerd:docker.io docker:docker.io

docker_cli() { docker --host "unix://$SOCKET" "$@"; }

start_dockerd() {
  if [ -f "$PIDFILE" ] && kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
    echo "dockerd (pid $(cat "$PIDFILE")) does not answer; restarting it"
    kill "$(cat "$PIDFILE")" 2>/dev/null || true
    for _ in $(seq 1 50); do kill -0 "$(cat "$PIDFILE")" 2>/dev/null || break; sleep 0.2; done
  fi
  rm -f "$SOCKET" "$PIDFILE"
  mkdir -p "$DATA_ROOT" "$EXEC_ROOT"
  # setsid: the daemon outlives this script and later runs reuse it.
  setsid dockerd \
    --host "unix://$SOCKET" \
    --data-root "$DATA_ROOT" \
    --exec-root "$EXEC_ROOT" \
    --pidfile "$PIDFILE" \
    --containerd-namespace strata \
    --containerd-plugins-namespace strata-plugins \
    --bridge none --iptables=false --ip-masq=false --ip-forward=false \
    >>"$LOG" 2>&1 </dev/null &
  if ! wait_for 60 docker_cli info; then
    tail -n 20 "$LOG" >&2
    exit 1
  fi
}

if docker_cli info >/dev/null 2>&1; then
  echo "dockerd already answers on $SOCKET"
else
  start_dockerd
fi

# Containers a crashed test run left behind: stopped ones, and running ones older than an hour.
docker_cli container prune --force --filter label=strata.test=1 >/dev/null
now=$(date +%s)
for id in $(docker_cli ps --quiet --filter label=strata.test=1); do
  created=$(docker_cli inspect --format '{{.Created}}' "$id")
  if [ $((now - $(date -d "$created" +%s))) -gt 3600 ]; then docker_cli rm --force "$id" >/dev/null; fi
done

# Imports a root filesystem directory as an image tagged with its content hash,
# unless that exact image exists already. Prints the image reference.
import_rootfs() {
  local name="$1" rootfs="$2" tarball hash
  tarball="$(mktemp)"
  tar --create --file "$tarball" --directory "$rootfs" --sort=name --mtime=@0 \
    --owner=0 --group=0 --numeric-owner .
  hash="$(sha256sum "$tarball" | cut -c1-16)"
  if ! docker_cli image inspect "$name:$hash" >/dev/null 2>&1; then
    docker_cli import --change 'WORKDIR /workspace' --change 'CMD ["/bin/sh"]' "$tarball" "$name:$hash" >/dev/null
  fi
  docker_cli tag "$name:$hash" "$name:latest"
  rm -f "$tarball"
  # A broken image (a missing library, say) fails here rather than in every test.
  docker_cli run --rm --network none "$name:$hash" /bin/sh -c 'echo ok | grep -q ok && setsid true' >/dev/null
  echo "$name:$hash"
}

# Skeleton shared by both images: the directories and the users a shell expects.
base_rootfs() {
  local rootfs="$1"
  mkdir -p "$rootfs"/{etc,tmp,workspace,root,proc,sys,dev}
  chmod 1777 "$rootfs/tmp"
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/sh\n' >"$rootfs/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"$rootfs/etc/group"
}

build_busybox() {
  local rootfs="$1" applet
  base_rootfs "$rootfs"
  mkdir -p "$rootfs/bin"
  cp "$(command -v busybox)" "$rootfs/bin/busybox"
  for applet in $(busybox --list-full); do
    [ "$applet" = bin/busybox ] && continue
    mkdir -p "$rootfs/$(dirname "$applet")"
    ln -sf /bin/busybox "$rootfs/$applet"
  done
}

# Copies a host binary (resolving symlinks) to /usr/bin/<name>, with every
# shared library ldd reports, the dynamic loader included.
copy_binary() {
  local rootfs="$1" binary="$2" name="${3:-$(basename "$2")}" lib
  cp -L "$binary" "$rootfs/usr/bin/$name"
  for lib in $(ldd "$binary" 2>/dev/null | grep -o '/[^ ]*'); do
    [ -e "$rootfs$lib" ] && continue
    mkdir -p "$rootfs$(dirname "$lib")"
    cp -L "$lib" "$rootfs$lib"
  done
}

build_gnu() {
  local rootfs="$1" binary
  base_rootfs "$rootfs"
  # Merged /usr, as on a fresh Debian 12: /bin, /lib, ... are links into /usr.
  mkdir -p "$rootfs"/usr/{bin,lib,lib64,sbin}
  for dir in bin lib lib64 sbin; do ln -s "usr/$dir" "$rootfs/$dir"; done
  for binary in $(dpkg -L coreutils | grep -E '/s?bin/'); do
    [ -f "$binary" ] && copy_binary "$rootfs" "$binary"
  done
  copy_binary "$rootfs" "$(type -P dash)"
  ln -s dash "$rootfs/usr/bin/sh"
  for binary in grep sed find xargs setsid setpriv ps kill pkill; do
    copy_binary "$rootfs" "$(type -P "$binary")"
  done
  copy_binary "$rootfs" "$(type -P awk)" awk
}

# The busybox image needs a static busybox (Debian's plain busybox is dynamic),
# the GNU image needs procps and findutils on the host.
ensure_packages busybox:busybox-static ps:procps find:findutils setsid:util-linux
if ldd "$(command -v busybox)" >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q busybox-static >/dev/null
fi

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
build_busybox "$work/busybox"
build_gnu "$work/gnu"
busybox_image="$(import_rootfs strata-test/busybox "$work/busybox")"
gnu_image="$(import_rootfs strata-test/gnu "$work/gnu")"

export_env STRATA_DOCKER_HOST "$SOCKET"
export_env STRATA_DOCKER_IMAGE_BUSYBOX "$busybox_image"
export_env STRATA_DOCKER_IMAGE_GNU "$gnu_image"
echo "dockerd on $SOCKET; images $busybox_image $gnu_image"
