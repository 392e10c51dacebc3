#!/bin/busybox sh
# The zero-copy guest's /init (built into its initramfs by scripts/zerocopy-vm.sh): corelane's
# echo example on eth0 in zero-copy mode, the kernel's stack on eth1 as its peer (the two NICs
# share a QEMU hub), each test's result on the console, then the machine powers off.
/bin/busybox --install -s /bin
export PATH=/bin:/usr/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs run /run
mount -t tmpfs tmp /tmp
for m in failover net_failover virtio_net llc stp garp mrp 8021q; do insmod /lib/$m.ko; done
ip link set lo up
# eth0 has no address of the kernel's: corelane answers for 10.99.0.2 on it. eth1 is the
# kernel's, 10.99.0.1, and reaches 10.99.0.2 through the hub.
ip link set eth0 up
ip addr add 10.99.0.1/24 dev eth1
ip link set eth1 up

queues=$(sed -n 's/.*corelane\.queues=\([0-9]*\).*/\1/p' /proc/cmdline)
queues=${queues:-1}
fails=0
result() {
  echo "corelane-vm: $1"
  [ "${1%% *}" = ok ] && return
  fails=$((fails + 1))
  diagnose
}

# What the peer and corelane's NIC saw, printed with each failure: whether the peer resolved
# corelane's address, and the NIC's counters per queue (a queue whose receive stalled shows
# its packets stop while the other's go on).
diagnose() {
  echo "corelane-vm: diagnostics, $(cut -d' ' -f1 /proc/uptime) s after boot"
  # The peer's NIC is in the namespace "peer" for the last tests.
  if [ -e /sys/class/net/eth1 ]; then
    ip neigh show dev eth1
  else
    nsip -n peer neigh show dev eth1
  fi
  # busybox's ip has no -s: the interface's counters from sysfs.
  for c in rx_packets rx_dropped tx_packets tx_dropped; do
    echo "eth0 $c $(cat /sys/class/net/eth0/statistics/$c)"
  done
  # Each transmit queue: the watchdog's timeouts and what its byte queue limit holds in flight
  # (a queue the stack stopped shows bytes in flight that never complete).
  for q in /sys/class/net/eth0/queues/tx-*; do
    echo "eth0 ${q##*/}: timeouts $(cat $q/tx_timeout) inflight $(cat $q/byte_queue_limits/inflight) limit $(cat $q/byte_queue_limits/limit)"
  done
  ethtool -S eth0 | grep -v ': 0$'
}

# Stops the server with SIGTERM so that its report (per-core counters, frames) is printed,
# then with SIGKILL if it has not stopped 8 s later.
stop_and_report() {
  kill -TERM $server 2>/dev/null
  n=0
  while kill -0 $server 2>/dev/null && [ $n -lt 40 ]; do
    sleep 0.2
    n=$((n + 1))
  done
  kill -KILL $server 2>/dev/null
  wait $server 2>/dev/null
  tail -n 20 /tmp/server.log
}

# Starts BIN on eth0 in zero-copy with ARGS, its output in /tmp/server.log; fails unless it
# serves within two minutes with its sockets in zero-copy (their XDP_OPTIONS say so).
serve() {
  bin=$1
  shift
  # A fresh log: the last run's "serving" line must not pass for this one's.
  rm -f /tmp/server.log
  : > /tmp/server.log
  "$bin" --iface eth0 --zero-copy require --xdp-mode native "$@" > /tmp/server.log 2>&1 &
  server=$!
  n=0
  until grep -q "serving" /tmp/server.log; do
    n=$((n + 1))
    if [ $n -gt 600 ] || ! kill -0 $server 2>/dev/null; then
      cat /tmp/server.log
      return 1
    fi
    sleep 0.2
  done
  cat /tmp/server.log
  grep -q "AF_XDP sockets in zero-copy mode" /tmp/server.log
}

# The echo example on 10.99.0.2.
start() {
  serve echo-server --addr 10.99.0.2/24 "$@"
}

