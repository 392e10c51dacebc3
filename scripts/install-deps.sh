#!/usr/bin/env bash
# Installs what corelane needs on a fresh Debian (bookworm) machine, as root: the C toolchain and
# headers the AF_XDP and BPF crates build against, and the tools the tests and demo use.
set -euo pipefail
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: run as root (apt-get install needs it)" >&2
  exit 1
fi
pkgs=(build-essential pkg-config clang llvm m4 libelf-dev zlib1g-dev libbpf-dev libhwloc-dev
      libudev-dev linux-libc-dev iproute2 ethtool nftables iputils-ping util-linux python3 curl wrk nginx tcpdump
      fonts-dejavu-core qemu-system-x86 busybox-static cpio xz-utils)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  # Where an init system lets it, nginx's package starts a server on port 80; the comparison
  # runs its own, pinned, in a network namespace.
  if [ -f /run/nginx.pid ]; then nginx -s quit 2>/dev/null || true; fi
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "install-deps: cargo not found; install Rust (stable, 1.91 or newer) with rustup" >&2
  exit 1
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true
# aioquic: the Python HTTP/3 client the HTTP/3 tests fetch with (tests/http3_wire.rs,
# scripts/h3client.py), for the `python3` the tests run. Debian's own Python is marked
# externally managed: there it goes in beside the system's packages.
if ! python3 -c "import aioquic" 2>/dev/null; then
  echo "install-deps: installing aioquic (PyPI)"
  if ! python3 -m pip --version >/dev/null 2>&1; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends python3-pip >/dev/null
  fi
  python3 -m pip install --quiet --disable-pip-version-check "aioquic==1.7.2" 2>/dev/null ||
    python3 -m pip install --quiet --disable-pip-version-check --break-system-packages "aioquic==1.7.2"
fi
