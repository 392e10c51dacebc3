#!/usr/bin/env bash
# corelane in zero-copy mode: boots a Debian kernel (>= 6.13, whose virtio_net takes
# XDP_ZEROCOPY) under QEMU's software emulation with two virtio NICs on one QEMU hub, and runs
# the guest's tests there: the echo example bound with `--zero-copy require` on one NIC, the
# guest kernel's own stack as its peer on the other. Needs no KVM, no tap, no privilege on
# the host beyond what apt needs the first time; the guest kernel is cached.
#
#   bash scripts/zerocopy-vm.sh            # exits with the guest's result
#
# CORELANE_VM_CACHE: where the kernel is kept (default /var/cache/corelane-vm).
# CORELANE_VM_GUEST: another guest /init in place of scripts/zerocopy-guest.sh (one test in a
# loop, say); it must print "corelane-vm: PASS" for this script to pass.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
cache=${CORELANE_VM_CACHE:-/var/cache/corelane-vm}
mkdir -p "$cache"

# The guest kernel: the newest 6.18 cloud image of trixie-backports, downloaded with an apt of
# its own (its own lists and cache: the machine's apt state is left as it was).
kernel_dir="$cache/kernel"
if [ ! -f "$kernel_dir/vmlinuz" ] || [ ! -f "$kernel_dir/8021q.ko" ]; then
  apt_dir=$(mktemp -d)
  trap 'rm -rf "$apt_dir"' EXIT
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
  echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie-backports main" \
    > "$apt_dir/sources.list"
  A=(-o Dir::Etc::SourceList="$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
     -o Dir::State::Lists="$apt_dir/lists" -o Dir::Cache="$apt_dir/cache" -o APT::Sandbox::User=root)
  apt-get "${A[@]}" -qq update
  pkg=$(apt-cache "${A[@]}" search '^linux-image-6\.18\.[0-9.]+\+deb13-cloud-amd64$' \
    | awk '{print $1}' | sort -V | tail -n 1)
  if [ -z "$pkg" ]; then
    echo "zerocopy-vm: no 6.18 cloud kernel in trixie-backports" >&2
    exit 1
  fi
  echo "zerocopy-vm: fetching $pkg"
  (cd "$apt_dir" && apt-get "${A[@]}" -qq download "$pkg")
  dpkg-deb -x "$apt_dir"/linux-image-*.deb "$apt_dir/x"
  rm -rf "$kernel_dir.new" && mkdir -p "$kernel_dir.new"
  cp "$apt_dir"/x/boot/vmlinuz-* "$kernel_dir.new/vmlinuz"
  for m in net/core/failover drivers/net/net_failover drivers/net/virtio_net net/llc/llc \
    net/802/stp net/802/garp net/802/mrp net/8021q/8021q; do
    f=$(ls "$apt_dir"/x/usr/lib/modules/*/kernel/$m.ko.xz 2>/dev/null || true)
    if [ -z "$f" ]; then
      echo "zerocopy-vm: $pkg has no $m module" >&2
      exit 1
    fi
    xz -dc "$f" > "$kernel_dir.new/$(basename "$m").ko"
  done
  echo "$pkg" > "$kernel_dir.new/version"
  rm -rf "$kernel_dir" && mv "$kernel_dir.new" "$kernel_dir"
fi
echo "zerocopy-vm: guest kernel $(cat "$kernel_dir/version")"

# What runs in the guest.
cargo build --locked --release --example echo --example http -p corelane -q
cargo build --locked --release --example http3 --features h3 -p corelane -q
cargo build --locked --release -p corelane-testnet --bin echo-check -q
cargo build --locked --release -p corelane-bench --bin h3get -q

work=$(mktemp -d)
trap 'rm -rf "$work" ${apt_dir:+"$apt_dir"}' EXIT
ir="$work/root"
mkdir -p "$ir"/{bin,sbin,lib,lib64,proc,sys,dev,run,tmp,etc,usr/bin,usr/lib}
cp /bin/busybox "$ir/bin/busybox"
cp "$kernel_dir"/*.ko "$ir/lib/"
# Each program with the libraries it loads, at the paths it loads them from.
add() {
  local src=$1 dst=$2
  cp "$src" "$ir$dst"
  ldd "$src" | awk '/=> \//{print $3} /^\t\/lib64/{print $1}' | while read -r lib; do
    mkdir -p "$ir$(dirname "$lib")"
    cp -L "$lib" "$ir$lib"
  done
}
add "$root/target/release/examples/echo" /bin/echo-server
add "$root/target/release/examples/http" /bin/http-server
add "$root/target/release/echo-check" /bin/echo-check
add "$root/target/release/examples/http3" /bin/http3-server
add "$root/target/release/h3get" /bin/h3get
# iproute2's ip for network namespaces (busybox's has none), the shared-address test moving
# the kernel's peer NIC into one; not named ip* (iproute2 reads "ipr" as "ip route").
add /usr/sbin/ip /usr/bin/nsip
# ethtool for the NIC's per-queue counters in a failure's diagnostics (busybox has none).
add /usr/sbin/ethtool /usr/bin/ethtool
# The death keeper runs a real shell and sleep.
add /bin/bash /bin/bash
add /bin/sleep /usr/bin/sleep.real
ln -sf /usr/bin/sleep.real "$ir/bin/sleep"
cp "${CORELANE_VM_GUEST:-scripts/zerocopy-guest.sh}" "$ir/init"
chmod 755 "$ir/init"
(cd "$ir" && find . | cpio -o -H newc --quiet | gzip -1) > "$work/initrd.gz"
echo "zerocopy-vm: initramfs $(du -h "$work/initrd.gz" | cut -f1)"

# corelane's NIC (zero-copy needs a modern device behind an IOMMU-aware transport:
# disable-legacy, iommu_platform) and the guest kernel's NIC. As root, in a network namespace
# of this run: two taps on a bridge, corelane's with two queues (its frames spread over them by
# flow), so lanes and steering to the bound queue are tested too; otherwise one queue each on a
# QEMU hub, which needs no privilege at all.
nic="disable-legacy=on,iommu_platform=on"
log="$work/console.log"
queues=1
wrap=()
if [ "$(id -u)" -eq 0 ] && [ -c /dev/net/tun ] && [ "${CORELANE_VM_QUEUES:-2}" -gt 1 ]; then
  queues=${CORELANE_VM_QUEUES:-2}
  ns="corelane-vm-$$"
  ip netns add "$ns"
  trap 'ip netns del "$ns" 2>/dev/null; rm -rf "$work" ${apt_dir:+"$apt_dir"}' EXIT
  ip netns exec "$ns" sh -e -c '
    ip tuntap add dev tapa mode tap multi_queue
    ip tuntap add dev tapb mode tap
    ip link add br0 type bridge
    # Jumbo frames cross the bridge (the guest tests MTUs above 1500).
    for d in tapa tapb; do ip link set "$d" mtu 9000 master br0; ip link set "$d" up; done
    ip link set br0 mtu 9000 up'
  wrap=(ip netns exec "$ns")
  nets=(-netdev "tap,id=n0,ifname=tapa,script=no,downscript=no,vhost=off,queues=$queues"
        -device "virtio-net-pci,netdev=n0,mac=52:54:00:00:99:02,mq=on,vectors=$((2 * queues + 2)),$nic"
        -netdev "tap,id=n1,ifname=tapb,script=no,downscript=no,vhost=off"
        -device "virtio-net-pci,netdev=n1,mac=52:54:00:00:99:01,$nic")
else
  nets=(-netdev hubport,id=n0,hubid=0 -device "virtio-net-pci,netdev=n0,mac=52:54:00:00:99:02,$nic"
        -netdev hubport,id=n1,hubid=0 -device "virtio-net-pci,netdev=n1,mac=52:54:00:00:99:01,$nic")
fi
# A third NIC, legacy-capable and without iommu_platform: the driver refuses it zero-copy.
nets+=(-netdev hubport,id=n2,hubid=1 -device virtio-net-pci,netdev=n2,mac=52:54:00:00:99:03)
echo "zerocopy-vm: corelane's NIC has $queues queue(s)"
# Software emulation now and then crashes the guest kernel while it boots (seen here: an int3
# oops in code the kernel was patching at boot, with two vCPU threads). A guest that crashed
# before its first test is booted again, at most twice; a test's failure is never retried.
for boot in 1 2 3; do
  set +e
  timeout 1500 "${wrap[@]}" qemu-system-x86_64 -machine q35 -cpu max -smp 2 -m 1536 \
    -nographic -no-reboot -nodefaults -serial stdio \
    -kernel "$kernel_dir/vmlinuz" -initrd "$work/initrd.gz" \
    -append "console=ttyS0 panic=-1 quiet loglevel=3 corelane.queues=$queues" \
    "${nets[@]}" | tee "$log"
  status=$?
  set -e
  if grep -q "^corelane-vm: PASS" "$log"; then
    echo "zerocopy-vm: the guest's tests passed"
    exit 0
  fi
  if grep -qE "^corelane-vm: (ok|FAIL)" "$log" \
    || ! grep -qE "Oops|Kernel panic|BUG:" "$log"; then
    break
  fi
  echo "zerocopy-vm: the guest kernel crashed before its first test (boot $boot of 3)" >&2
done
echo "zerocopy-vm: the guest's tests failed (qemu exit $status)" >&2
exit 1