# Transmit checksum offload asked for: virtio-net's xsk-features have no tx-checksum (it takes
# no AF_XDP TX metadata in zero-copy), so the checksums are summed here, and the server says so.
if start --tx-checksum-offload; then
  if grep -q "zero-copy" /tmp/server.log; then
    result "ok zero-copy: the sockets say XDP_ZEROCOPY"
  else
    result "FAIL zero-copy: the sockets did not say zero-copy"
  fi
  if grep -q "transmit checksums: summed here" /tmp/server.log; then
    result "ok offload: transmit checksum offload asked for, summed here in zero-copy, said"
  else
    result "FAIL offload: the server did not say where transmit checksums are summed"
  fi
  if echo-check 10.99.0.2:7 --tcp 1000,100000,4000000 --parallel 1 --udp 300; then
    result "ok echo: TCP 1 kB, 100 kB and 4 MB both ways, 300 UDP datagrams"
  else
    result "FAIL echo"
  fi
  if echo-check 10.99.0.2:7 --tcp 500000 --parallel 4; then
    result "ok parallel: 4 connections of 500 kB at once"
  else
    result "FAIL parallel"
  fi
  kill -TERM $server
  wait $server
  code=$?
  cat /tmp/server.log | tail -n 12
  if [ $code -eq 0 ] && grep -q "^frames: " /tmp/server.log \
    && grep -q "dropped by the kernel with the receive ring full" /tmp/server.log; then
    result "ok stop: a graceful stop with every frame back, ring drops reported"
  else
    result "FAIL stop: exit $code"
  fi
else
  result "FAIL start: the echo example did not serve in zero-copy mode"
fi

# Every queue served: one lane per queue, each core its queue's AF_XDP socket in zero-copy;
# connections spread over the queues by flow, each served (and its segments handed to the core
# that owns it when they arrive on another queue).
if [ "$queues" -gt 1 ]; then
  if start --cores "$queues"; then
    if echo-check 10.99.0.2:7 --tcp 50000 --parallel 24 --udp 100 > /tmp/spread.log 2>&1; then
      tail -n 2 /tmp/spread.log
      kill -TERM $server
      wait $server
      code=$?
      grep "^core " /tmp/server.log
      busy=$(grep "^core " /tmp/server.log | grep -vc " 0 connections accepted")
      if [ $code -eq 0 ] && [ "$busy" -eq "$queues" ]; then
        result "ok queues: $queues lanes in zero-copy, every one accepted connections"
      else
        result "FAIL queues: exit $code, $busy of $queues cores accepted connections"
      fi
    else
      cat /tmp/spread.log
      result "FAIL queues: the echo over $queues queues"
      kill -TERM $server
      wait $server
    fi
  else
    result "FAIL queues: did not start on $queues queues in zero-copy"
  fi
fi

# Stopped during a transfer: the device still holds frames for the queue when the sockets
# close; they find no socket, which is not a steering fault and is not reported as one.
if start; then
  echo-check 10.99.0.2:7 --tcp 20000000 > /tmp/cut.log 2>&1 &
  cut=$!
  sleep 2
  kill -TERM $server
  wait $server
  code=$?
  wait $cut
  tail -n 4 /tmp/server.log
  if [ $code -eq 0 ] && ! grep -q "no core served" /tmp/server.log; then
    result "ok stop under load: every frame back, no false steering warning"
  else
    result "FAIL stop under load: exit $code"
  fi
else
  result "FAIL stop under load: did not start"
fi

# Killed (SIGKILL) under no load, then started again: the next start undoes what the dead
# one left, serves, and stops with every frame back.
if start; then
  kill -KILL $server
  wait $server 2>/dev/null
  if start && echo-check 10.99.0.2:7 --tcp 200000 --parallel 2; then
    kill -TERM $server
    if wait $server && grep -q "^frames: " /tmp/server.log; then
      result "ok restart: killed, started again, served, every frame back"
    else
      result "FAIL restart: the second run did not stop cleanly"
    fi
  else
    result "FAIL restart: the second run did not serve"
    stop_and_report
  fi
else
  result "FAIL restart: the first run did not start"
fi

# An upgrade under load: two processes share each queue's UMEM in zero-copy mode while two
# transfers run; the old process ends by itself, no byte is lost. Its grace is long enough for
# a guest emulated on a loaded host to finish 12 MB (the default 30 s is a real NIC's).
if start --upgrades /run/echo.upgrade --upgrade-grace 180; then
  old=$server
  echo-check 10.99.0.2:7 --tcp 6000000 --parallel 2 > /tmp/load.log 2>&1 &
  load=$!
  sleep 1
  mv /tmp/server.log /tmp/old.log
  if start --upgrades /run/echo.upgrade --take-over /run/echo.upgrade; then
    new=$server
    wait $old
    old_code=$?
    wait $load
    load_code=$?
    cat /tmp/load.log
    tail -n 3 /tmp/old.log
    if [ $old_code -eq 0 ] && [ $load_code -eq 0 ] && grep -q "upgraded" /tmp/old.log \
      && echo-check 10.99.0.2:7 --tcp 100000 --udp 50; then
      result "ok upgrade: taken over under load in zero-copy, every byte back"
    else
      result "FAIL upgrade: old exit $old_code, load exit $load_code"
    fi
    kill -TERM $new
    wait $new || result "FAIL upgrade: the new process did not stop cleanly"
  else
    result "FAIL upgrade: the new process did not start"
    kill -KILL $old 2>/dev/null
  fi
