#!/usr/bin/env bash
# The main job: a corelane echo server on a fresh veth pair between two network namespaces,
# loaded by kernel TCP clients in the peer namespace, with the results printed. Run as root.
#
# Usage: scripts/demo.sh [MiB per stream, default 256] [streams, default 4]
set -euo pipefail
cd "$(dirname "$0")/.."
mib=${1:-256}
streams=${2:-4}
bash scripts/install-deps.sh
cargo build --locked --release --example echo --example http
cargo build --locked --release --example http3 --features h3
srv=cldemo-srv-$$ cli=cldemo-cli-$$
cleanup() {
  [ -n "${pid:-}" ] && kill -INT "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  ip netns del "$srv" 2>/dev/null || true
  ip netns del "$cli" 2>/dev/null || true
}
trap cleanup EXIT
ip netns add "$srv"; ip netns add "$cli"
# Two queues each way: kernel sockets spread over them, one corelane core serves each.
ip link add cl-srv netns "$srv" numrxqueues 2 numtxqueues 2 type veth \
  peer name cl-cli netns "$cli" numrxqueues 2 numtxqueues 2
ip -n "$srv" addr add 10.99.0.1/24 dev cl-srv
ip -n "$cli" addr add 10.99.0.2/24 dev cl-cli
for ns in "$srv" "$cli"; do ip -n "$ns" link set lo up; done
ip -n "$srv" link set cl-srv up; ip -n "$cli" link set cl-cli up
ip netns exec "$cli" ethtool -K cl-cli tx off >/dev/null
log=$(mktemp)
ip netns exec "$srv" target/release/examples/echo --iface cl-srv --addr 10.99.0.3/24 >"$log" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q "echo: serving" "$log" && break; sleep 0.1; done
cat "$log"
echo
echo "== ip link while serving:"
ip -n "$srv" link show cl-srv | sed -n '1,3p'
echo
echo "== ping of the kernel's own address on the same veth:"
ip netns exec "$cli" ping -c 3 -i 0.2 -W 1 10.99.0.1 | tail -2
echo
echo "== $streams kernel TCP clients, $mib MiB each, echoed and hash-checked:"
ip netns exec "$cli" python3 - "$mib" "$streams" <<'PY'
import hashlib, os, socket, sys, threading, time
mib, streams = int(sys.argv[1]), int(sys.argv[2])
n = mib << 20
block = os.urandom(1 << 20)
res = [None] * streams
def one(i):
    s = socket.create_connection(("10.99.0.3", 7), timeout=30)
    hs, hr, got = hashlib.sha256(), hashlib.sha256(), 0
    def rd():
        nonlocal got
        while got < n:
            b = s.recv(1 << 20)
            if not b: break
            hr.update(b); got += len(b)
    t = threading.Thread(target=rd); t.start()
    for _ in range(mib):
        s.sendall(block); hs.update(block)
    t.join(); s.close()
    res[i] = (got == n and hs.digest() == hr.digest(), got)
t0 = time.time()
ts = [threading.Thread(target=one, args=(i,)) for i in range(streams)]
[t.start() for t in ts]; [t.join() for t in ts]
dt = time.time() - t0
ok = all(r[0] for r in res)
total = sum(r[1] for r in res)
print(f"streams: {streams}, echoed: {total/2**20:.0f} MiB, all hashes match: {ok}")
print(f"time: {dt:.2f} s, echo goodput: {total*8/dt/1e9:.2f} Gbit/s each way")
sys.exit(0 if ok else 1)
PY
echo
echo "== UDP echo:"
ip netns exec "$cli" python3 -c "
import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2)
s.sendto(b'corelane udp', ('10.99.0.3', 7)); print('reply:', s.recvfrom(64)[0].decode())"
echo
echo "== stopping the server (SIGINT):"
kill -INT "$pid"; wait "$pid"; pid=
tail -4 "$log"
echo
echo "== HTTP: hyper on corelane streams, loaded by wrk -t2 -c64 for 5 s:"
ip netns exec "$srv" target/release/examples/http --iface cl-srv --addr 10.99.0.3/24 >"$log" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q "http: serving" "$log" && break; sleep 0.1; done
grep "serving" "$log"
ip netns exec "$cli" curl -sS --max-time 5 http://10.99.0.3:8080/
ip netns exec "$cli" wrk -t2 -c64 -d5s http://10.99.0.3:8080/
kill -INT "$pid"; wait "$pid"; pid=
grep -E "^(core|stats|frames)" "$log"
echo
echo "== HTTP/3: the h3 crate on corelane's QUIC, fetched by aioquic on the kernel's UDP:"
ca=$(mktemp --suffix=.pem)
ip netns exec "$srv" target/release/examples/http3 --iface cl-srv --addr 10.99.0.3/24 \
  --cert-out "$ca" >"$log" 2>&1 &
pid=$!
for _ in $(seq 100); do grep -q "http3: serving" "$log" && break; sleep 0.1; done
grep "http3:" "$log" | head -2
h3() { ip netns exec "$cli" python3 scripts/h3client.py --summary --ca "$ca" "$@"; }
echo "GET / -> $(h3 https://10.99.0.3:4433/)"
echo "GET /bytes/10485760 -> $(h3 https://10.99.0.3:4433/bytes/10485760)"
echo "POST /echo, 1 MB -> $(h3 --post 1000000 https://10.99.0.3:4433/echo)"
echo "16 connections x 8 GET /bytes/10000 -> \
$(h3 --connections 16 --requests 8 https://10.99.0.3:4433/bytes/10000)"
kill -INT "$pid"; wait "$pid"; pid=
rm -f "$ca"
grep -E "^(core|stats|frames)" "$log" || true
echo
echo "== ip link after exit (no xdp line expected):"
ip -n "$srv" link show cl-srv | sed -n '1,3p'