else
  result "FAIL upgrade: the old process did not start"
fi

# A VLAN: corelane serves VLAN 10's frames on eth0 in zero-copy (tags taken off and put on
# by the stack); the kernel's side is eth1.10. virtio-net filters VLANs (as most physical NICs
# do with rx-vlan-filter on): a VID no VLAN device on the NIC registered is dropped by the
# device before XDP sees it (found here: ARP for 10.98.0.2 went unanswered). The runtime
# registers it with a VLAN device of its own, left down, and removes it at the end.
vconfig add eth1 10 > /dev/null
ip addr add 10.98.0.1/24 dev eth1.10
ip link set eth1.10 up
if serve echo-server --addr 10.98.0.2/24 --vlan 10 \
  && echo-check 10.98.0.2:7 --tcp 1000000 --parallel 2 --udp 100; then
  registered=$(ls /sys/class/net | grep -c '^clv.*\.10$')
  kill -TERM $server
  if wait $server && [ "$registered" -eq 1 ] && ! ls /sys/class/net | grep -q '^clv'; then
    result "ok vlan: VLAN 10 served in zero-copy (registered with the NIC's filter while it ran), every frame back"
  else
    result "FAIL vlan: did not stop cleanly"
  fi
else
  cat /tmp/server.log
  result "FAIL vlan: VLAN 10 not served in zero-copy"
  kill -KILL $server 2>/dev/null
fi
ip link del eth1.10

# The http example (hyper on corelane's streams) under a small load: 4 keep-alive connections
# of 200 requests each, every answer a whole 200.
if serve http-server --addr 10.99.0.2/24 \
  && echo-check 10.99.0.2:8080 --http 200 --parallel 4; then
  kill -TERM $server
  if wait $server; then
    result "ok http: 800 requests over 4 connections to hyper on corelane"
  else
    result "FAIL http: did not stop cleanly"
  fi
else
  result "FAIL http"
  kill -KILL $server 2>/dev/null
fi

# HTTP/3: the http3 example (h3 over corelane's QUIC) in zero-copy, checked by h3 over quinn
# on the guest kernel's UDP: a 1 MiB body, a 100 kB POST echoed, 4 connections of 25 requests.
if serve http3-server --addr 10.99.0.2/24 --cert-out /tmp/http3.pem \
  && h3get 10.99.0.2:4433 --ca /tmp/http3.pem; then
  kill -TERM $server
  if wait $server; then
    result "ok http3: HTTP/3 from corelane's QUIC in zero-copy to the guest kernel's quinn"
  else
    result "FAIL http3: did not stop cleanly"
  fi
else
  result "FAIL http3"
  kill -KILL $server 2>/dev/null
fi

# A device that cannot take zero-copy (no VIRTIO_F_ACCESS_PLATFORM): a required zero-copy bind
# is refused in words that say so and what to do.
ip link set eth2 up
if echo-server --iface eth2 --addr 10.97.0.2/24 --zero-copy require --xdp-mode native \
  > /tmp/refused.log 2>&1; then
  result "FAIL refused: zero-copy on a device without it"
else
  cat /tmp/refused.log
  if grep -q "zero-copy refused" /tmp/refused.log && grep -q "iommu_platform" /tmp/refused.log; then
    result "ok refused: a device without zero-copy is refused, saying why"
  else
    result "FAIL refused: refused without saying why"
  fi
fi
# Down again: this driver leaves the NIC's transmit queue stopped after the refused bind (the
# kernel's watchdog says so every 5 s on the console), and nothing else uses it.
ip link set eth2 down

# Jumbo frames: this driver has no zero-copy multi-buffer; a required zero-copy bind at MTU
# 9000 is refused, saying so and what MTU it can serve.
ip link set eth0 mtu 9000
ip link set eth1 mtu 9000
if echo-server --iface eth0 --addr 10.99.0.2/24 --zero-copy require --xdp-mode native \
  > /tmp/jumbo.log 2>&1; then
  result "FAIL jumbo: served at MTU 9000 in zero-copy"
else
  cat /tmp/jumbo.log
  if grep -q "multi-buffer" /tmp/jumbo.log && grep -q "largest MTU" /tmp/jumbo.log; then
    result "ok jumbo: refused, naming multi-buffer and the largest MTU"
  else
    result "FAIL jumbo: refused without saying why"
  fi
fi
# The MTU the refusal names is served in zero-copy, one frame a packet.
mtu=$(sed -n 's/.*largest MTU it can serve in zero-copy is \([0-9]*\).*/\1/p' /tmp/jumbo.log)
if [ -n "$mtu" ]; then
  ip link set eth0 mtu "$mtu"
  ip link set eth1 mtu "$mtu"
  if start; then
    if echo-check 10.99.0.2:7 --tcp 2000000 --udp 50; then
      result "ok jumbo: MTU $mtu served in zero-copy"
    else
      result "FAIL jumbo: MTU $mtu started but did not echo"
    fi
    kill -TERM $server
    wait $server || result "FAIL jumbo: MTU $mtu did not stop cleanly"
  else
    result "FAIL jumbo: MTU $mtu did not start in zero-copy"
  fi
fi
ip link set eth0 mtu 1500
ip link set eth1 mtu 1500

# The kernel's own address, shared: eth0 gets the kernel's address 10.99.0.2 and a kernel
# HTTP server on port 8000 of it, corelane serves port 7 there (--shared) in zero-copy, and the
# peer (eth1, moved into a network namespace so that its traffic to 10.99.0.2 crosses the wire
# rather than the guest's own loopback) reaches both; the kernel answers its ping and ARP. The
# peer's ARP reply to corelane's request, which the kernel takes, is noted by the program, or
# the UDP echoes would find no next hop. Last, as eth1 stays in the namespace.
nsip netns add peer
nsip link set eth1 netns peer
nsip -n peer link set lo up
nsip -n peer addr add 10.99.0.1/24 dev eth1
nsip -n peer link set eth1 up
ip addr add 10.99.0.2/24 dev eth0
mkdir -p /tmp/www && echo kernel > /tmp/www/who
httpd -p 10.99.0.2:8000 -h /tmp/www
if serve echo-server --addr 10.99.0.2/24 --shared \
  && nsip netns exec peer echo-check 10.99.0.2:7 --tcp 1000,2000000 --parallel 2 --udp 100 \
  && [ "$(nsip netns exec peer wget -q -O - http://10.99.0.2:8000/who)" = kernel ] \
  && nsip netns exec peer ping -c 1 -W 5 10.99.0.2 > /dev/null; then
  kill -TERM $server
  if wait $server && grep -q "shared with the kernel: 10.99.0.2" /tmp/server.log; then
    result "ok shared: corelane's port 7 and the kernel's HTTP on the kernel's address, in zero-copy"
  else
    result "FAIL shared: did not stop cleanly"
  fi
else
  result "FAIL shared: the kernel's address not shared in zero-copy"
  stop_and_report
fi

# The same on VLAN 10: the kernel's address 10.98.0.2 on its VLAN device eth0.10 (an address
# the kernel holds on another interface than the one corelane serves is its own there too),
# corelane serving VLAN 10 of eth0 with --shared.
nsip -n peer link add link eth1 name eth1.10 type vlan id 10
nsip -n peer addr add 10.98.0.1/24 dev eth1.10
nsip -n peer link set eth1.10 up
vconfig add eth0 10 > /dev/null
ip addr add 10.98.0.2/24 dev eth0.10
ip link set eth0.10 up
httpd -p 10.98.0.2:8000 -h /tmp/www
if serve echo-server --addr 10.98.0.2/24 --vlan 10 --shared \
  && nsip netns exec peer echo-check 10.98.0.2:7 --tcp 1000000 --udp 50 \
  && [ "$(nsip netns exec peer wget -q -O - http://10.98.0.2:8000/who)" = kernel ] \
  && nsip netns exec peer ping -c 1 -W 5 10.98.0.2 > /dev/null; then
  kill -TERM $server
  if wait $server; then
    result "ok shared vlan: corelane's port 7 and the kernel's HTTP on the kernel's VLAN address, in zero-copy"
  else
    result "FAIL shared vlan: did not stop cleanly"
  fi
else
  result "FAIL shared vlan: the kernel's VLAN address not shared in zero-copy"
  stop_and_report
fi

if [ $fails -eq 0 ]; then
  echo "corelane-vm: PASS"
else
  echo "corelane-vm: FAILED ($fails)"
fi
poweroff -f
