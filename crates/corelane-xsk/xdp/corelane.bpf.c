// SPDX-License-Identifier: (MIT OR Apache-2.0)
//
// corelane steering program.
//
// Frames for an address AND port the application owns go to the AF_XDP socket of the queue they
// arrived on; ARP for owned IPv4 addresses and NDP (neighbour solicitation/advertisement) for owned
// IPv6 addresses go there too, and so do ICMP, ICMPv6 and IPv4 and IPv6 fragments addressed to an
// owned address (the stack answers echo requests, acts on errors and reassembles fragments).
// Everything else passes to the kernel untouched, so ping, ssh and kernel listeners on the
// kernel's own addresses keep working. An address the kernel holds too (a shared address, see
// "Shared addresses") is corelane's only for the ports it owns there. A TCP segment to an owned address and a port nothing here
// serves is answered with a reset, as the host that owns the address owes it (see "Resets for
// closed ports"), and a UDP datagram to such a port with ICMP port unreachable, rate-limited
// (see "ICMP port unreachable for closed UDP ports"): by the stack while the queue has a socket
// (`closed_to_stack`), from here when it has none.
//
// A listener under a SYN flood may have its SYNs answered here: for a port whose entry in
// `tcp_ports` has PORT_COOKIES set, a bare SYN (IPv4 without IP options, or IPv6 with TCP right
// after its header) is turned into its SYN-ACK in place and sent back (XDP_TX), its sequence
// number a SYN cookie computed exactly as corelane's stack computes and checks them
// (crates/corelane-stack/src/tcp/secret.rs and cookie_syn_ack in output.rs), from the key and
// clock in `cookie_cfg`. The flood then costs the CPU it arrives on a few hundred nanoseconds
// per SYN and never reaches the AF_XDP ring, where it would crowd out real clients; the final
// ACK goes to the stack, which opens the connection from the cookie. Frames too short for the
// headers they announce
// are counted as malformed and passed: the kernel drops them as it always would.
//
// Build (the committed object is what corelane embeds; see xdp/build.sh):
//   clang -O2 -g -target bpf -I/usr/include/x86_64-linux-gnu -c corelane.bpf.c -o corelane.bpf.o

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <linux/icmpv6.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define MAX_QUEUES 64
#define MAX_ADDRS 64

// Counter slots in `stats`; corelane-xsk's `XdpCounters` reads them in this order.
enum {
	STAT_STEERED = 0,   // redirected to an AF_XDP socket
	STAT_PASSED = 1,    // given to the kernel (not ours)
	STAT_MALFORMED = 2, // truncated headers; passed to the kernel
	STAT_NO_SOCKET = 3, // ours, but no socket on this queue: passed to the kernel
	STAT_COOKIES = 4,   // SYNs answered here with a SYN cookie
	STAT_RESETS = 5,    // TCP segments to an owned address's closed port answered with a reset
			    // (here, or handed to the queue's stack to answer: closed_to_stack)
	STAT_UNREACH = 6,   // UDP datagrams to an owned address's closed port answered with ICMP
			    // (likewise)
	STAT_UNREACH_LIMITED = 7, // such datagrams dropped unanswered by the rate limit
	STAT_RESETS_LIMITED = 8,  // segments to closed ports dropped unanswered by the rate limit
	STAT_MAX = 9,
};

// Bits of a `tcp_ports` entry.
#define PORT_OWNED 1
#define PORT_COOKIES 2

// What the SYN-ACK of a cookie needs from the stack (corelane-xsk's `CookieParams`).
struct cookie_cfg {
	__u64 k0;        // SipHash key
	__u64 k1;
	__u64 epoch_ns;  // CLOCK_MONOTONIC of the stack's time zero
	__u16 mss;       // this side's MSS over IPv4
	__u16 window;    // the SYN-ACK's window field
	__u8 wscale;     // this side's window scale
	__u8 timestamps; // answer timestamps (TSval carries the peer's window scale and SACK-permitted)
	__u8 sack;       // SACK enabled
	__u8 ttl;
	__u64 ts_k0;     // SipHash key of the stack's timestamp offsets
	__u64 ts_k1;
	__u8 mac[ETH_ALEN]; // the interface's hardware address: the SYN-ACK's source
	__u16 mss6;      // this side's MSS over IPv6 (0: IPv6 SYNs are the stack's to answer)
};

// An owned address's bits. A shared address is the kernel's too: corelane takes only the TCP and
// UDP ports it owns there (and the ICMP errors about them); ARP, NDP, ping, fragments and every
// other port stay the kernel's, and a frame to an owned port with no socket to take it is passed
// to the kernel (which answers it as a closed port) rather than answered from here.
#define ADDR_OWNED 1
#define ADDR_SHARED 2

struct in6_key {
	__u8 addr[16];
};

// Owned IPv4 addresses (network byte order) -> ADDR_OWNED, with ADDR_SHARED when the kernel
// holds the address too (see "Shared addresses").
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_ADDRS);
	__type(key, __u32);
	__type(value, __u8);
} owned_v4 SEC(".maps");

// Owned IPv6 addresses -> ADDR_OWNED, with ADDR_SHARED as for IPv4.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_ADDRS);
	__type(key, struct in6_key);
	__type(value, __u8);
} owned_v6 SEC(".maps");

// What the neighbours of a shared address said in their ARP and NDP (the sender's protocol
// address, IPv4 ones as ::ffff:a.b.c.d -> its hardware address, two bytes of padding). Those
// frames are the kernel's (they pass), but corelane sends from the address too and needs its
// next hops' hardware addresses: a core whose request for a neighbour went out, and whose answer
// the kernel took, reads the answer here. LRU: a flood of made-up senders evicts old entries,
// which a core then asks for again, and never fills the table for good.
#define MAX_NEIGHBOURS 4096
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_NEIGHBOURS);
	__type(key, struct in6_key);
	__type(value, __u64);
} neighbours SEC(".maps");

// Owned TCP ports (host byte order index) -> 1 when owned.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u8);
} tcp_ports SEC(".maps");

// Owned UDP ports (host byte order index) -> 1 when owned.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, __u8);
} udp_ports SEC(".maps");

// One AF_XDP socket per receive queue, for each of two generations of the server: while a
// new process takes over from an old one (an upgrade), both have sockets on every queue. The
// entry of queue q in generation g is g * MAX_QUEUES + q.
#define GENERATIONS 2
struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, GENERATIONS * MAX_QUEUES);
	__type(key, __u32);
	__type(value, __u32);
} xsks SEC(".maps");

// Which generation gets what (one entry): `current` gets every frame, but while `split` is 1
// a TCP segment of a connection in `old_flows` goes to the generation recorded there (the old
// process keeps its established connections until it has drained them).
struct upgrade_cfg {
	__u32 current;
	__u32 split;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct upgrade_cfg);
} upgrade SEC(".maps");

// A TCP connection by the peer's address (an IPv4 one as ::ffff:a.b.c.d) and port and the
// local port (network byte order).
struct flow_key {
	__u8 addr[16];
	__be16 peer_port;
	__be16 port;
};

#define MAX_OLD_FLOWS 65536

// Connections the old generation keeps during an upgrade -> its generation.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_OLD_FLOWS);
	__type(key, struct flow_key);
	__type(value, __u32);
	__uint(map_flags, BPF_F_NO_PREALLOC);
} old_flows SEC(".maps");

// The stack's cookie parameters (one entry; mss 0 until the stack sets them).
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct cookie_cfg);
} cookie_cfg SEC(".maps");

// The interface's own hardware address, written by the loader before the program is attached
// (`set` 1). Answers built here (resets, port unreachable, SYN cookies) go only to frames sent
// to it: on a promiscuous interface (a bridge port, a capture) a frame for another host's MAC
// and an owned IP address would otherwise be answered from that host's MAC.
//
// `vid`: the 802.1Q VLAN corelane serves on this interface (0: none, untagged frames). With a
// VLAN, only frames carrying its tag are corelane's: the tag is taken off before they are judged
// (and steered to the socket untagged) and put back on what is passed on or answered from here;
// untagged frames and other VLANs' pass untouched. `svid`: the 802.1ad service VLAN the frames
// carry outside that tag (QinQ; 0: none): then only frames whose outer tag (0x88a8) carries
// `svid` and whose next tag (0x8100) carries `vid` are corelane's, and both tags come off and
// go back on together.
struct iface_cfg {
	__u8 mac[ETH_ALEN];
	__u8 set;
	__u8 pad;
	__u16 vid;
	__u16 svid;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct iface_cfg);
} iface SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

// The rate limits of the answers built here for closed ports, per CPU: a token bucket of
// UNREACH_BURST, refilled one token per millisecond (the stack's own limit for the errors it
// sends); slot RATE_UNREACH for ICMP port unreachable, RATE_RESETS for resets, so a flood of
// one kind does not silence the other.
#define UNREACH_BURST 50
#define RATE_UNREACH 0
#define RATE_RESETS 1
struct unreach_bucket {
	__u64 ms;
	__u64 tokens;
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, struct unreach_bucket);
} unreach_rate SEC(".maps");

static __always_inline void count(__u32 slot)
{
	__u64 *v = bpf_map_lookup_elem(&stats, &slot);
	if (v)
		*v += 1;
}

static __always_inline int pass(void)
{
	count(STAT_PASSED);
	return XDP_PASS;
}

static __always_inline int malformed(void)
{
	count(STAT_MALFORMED);
	return XDP_PASS;
}

// Bytes of the whole frame, every buffer of a multi-buffer frame included (data_end - data
// covers the first buffer only).
static __always_inline int frame_len(struct xdp_md *ctx)
{
	return (int)bpf_xdp_get_buff_len(ctx);
}

// True when a frame may be answered from here: sent to the interface's own address (or, before
// the loader wrote it, to any unicast address).
static __always_inline int to_iface(const struct ethhdr *eth)
{
	if (eth->h_dest[0] & 1)
		return 0;
	__u32 zero = 0;
	struct iface_cfg *c = bpf_map_lookup_elem(&iface, &zero);
	if (!c || !c->set)
		return 1;
	int same = 1;
#pragma unroll
	for (int i = 0; i < ETH_ALEN; i++)
		same &= eth->h_dest[i] == c->mac[i];
	return same;
}

// The generation every frame goes to but the old generation's TCP segments during an upgrade.
static __always_inline __u32 current_gen(void)
{
	__u32 zero = 0;
	struct upgrade_cfg *c = bpf_map_lookup_elem(&upgrade, &zero);
	return c ? c->current & 1 : 0;
}

// The receive stamp in front of a steered frame (its XDP metadata, which the kernel copies into
// the AF_XDP frame's headroom right before the packet): when this program ran, on the clock
// `CLOCK_MONOTONIC` reads, so that the runtime can tell how long the frame waited for it (after
// a sleep: what waking up costs). corelane-xsk's `RX_STAMP_MAGIC` and `rx_stamp` read it.
#define RX_STAMP_MAGIC 0x636c7374 // "clst"
struct rx_stamp {
	__u32 magic;
	__u32 pad;
	__u64 ns;
};

static __always_inline void stamp(struct xdp_md *ctx)
{
	// A driver without metadata refuses the adjustment: the frame goes unstamped.
	if (bpf_xdp_adjust_meta(ctx, -(int)sizeof(struct rx_stamp)))
		return;
	void *data = (void *)(long)ctx->data;
	struct rx_stamp *m = (void *)(long)ctx->data_meta;
	if ((void *)(m + 1) > data)
		return;
	m->magic = RX_STAMP_MAGIC;
	m->pad = 0;
	m->ns = bpf_ktime_get_ns();
}

// The socket of generation `gen` on the queue the frame arrived on.
static __always_inline int steer_to(struct xdp_md *ctx, __u32 gen)
{
	__u32 q = ctx->rx_queue_index;
	int action = q < MAX_QUEUES ? bpf_redirect_map(&xsks, gen * MAX_QUEUES + q, XDP_PASS)
				    : XDP_PASS;
	count(action == XDP_REDIRECT ? STAT_STEERED : STAT_NO_SOCKET);
	if (action == XDP_REDIRECT)
		stamp(ctx);
	return action;
}

static __always_inline int steer(struct xdp_md *ctx)
{
	return steer_to(ctx, current_gen());
}

// `k` (zeroed) for a peer with IPv4 address `saddr`: ::ffff:a.b.c.d.
static __always_inline void v4_peer(struct flow_key *k, __be32 saddr)
{
	k->addr[10] = 0xff;
	k->addr[11] = 0xff;
	__builtin_memcpy(k->addr + 12, &saddr, 4);
}

// A TCP segment of connection `k` (the peer's address filled in) from port `sport` to local
// port `dport`: to the generation that holds its connection.
static __always_inline int steer_tcp(struct xdp_md *ctx, struct flow_key *k, __be16 sport,
				     __be16 dport)
{
	__u32 zero = 0;
	struct upgrade_cfg *c = bpf_map_lookup_elem(&upgrade, &zero);
	__u32 gen = c ? c->current & 1 : 0;
	if (c && c->split) {
		k->peer_port = sport;
		k->port = dport;
		__u32 *g = bpf_map_lookup_elem(&old_flows, k);
		if (g)
			gen = *g & 1;
	}
	return steer_to(ctx, gen);
}

// A TCP segment or UDP datagram to an owned address and port is steered to the socket of the
// queue it arrived on; with no socket there, it is answered as a closed port would be (a
// reset, port unreachable) rather than passed to a kernel that does not hold the address and
// drops it. That happens when the runtime has died (its sockets closed with it: a keeper may
// hold this program for a while so that peers learn at once, see corelane-xsk's linger.rs),
// or when no core serves the queue (a misconfiguration the runtime warns of): either way
// nothing here will ever take it, and a peer should not wait for a timeout to learn so.
static __always_inline int steered_or_closed(int action)
{
	return action == XDP_REDIRECT;
}

// A frame to a closed port that passed the answer's checks and rate limit goes to the socket of
// the queue it arrived on while one is there (a live runtime): its stack answers it (the same
// reset, the same port unreachable) through the AF_XDP transmit path, which reaches every peer.
// XDP_TX does not always: a veth hands it only to a peer running an XDP program (or with GRO
// on), so a container's or a lab's default peer would wait for a timeout. With no socket (the
// runtime is gone, a keeper holds the program) it is answered from here. Returns 1 when handed.
static __always_inline int closed_to_stack(struct xdp_md *ctx)
{
	__u32 q = ctx->rx_queue_index;
	if (q >= MAX_QUEUES)
		return 0;
	return bpf_redirect_map(&xsks, current_gen() * MAX_QUEUES + q, XDP_PASS) == XDP_REDIRECT;
}

static __always_inline int port_owned(void *map, __u16 port_be)
{
	__u32 key = bpf_ntohs(port_be);
	__u8 *v = bpf_map_lookup_elem(map, &key);
	return v && *v;
}

// The address's bits (0: not owned).
static __always_inline int v4_owned(__u32 addr)
{
	__u8 *v = bpf_map_lookup_elem(&owned_v4, &addr);
	return v && (*v & ADDR_OWNED) ? *v : 0;
}

static __always_inline int v6_owned(const __u8 *addr)
{
	struct in6_key key;
	__builtin_memcpy(key.addr, addr, 16);
	__u8 *v = bpf_map_lookup_elem(&owned_v6, &key);
	return v && (*v & ADDR_OWNED) ? *v : 0;
}

// ICMP and ICMPv6: to the current generation, but while an upgrade splits the frames, an error
// quoting a TCP segment of a connection an older generation keeps (a path-MTU update, an
// unreachable peer) goes to that generation, where the connection is. The quote is the
// segment as it left here: its destination is the peer, its source port the local port.
static __always_inline int steer_icmp(struct xdp_md *ctx, __u8 proto, void *l4, void *end)
{
	__u32 zero = 0;
	struct upgrade_cfg *c = bpf_map_lookup_elem(&upgrade, &zero);
	if (!c || !c->split)
		return steer(ctx);
	__u8 *icmp = l4;
	if ((void *)(icmp + 8) > end)
		return steer(ctx);
	struct flow_key k = {};
	__be16 *ports;
	if (proto == IPPROTO_ICMP) {
		// Destination unreachable (fragmentation needed among them), time exceeded.
		if (icmp[0] != 3 && icmp[0] != 11)
			return steer(ctx);
		struct iphdr *q = (void *)(icmp + 8);
		if ((void *)(q + 1) > end || q->ihl != 5 || q->protocol != IPPROTO_TCP)
			return steer(ctx);
		ports = (void *)(q + 1);
		if ((void *)(ports + 2) > end)
			return steer(ctx);
		v4_peer(&k, q->daddr);
	} else {
		// Destination unreachable, packet too big, time exceeded.
		if (icmp[0] < 1 || icmp[0] > 3)
			return steer(ctx);
		struct ipv6hdr *q = (void *)(icmp + 8);
		if ((void *)(q + 1) > end || q->nexthdr != IPPROTO_TCP)
			return steer(ctx);
		ports = (void *)(q + 1);
		if ((void *)(ports + 2) > end)
			return steer(ctx);
		__builtin_memcpy(k.addr, &q->daddr, 16);
	}
	k.peer_port = ports[1];
	k.port = ports[0];
	__u32 *g = bpf_map_lookup_elem(&old_flows, &k);
	return steer_to(ctx, g ? *g & 1 : c->current & 1);
}

// Notes that `addr` (16 bytes, IPv4 mapped) is at `mac`, unless `mac` is a group's or zero. The
// value's last two bytes are when, in units of 2^30 ns (about a second) on the monotonic clock,
// wrapping: a core takes only a recent answer, never one a neighbour gave long ago.
static __always_inline void note_neighbour(const __u8 *addr, const __u8 *mac)
{
	if ((mac[0] & 1) || !(mac[0] | mac[1] | mac[2] | mac[3] | mac[4] | mac[5]))
		return;
	struct in6_key key;
	__builtin_memcpy(key.addr, addr, 16);
	__u64 v = 0;
	__builtin_memcpy(&v, mac, 6);
	__u16 when = (__u16)(bpf_ktime_get_ns() >> 30);
	__builtin_memcpy((__u8 *)&v + 6, &when, 2);
	bpf_map_update_elem(&neighbours, &key, &v, BPF_ANY);
}

// ---- Shared addresses ---------------------------------------------------------------------------
//
// An ICMP or ICMPv6 error to a shared address is corelane's when the segment or datagram it quotes
// left from a port corelane owns (its source port, the quote being what was sent); everything
// else ICMP (echo requests, errors about the kernel's flows, neighbour discovery) is passed.
static __always_inline int shared_icmp(struct xdp_md *ctx, __u8 proto, void *l4, void *end)
{
	__u8 *icmp = l4;
	if ((void *)(icmp + 8) > end)
		return pass();
	__u8 qproto;
	__be16 *ports;
	if (proto == IPPROTO_ICMP) {
		if (icmp[0] != 3 && icmp[0] != 11)
			return pass();
		struct iphdr *q = (void *)(icmp + 8);
		if ((void *)(q + 1) > end || q->ihl != 5)
			return pass();
		qproto = q->protocol;
		ports = (void *)(q + 1);
	} else {
		if (icmp[0] < 1 || icmp[0] > 3)
			return pass();
		struct ipv6hdr *q = (void *)(icmp + 8);
		if ((void *)(q + 1) > end)
			return pass();
		qproto = q->nexthdr;
		ports = (void *)(q + 1);
	}
	if ((void *)(ports + 2) > end)
		return pass();
	if (qproto == IPPROTO_TCP && port_owned(&tcp_ports, ports[0]))
		return steer_icmp(ctx, proto, l4, end);
	if (qproto == IPPROTO_UDP && port_owned(&udp_ports, ports[0]))
		return steer(ctx);
	return pass();
}

// Steer a TCP or UDP segment whose destination port is owned, and ICMP (echo requests, and the
// errors that tell a flow its path's MTU or that a peer is unreachable) and IPv6 fragments for an
// owned address; pass everything else.
// `peer`: the connection with the sender's address filled in (for a TCP segment).
static __always_inline int l4_steer(struct xdp_md *ctx, __u8 proto, void *l4, void *end,
				    struct flow_key *peer)
{
	if (proto == IPPROTO_ICMP || proto == IPPROTO_ICMPV6)
		return steer_icmp(ctx, proto, l4, end);
	if (proto == IPPROTO_FRAGMENT)
		return steer(ctx);
	if (proto == IPPROTO_TCP) {
		struct tcphdr *th = l4;
		if ((void *)(th + 1) > end)
			return malformed();
		return port_owned(&tcp_ports, th->dest) ? steer_tcp(ctx, peer, th->source, th->dest)
							: pass();
	}
	if (proto == IPPROTO_UDP) {
		struct udphdr *uh = l4;
		if ((void *)(uh + 1) > end)
			return malformed();
		return port_owned(&udp_ports, uh->dest) ? steer(ctx) : pass();
	}
	return pass();
}

// Writes an IPv6 header from `src` to `dst` over `len` bytes of `next` payload. Returns the
// upper-layer checksum's pseudo-header sum (RFC 8200 section 8.1), not folded.
static __always_inline __u64 write_ip6(struct ipv6hdr *ip6, const struct in6_key *src,
				       const struct in6_key *dst, __u8 next, __u16 len)
{
	__builtin_memset(ip6, 0, 4);
	ip6->version = 6;
	ip6->payload_len = bpf_htons(len);
	ip6->nexthdr = next;
	ip6->hop_limit = 64;
	__builtin_memcpy(ip6->saddr.in6_u.u6_addr8, src->addr, 16);
	__builtin_memcpy(ip6->daddr.in6_u.u6_addr8, dst->addr, 16);
	__u64 pseudo = bpf_csum_diff(0, 0, (__be32 *)&ip6->saddr, 32, 0);
	return pseudo + bpf_htons(len) + bpf_htons(next);
}

// ---- SYN cookies -------------------------------------------------------------------------

static __always_inline __u64 rotl(__u64 x, int b)
{
	return (x << b) | (x >> (64 - b));
}

#define SIPROUND                                                                               \
	do {                                                                                   \
		v0 += v1;                                                                      \
		v1 = rotl(v1, 13) ^ v0;                                                        \
		v0 = rotl(v0, 32);                                                             \
		v2 += v3;                                                                      \
		v3 = rotl(v3, 16) ^ v2;                                                        \
		v0 += v3;                                                                      \
		v3 = rotl(v3, 21) ^ v0;                                                        \
		v2 += v1;                                                                      \
		v1 = rotl(v1, 17) ^ v2;                                                        \
		v2 = rotl(v2, 32);                                                             \
	} while (0)

#define SIPCOMPRESS(m)                                                                         \
	do {                                                                                   \
		v3 ^= (m);                                                                     \
		SIPROUND;                                                                      \
		SIPROUND;                                                                      \
		v0 ^= (m);                                                                     \
	} while (0)

// SipHash-2-4 under (k0, k1) over the stack's six words (secret.rs's `words`): the local
// address as a 128-bit number, low half first, the remote one likewise (an IPv4 address is its
// 32-bit value, its high half 0), the ports, and `extra`.
static __always_inline __u64 siphash6(__u64 k0, __u64 k1, __u64 l0, __u64 l1, __u64 r0,
				      __u64 r1, __u64 ports, __u64 extra)
{
	__u64 v0 = k0 ^ 0x736f6d6570736575ULL;
	__u64 v1 = k1 ^ 0x646f72616e646f6dULL;
	__u64 v2 = k0 ^ 0x6c7967656e657261ULL;
	__u64 v3 = k1 ^ 0x7465646279746573ULL;
	SIPCOMPRESS(l0);
	SIPCOMPRESS(l1);
	SIPCOMPRESS(r0);
	SIPCOMPRESS(r1);
	SIPCOMPRESS(ports);
	SIPCOMPRESS(extra);
	SIPCOMPRESS(48ULL << 56);
	v2 ^= 0xff;
	SIPROUND;
	SIPROUND;
	SIPROUND;
	SIPROUND;
	return v0 ^ v1 ^ v2 ^ v3;
}

static __always_inline __u16 csum_fold(__u64 s)
{
	s = (s & 0xffffffff) + (s >> 32);
	s = (s & 0xffffffff) + (s >> 32);
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return ~s;
}

// A 64-bit running sum folded into the 32 bits bpf_csum_diff takes as its seed (an IPv4
// pseudo-header's two addresses alone can carry past 32 bits).
static __always_inline __u32 fold32(__u64 s)
{
	s = (s & 0xffffffff) + (s >> 32);
	s = (s & 0xffffffff) + (s >> 32);
	return (__u32)s;
}

// What the SYN said, kept across bpf_xdp_adjust_tail (which invalidates packet pointers).
struct syn_info {
	__u8 smac[ETH_ALEN];
	__u32 saddr; // IPv4, network order
	__u32 daddr;
	__u8 saddr6[16]; // IPv6
	__u8 daddr6[16];
	__u16 sport; // network order
	__u16 dport;
	__u32 isn;   // host order
	__u32 tsval; // host order
	__u16 mss;
	__u8 wscale; // 0xf: none
	__u8 sackp;
	__u8 has_ts;
};

// Writes the SYN-ACK's TCP header and its `optlen` bytes of options (4: MSS; 16: MSS,
// SACK-permitted or two NOPs, timestamps; 20: those and window scale) at `th`, checksum 0.
static __always_inline void syn_ack_tcp(struct tcphdr *th, __u8 *o, const struct syn_info *in,
					const struct cookie_cfg *c, __u16 mss, __u32 cookie,
					__u32 our_ts, const int optlen)
{
	__builtin_memset(th, 0, sizeof(struct tcphdr));
	th->source = in->dport;
	th->dest = in->sport;
	th->seq = bpf_htonl(cookie);
	th->ack_seq = bpf_htonl(in->isn + 1);
	th->doff = (sizeof(struct tcphdr) + optlen) / 4;
	th->syn = 1;
	th->ack = 1;
	th->window = bpf_htons(c->window);
	o[0] = 2;
	o[1] = 4;
	o[2] = mss >> 8;
	o[3] = mss & 0xff;
	if (optlen >= 16) {
		if (c->sack && in->sackp) {
			o[4] = 4;
			o[5] = 2;
		} else {
			o[4] = 1;
			o[5] = 1;
		}
		o[6] = 8;
		o[7] = 10;
		__u32 tv = bpf_htonl(our_ts), te = bpf_htonl(in->tsval);
		__builtin_memcpy(o + 8, &tv, 4);
		__builtin_memcpy(o + 12, &te, 4);
	}
	if (optlen == 20) {
		o[16] = 1;
		o[17] = 3;
		o[18] = 3;
		o[19] = c->wscale;
	}
}

// Rewrites the frame into the SYN-ACK over IPv4: Ethernet, IPv4, TCP with `optlen` bytes of
// options (see syn_ack_tcp).
static __always_inline int write_syn_ack(struct xdp_md *ctx, const struct syn_info *in,
					 const struct cookie_cfg *c, __u32 cookie, __u32 our_ts,
					 const int optlen)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	int want = sizeof(struct ethhdr) + sizeof(struct iphdr) + sizeof(struct tcphdr) + optlen;
	if (bpf_xdp_adjust_tail(ctx, want - frame_len(ctx)))
		return -1;
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct tcphdr *th = (void *)(ip + 1);
	__u8 *o = (void *)(th + 1);
	if ((void *)(o + optlen) > end)
		return -1;
	__builtin_memcpy(eth->h_dest, in->smac, ETH_ALEN);
	// From the interface's own address, whatever the SYN was sent to.
	__builtin_memcpy(eth->h_source, c->mac, ETH_ALEN);
	eth->h_proto = bpf_htons(ETH_P_IP);
	ip->version = 4;
	ip->ihl = 5;
	ip->tos = 0;
	ip->tot_len = bpf_htons(sizeof(struct iphdr) + sizeof(struct tcphdr) + optlen);
	ip->id = 0;
	ip->frag_off = bpf_htons(0x4000);
	ip->ttl = c->ttl ? c->ttl : 64;
	ip->protocol = IPPROTO_TCP;
	ip->check = 0;
	ip->saddr = in->daddr;
	ip->daddr = in->saddr;
	ip->check = csum_fold(bpf_csum_diff(0, 0, (__be32 *)ip, sizeof(struct iphdr), 0));
	syn_ack_tcp(th, o, in, c, c->mss, cookie, our_ts, optlen);
	__u64 pseudo = (__u64)in->saddr + in->daddr + bpf_htons(IPPROTO_TCP) +
		       bpf_htons(sizeof(struct tcphdr) + optlen);
	th->check = csum_fold(
		bpf_csum_diff(0, 0, (__be32 *)th, sizeof(struct tcphdr) + optlen, fold32(pseudo)));
	return XDP_TX;
}

// Rewrites the frame into the SYN-ACK over IPv6: Ethernet, IPv6 (no extension headers), TCP
// with `optlen` bytes of options (see syn_ack_tcp).
static __always_inline int write_syn_ack6(struct xdp_md *ctx, const struct syn_info *in,
					  const struct cookie_cfg *c, __u32 cookie, __u32 our_ts,
					  const int optlen)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	int want = sizeof(struct ethhdr) + sizeof(struct ipv6hdr) + sizeof(struct tcphdr) + optlen;
	if (bpf_xdp_adjust_tail(ctx, want - frame_len(ctx)))
		return -1;
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct ipv6hdr *ip6 = (void *)(eth + 1);
	struct tcphdr *th = (void *)(ip6 + 1);
	__u8 *o = (void *)(th + 1);
	if ((void *)(o + optlen) > end)
		return -1;
	__builtin_memcpy(eth->h_dest, in->smac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, c->mac, ETH_ALEN);
	eth->h_proto = bpf_htons(ETH_P_IPV6);
	struct in6_key src, dst;
	__builtin_memcpy(src.addr, in->daddr6, 16);
	__builtin_memcpy(dst.addr, in->saddr6, 16);
	__u64 pseudo = write_ip6(ip6, &src, &dst, IPPROTO_TCP, sizeof(struct tcphdr) + optlen);
	syn_ack_tcp(th, o, in, c, c->mss6, cookie, our_ts, optlen);
	th->check = csum_fold(
		bpf_csum_diff(0, 0, (__be32 *)th, sizeof(struct tcphdr) + optlen, fold32(pseudo)));
	return XDP_TX;
}

// The offset of the first option of `kind` among the `olen` bytes of options at `base`, or -1.
static __always_inline int find_opt(const __u8 *base, void *end, __u32 olen, __u8 kind)
{
	__u32 off = 0;
	for (int i = 0; i < 10; i++) {
		if (off >= olen || off >= 40)
			return -1;
		// Keep the mask: the verifier bounds the offset by it, not by the test above.
		barrier_var(off);
		const __u8 *p = base + (off & 63);
		if ((void *)(p + 2) > end)
			return -1;
		if (p[0] == 0)
			return -1;
		if (p[0] == kind)
			return off;
		__u32 len = p[0] == 1 ? 1 : p[1];
		if (len < 1)
			return -1;
		off += len;
	}
	return -1;
}

// The MSS values a cookie can carry (secret.rs's MSS_TABLE): the index of the largest that is
// at most `mss`, else 0.
static __always_inline __u32 mss_index(__u32 mss)
{
	const __u16 table[8] = {536, 1200, 1220, 1360, 1400, 1440, 1460, 8960};
	__u32 idx = 0;
	for (int i = 1; i < 8; i++)
		if (table[i] <= mss)
			idx = i;
	return idx;
}

// Reads the SYN at `th` into `in` (the source MAC, ports, ISN and options) when it is a bare
// SYN, sent to the interface from a unicast MAC, to a port whose cookies are on. Returns the
// program's cookie parameters, or NULL when it does not apply.
static __always_inline struct cookie_cfg *syn_read(struct ethhdr *eth, struct tcphdr *th,
						   void *end, struct syn_info *in)
{
	if ((void *)(th + 1) > end)
		return NULL;
	if (!th->syn || th->ack || th->rst || th->fin)
		return NULL;
	__u32 port = bpf_ntohs(th->dest);
	__u8 *pv = bpf_map_lookup_elem(&tcp_ports, &port);
	if (!pv || !(*pv & PORT_COOKIES))
		return NULL;
	__u32 zero = 0;
	struct cookie_cfg *c = bpf_map_lookup_elem(&cookie_cfg, &zero);
	if (!c || !c->mss)
		return NULL;
	// Never to a multicast or broadcast source, nor for a frame sent to another host.
	if ((eth->h_source[0] & 1) || !to_iface(eth))
		return NULL;
	__builtin_memcpy(in->smac, eth->h_source, ETH_ALEN);
	in->sport = th->source;
	in->dport = th->dest;
	in->isn = bpf_ntohl(th->seq);
	in->wscale = 0xf;
	// The options: MSS, window scale, SACK-permitted, timestamps, looked for one kind at a time
	// (a walk that records every kind as it goes is more paths than the verifier will follow).
	__u32 olen = th->doff * 4;
	if (olen < sizeof(struct tcphdr))
		return NULL;
	olen -= sizeof(struct tcphdr);
	__u8 *base = (void *)(th + 1);
	int at = find_opt(base, end, olen, 2);
	barrier_var(at);
	__u8 *p = base + (at & 63);
	if (at >= 0 && (void *)(p + 4) <= end && p[1] == 4)
		in->mss = ((__u16)p[2] << 8) | p[3];
	at = find_opt(base, end, olen, 3);
	barrier_var(at);
	p = base + (at & 63);
	if (at >= 0 && (void *)(p + 3) <= end && p[1] == 3)
		in->wscale = p[2] < 14 ? p[2] : 14;
	at = find_opt(base, end, olen, 4);
	barrier_var(at);
	p = base + (at & 63);
	in->sackp = at >= 0 && (void *)(p + 2) <= end && p[1] == 2;
	at = find_opt(base, end, olen, 8);
	barrier_var(at);
	p = base + (at & 63);
	if (at >= 0 && (void *)(p + 10) <= end && p[1] == 10) {
		__u32 v;
		__builtin_memcpy(&v, p + 2, 4);
		in->tsval = bpf_ntohl(v);
		in->has_ts = 1;
	}
	return c;
}

// The cookie for the SYN in `in` (secret.rs's Secret::cookie: 5 bits of the 64 s clock, 3 bits
// of MSS, 24 bits of keyed hash over the four-tuple, the peer's ISN and the clock), from the
// local address (l0, l1) to the remote one (r0, r1) as siphash6 takes them, with `our_mss`
// this side's MSS; with timestamps, the SYN-ACK's TSval in `ts`: the connection's clock
// (milliseconds plus its offset), its low 5 bits replaced by the peer's window scale and
// SACK-permitted, from 32 ms back.
static __always_inline __u32 cookie_for(const struct cookie_cfg *c, const struct syn_info *in,
					__u64 l0, __u64 l1, __u64 r0, __u64 r1, __u16 our_mss,
					__u32 *ts)
{
	__u64 now = bpf_ktime_get_ns();
	__u64 ms = now > c->epoch_ns ? (now - c->epoch_ns) / 1000000 : 0;
	__u64 tick = ms / 64000;
	__u32 mss = in->mss < our_mss ? in->mss : our_mss;
	__u64 ports = (__u64)bpf_ntohs(in->dport) << 16 | bpf_ntohs(in->sport);
	__u64 extra = 3 | (__u64)in->isn << 8 | (tick & 31) << 40;
	__u32 h = (__u32)siphash6(c->k0, c->k1, l0, l1, r0, r1, ports, extra) & 0x00ffffff;
	if (in->has_ts && c->timestamps) {
		__u32 clock = (__u32)ms + (__u32)siphash6(c->ts_k0, c->ts_k1, l0, l1, r0, r1, ports, 2);
		*ts = ((clock - 0x20) & ~0x1fU) | in->wscale | (__u32)(c->sack && in->sackp) << 4;
	}
	return (__u32)(tick & 31) << 27 | mss_index(mss) << 24 | h;
}

// Answers a bare IPv4 SYN (the caller checked the frame is IPv4 with a 20-byte header and
// TCP) to a port whose cookies are on. Returns -1 when it does not apply.
static __always_inline int syn_cookie(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct tcphdr *th = (void *)(ip + 1);
	if ((void *)(th + 1) > end)
		return -1;
	struct syn_info in = {};
	in.mss = 536; // RFC 9293's default for IPv4
	struct cookie_cfg *c = syn_read(eth, th, end, &in);
	if (!c)
		return -1;
	in.saddr = ip->saddr;
	in.daddr = ip->daddr;
	// Never to an unspecified, broadcast or multicast source (RFC 1122 section 4.2.3.10).
	__u8 first = in.saddr & 0xff; // network order: the first byte
	if (in.saddr == 0 || in.saddr == 0xffffffff || (first & 0xf0) == 0xe0)
		return -1;
	__u32 ts = 0;
	__u32 cookie = cookie_for(c, &in, bpf_ntohl(in.daddr), 0, bpf_ntohl(in.saddr), 0, c->mss, &ts);
	int r;
	if (in.has_ts && c->timestamps) {
		if (in.wscale != 0xf)
			r = write_syn_ack(ctx, &in, c, cookie, ts, 20);
		else
			r = write_syn_ack(ctx, &in, c, cookie, ts, 16);
	} else {
		r = write_syn_ack(ctx, &in, c, cookie, 0, 4);
	}
	if (r == XDP_TX)
		count(STAT_COOKIES);
	return r;
}

// An IPv6 address as siphash6 takes it: a 128-bit number, low half in `lo`, high in `hi`.
static __always_inline void v6_halves(const __u8 *a, __u64 *lo, __u64 *hi)
{
	__u64 h, l;
	__builtin_memcpy(&h, a, 8);
	__builtin_memcpy(&l, a + 8, 8);
	*hi = bpf_be64_to_cpu(h);
	*lo = bpf_be64_to_cpu(l);
}

// Answers a bare IPv6 SYN (TCP right after the IPv6 header: a SYN behind extension headers is
// the stack's) to a port whose cookies are on. Returns -1 when it does not apply.
static __always_inline int syn_cookie6(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct ipv6hdr *ip6 = (void *)(eth + 1);
	struct tcphdr *th = (void *)(ip6 + 1);
	if ((void *)(th + 1) > end || ip6->nexthdr != IPPROTO_TCP)
		return -1;
	struct syn_info in = {};
	in.mss = 1220; // RFC 8200's minimum MTU less the headers: the default for IPv6
	struct cookie_cfg *c = syn_read(eth, th, end, &in);
	if (!c || !c->mss6)
		return -1;
	__builtin_memcpy(in.saddr6, ip6->saddr.in6_u.u6_addr8, 16);
	__builtin_memcpy(in.daddr6, ip6->daddr.in6_u.u6_addr8, 16);
	// Never to a multicast or unspecified source (as for resets).
	__u32 *w = (__u32 *)in.saddr6;
	if (in.saddr6[0] == 0xff || (w[0] | w[1] | w[2] | w[3]) == 0)
		return -1;
	__u64 l0, l1, r0, r1;
	v6_halves(in.daddr6, &l0, &l1);
	v6_halves(in.saddr6, &r0, &r1);
	__u32 ts = 0;
	__u32 cookie = cookie_for(c, &in, l0, l1, r0, r1, c->mss6, &ts);
	int r;
	if (in.has_ts && c->timestamps) {
		if (in.wscale != 0xf)
			r = write_syn_ack6(ctx, &in, c, cookie, ts, 20);
		else
			r = write_syn_ack6(ctx, &in, c, cookie, ts, 16);
	} else {
		r = write_syn_ack6(ctx, &in, c, cookie, 0, 4);
	}
	if (r == XDP_TX)
		count(STAT_COOKIES);
	return r;
}

// ---- Answers built in place ------------------------------------------------------------------

// Writes a 20-byte IPv4 header from `src` to `dst` (network order) over `len` bytes of
// `proto` payload, with its checksum; `frag_off` in network order (DF or 0).
static __always_inline void write_ip4(struct iphdr *ip, __u32 src, __u32 dst, __u8 proto,
				      __u16 len, __u16 frag_off)
{
	ip->version = 4;
	ip->ihl = 5;
	ip->tos = 0;
	ip->tot_len = bpf_htons(sizeof(struct iphdr) + len);
	ip->id = 0;
	ip->frag_off = frag_off;
	ip->ttl = 64;
	ip->protocol = proto;
	ip->check = 0;
	ip->saddr = src;
	ip->daddr = dst;
	ip->check = csum_fold(bpf_csum_diff(0, 0, (__be32 *)ip, sizeof(struct iphdr), 0));
}

// ---- Resets for closed ports ----------------------------------------------------------------
//
// The host that owns an address answers for all of its ports: a TCP segment to an owned address
// and a port nothing here serves (no listener, no connection: the port is not in `tcp_ports`)
// gets a reset (RFC 9293 section 3.10.7.1): by the queue's stack while it has a socket (the
// address is wholly the server's, granted or not, so nothing of another's reaches it), else
// built in place and sent back from here (`closed_to_stack`). A reset is never answered, nor a
// frame from a multicast or broadcast MAC, nor an unspecified, broadcast or multicast source
// address; at most UNREACH_BURST resets at once and one per millisecond after that, per CPU
// (beyond that the segment is dropped). Constant work per frame.

// What the segment said, kept across bpf_xdp_adjust_tail.
struct rst_info {
	__u8 smac[ETH_ALEN];
	__u8 dmac[ETH_ALEN];
	__u16 sport; // network order
	__u16 dport;
	__u32 seq; // host order: the reset's sequence number
	__u32 ack; // host order: its acknowledgment number, when `has_ack`
	__u8 has_ack;
};

// Reads the segment at `th` (`seglen` bytes of TCP header and data) into `in`. Returns -1 when
// it must not be answered.
static __always_inline int rst_read(struct ethhdr *eth, struct tcphdr *th, __u32 seglen,
				    struct rst_info *in)
{
	// Not to a multicast or broadcast source, nor for a frame sent to a group address or to
	// another host (the answer's source would be that address).
	if (th->rst || (eth->h_source[0] & 1) || !to_iface(eth))
		return -1;
	__u32 doff = th->doff * 4;
	if (doff < sizeof(struct tcphdr) || seglen < doff)
		return -1;
	__builtin_memcpy(in->smac, eth->h_source, ETH_ALEN);
	__builtin_memcpy(in->dmac, eth->h_dest, ETH_ALEN);
	in->sport = th->source;
	in->dport = th->dest;
	if (th->ack) {
		// <SEQ=SEG.ACK><CTL=RST>
		in->seq = bpf_ntohl(th->ack_seq);
		in->has_ack = 0;
	} else {
		// <SEQ=0><ACK=SEG.SEQ+SEG.LEN><CTL=RST,ACK>
		in->seq = 0;
		in->ack = bpf_ntohl(th->seq) + (seglen - doff) + th->syn + th->fin;
		in->has_ack = 1;
	}
	return 0;
}

static __always_inline void rst_write(struct ethhdr *eth, struct tcphdr *th,
				      const struct rst_info *in)
{
	__builtin_memcpy(eth->h_dest, in->smac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, in->dmac, ETH_ALEN);
	__builtin_memset(th, 0, sizeof(struct tcphdr));
	th->source = in->dport;
	th->dest = in->sport;
	th->seq = bpf_htonl(in->seq);
	th->doff = sizeof(struct tcphdr) / 4;
	th->rst = 1;
	if (in->has_ack) {
		th->ack = 1;
		th->ack_seq = bpf_htonl(in->ack);
	}
}

// One token from this CPU's bucket `key`, or 0 when it is empty (counted in `limited`).
static __always_inline int rate_allowed(__u32 key, __u32 limited)
{
	struct unreach_bucket *b = bpf_map_lookup_elem(&unreach_rate, &key);
	if (!b)
		return 0;
	__u64 ms = bpf_ktime_get_ns() / 1000000;
	__u64 tokens = b->ms == 0 ? UNREACH_BURST : b->tokens + (ms - b->ms);
	if (tokens > UNREACH_BURST)
		tokens = UNREACH_BURST;
	b->ms = ms;
	if (tokens == 0) {
		b->tokens = 0;
		count(limited);
		return 0;
	}
	b->tokens = tokens - 1;
	return 1;
}

// A TCP segment in an IPv4 frame with a 20-byte IP header, to a closed port.
static __always_inline int reset_v4(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct tcphdr *th = (void *)(ip + 1);
	if ((void *)(th + 1) > end)
		return malformed();
	__u32 tot = bpf_ntohs(ip->tot_len);
	struct rst_info in = {};
	if (tot < sizeof(struct iphdr) ||
	    rst_read(eth, th, tot - sizeof(struct iphdr), &in) < 0)
		return pass();
	__u32 saddr = ip->saddr, daddr = ip->daddr;
	// Never to an unspecified, broadcast or multicast source (RFC 1122 section 4.2.3.10).
	__u8 first = saddr & 0xff; // network order: the first byte
	if (saddr == 0 || saddr == 0xffffffff || (first & 0xf0) == 0xe0)
		return pass();
	if (!rate_allowed(RATE_RESETS, STAT_RESETS_LIMITED))
		return XDP_DROP;
	if (closed_to_stack(ctx)) {
		count(STAT_RESETS);
		return XDP_REDIRECT;
	}
	int want = sizeof(struct ethhdr) + sizeof(struct iphdr) + sizeof(struct tcphdr);
	if (bpf_xdp_adjust_tail(ctx, want - frame_len(ctx)))
		return pass();
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	eth = data;
	ip = (void *)(eth + 1);
	th = (void *)(ip + 1);
	if ((void *)(th + 1) > end)
		return pass();
	rst_write(eth, th, &in);
	eth->h_proto = bpf_htons(ETH_P_IP);
	write_ip4(ip, daddr, saddr, IPPROTO_TCP, sizeof(struct tcphdr), bpf_htons(0x4000));
	__u64 pseudo = (__u64)saddr + daddr + bpf_htons(IPPROTO_TCP) +
		       bpf_htons(sizeof(struct tcphdr));
	th->check = csum_fold(
		bpf_csum_diff(0, 0, (__be32 *)th, sizeof(struct tcphdr), fold32(pseudo)));
	count(STAT_RESETS);
	return XDP_TX;
}

// A TCP segment right after the IPv6 header (no extension headers), to a closed port.
static __always_inline int reset_v6(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct ipv6hdr *ip6 = (void *)(eth + 1);
	struct tcphdr *th = (void *)(ip6 + 1);
	if ((void *)(th + 1) > end)
		return malformed();
	struct rst_info in = {};
	if (rst_read(eth, th, bpf_ntohs(ip6->payload_len), &in) < 0)
		return pass();
	struct in6_key saddr, daddr;
	__builtin_memcpy(saddr.addr, ip6->saddr.in6_u.u6_addr8, 16);
	__builtin_memcpy(daddr.addr, ip6->daddr.in6_u.u6_addr8, 16);
	// Never to a multicast or unspecified source (RFC 4443 section 2.4 (e), as for ICMPv6).
	__u32 *w = (__u32 *)saddr.addr;
	if (saddr.addr[0] == 0xff || (w[0] | w[1] | w[2] | w[3]) == 0)
		return pass();
	if (!rate_allowed(RATE_RESETS, STAT_RESETS_LIMITED))
		return XDP_DROP;
	if (closed_to_stack(ctx)) {
		count(STAT_RESETS);
		return XDP_REDIRECT;
	}
	int want = sizeof(struct ethhdr) + sizeof(struct ipv6hdr) + sizeof(struct tcphdr);
	if (bpf_xdp_adjust_tail(ctx, want - frame_len(ctx)))
		return pass();
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	eth = data;
	ip6 = (void *)(eth + 1);
	th = (void *)(ip6 + 1);
	if ((void *)(th + 1) > end)
		return pass();
	rst_write(eth, th, &in);
	eth->h_proto = bpf_htons(ETH_P_IPV6);
	__u64 pseudo = write_ip6(ip6, &daddr, &saddr, IPPROTO_TCP, sizeof(struct tcphdr));
	th->check = csum_fold(
		bpf_csum_diff(0, 0, (__be32 *)th, sizeof(struct tcphdr), fold32(pseudo)));
	count(STAT_RESETS);
	return XDP_TX;
}

// ---- ICMP port unreachable for closed UDP ports -----------------------------------------------
//
// A UDP datagram to an owned address and a port nothing here serves is answered with ICMP
// destination unreachable, port unreachable (RFC 1122 section 4.1.3.1; RFC 4443 section 3.1,
// code 4), built in place: the frame keeps the datagram's IP header and the first 8 bytes after
// it as the quote (enough for the sender to find its socket), and grows the new headers in front.
// Never to a multicast or broadcast source or an unspecified one (RFC 1812 section 4.3.2.7, RFC
// 4443 section 2.4 (e)), and at most UNREACH_BURST at once and one per millisecond after that, per
// CPU; beyond that the datagram is dropped. Constant work per frame.

// Bytes of the datagram the answer quotes after its IP header: the UDP header.
#define QUOTE_L4 8

// Reshapes the frame into an answer to its sender: keeps the Ethernet header and the `quote`
// bytes after it, makes room for `grow` bytes of new headers between the two, swaps the MAC
// addresses and sets the EtherType to `proto`. Returns 0, or -1 when the frame cannot be
// reshaped (the caller passes it on).
static __always_inline int answer_frame(struct xdp_md *ctx, int quote, int grow, __u16 proto)
{
	struct ethhdr *eth = (void *)(long)ctx->data;
	if ((void *)(eth + 1) > (void *)(long)ctx->data_end)
		return -1;
	__u8 smac[ETH_ALEN], dmac[ETH_ALEN];
	__builtin_memcpy(smac, eth->h_source, ETH_ALEN);
	__builtin_memcpy(dmac, eth->h_dest, ETH_ALEN);
	if (bpf_xdp_adjust_tail(ctx, (int)sizeof(struct ethhdr) + quote - frame_len(ctx)))
		return -1;
	if (bpf_xdp_adjust_head(ctx, -grow))
		return -1;
	eth = (void *)(long)ctx->data;
	if ((void *)(eth + 1) > (void *)(long)ctx->data_end)
		return -1;
	__builtin_memcpy(eth->h_dest, smac, ETH_ALEN);
	__builtin_memcpy(eth->h_source, dmac, ETH_ALEN);
	eth->h_proto = bpf_htons(proto);
	return 0;
}

// A UDP datagram in an IPv4 frame with a 20-byte IP header, to a closed port.
static __always_inline int unreachable_v4(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = (void *)(eth + 1);
	struct udphdr *uh = (void *)(ip + 1);
	if ((void *)(uh + 1) > end)
		return malformed();
	__u32 saddr = ip->saddr, daddr = ip->daddr;
	__u8 first = saddr & 0xff; // network order: the first byte
	if ((eth->h_source[0] & 1) || !to_iface(eth) || saddr == 0 || saddr == 0xffffffff ||
	    (first & 0xf0) == 0xe0)
		return pass();
	if (!rate_allowed(RATE_UNREACH, STAT_UNREACH_LIMITED))
		return XDP_DROP;
	if (closed_to_stack(ctx)) {
		count(STAT_UNREACH);
		return XDP_REDIRECT;
	}
	// The new IP and ICMP headers go between the Ethernet header and the quote.
	int quote = sizeof(struct iphdr) + QUOTE_L4;
	if (answer_frame(ctx, quote, sizeof(struct iphdr) + 8, ETH_P_IP))
		return pass();
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	eth = data;
	ip = (void *)(eth + 1);
	__u8 *icmp = (void *)(ip + 1);
	if ((void *)(icmp + 8 + quote) > end)
		return pass();
	write_ip4(ip, daddr, saddr, IPPROTO_ICMP, 8 + quote, 0);
	__builtin_memset(icmp, 0, 8);
	icmp[0] = 3; // destination unreachable
	icmp[1] = 3; // port unreachable
	__u16 sum = csum_fold(bpf_csum_diff(0, 0, (__be32 *)icmp, 8 + sizeof(struct iphdr) + QUOTE_L4, 0));
	__builtin_memcpy(icmp + 2, &sum, 2);
	count(STAT_UNREACH);
	return XDP_TX;
}

// A UDP datagram right after the IPv6 header (no extension headers), to a closed port.
static __always_inline int unreachable_v6(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct ipv6hdr *ip6 = (void *)(eth + 1);
	struct udphdr *uh = (void *)(ip6 + 1);
	if ((void *)(uh + 1) > end)
		return malformed();
	struct in6_key saddr, daddr;
	__builtin_memcpy(saddr.addr, ip6->saddr.in6_u.u6_addr8, 16);
	__builtin_memcpy(daddr.addr, ip6->daddr.in6_u.u6_addr8, 16);
	__u64 s_hi, s_lo;
	__builtin_memcpy(&s_hi, saddr.addr, 8);
	__builtin_memcpy(&s_lo, saddr.addr + 8, 8);
	if ((eth->h_source[0] & 1) || !to_iface(eth) || saddr.addr[0] == 0xff ||
	    (s_hi == 0 && s_lo == 0))
		return pass();
	if (!rate_allowed(RATE_UNREACH, STAT_UNREACH_LIMITED))
		return XDP_DROP;
	if (closed_to_stack(ctx)) {
		count(STAT_UNREACH);
		return XDP_REDIRECT;
	}
	int quote = sizeof(struct ipv6hdr) + QUOTE_L4;
	if (answer_frame(ctx, quote, sizeof(struct ipv6hdr) + 8, ETH_P_IPV6))
		return pass();
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	eth = data;
	ip6 = (void *)(eth + 1);
	__u8 *icmp = (void *)(ip6 + 1);
	if ((void *)(icmp + 8 + quote) > end)
		return pass();
	__u64 pseudo = write_ip6(ip6, &daddr, &saddr, IPPROTO_ICMPV6, 8 + quote);
	__builtin_memset(icmp, 0, 8);
	icmp[0] = 1; // destination unreachable
	icmp[1] = 4; // port unreachable
	__u16 sum = csum_fold(bpf_csum_diff(0, 0, (__be32 *)icmp, 8 + sizeof(struct ipv6hdr) + QUOTE_L4,
					    fold32(pseudo)));
	__builtin_memcpy(icmp + 2, &sum, 2);
	count(STAT_UNREACH);
	return XDP_TX;
}

// A TCP segment in an IPv4 frame with a 20-byte header, from the frame's current bounds.
// `shared`: the address is the kernel's too, which answers for ports corelane does not take.
static __always_inline int tcp_steer(struct xdp_md *ctx, int shared)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct iphdr *ip = data + sizeof(struct ethhdr);
	struct tcphdr *th = (void *)(ip + 1);
	if ((void *)(th + 1) > end)
		return malformed();
	if (!port_owned(&tcp_ports, th->dest))
		return shared ? pass() : reset_v4(ctx);
	struct flow_key k = {};
	v4_peer(&k, ip->saddr);
	int action = steer_tcp(ctx, &k, th->source, th->dest);
	if (steered_or_closed(action))
		return XDP_REDIRECT;
	return shared ? XDP_PASS : reset_v4(ctx);
}

// A TCP segment right after the IPv6 header, from fresh pointers (the frame may have been
// resized by a SYN cookie's attempt): steered, or answered as for a closed port.
static __always_inline int tcp6_steer(struct xdp_md *ctx, int shared)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ipv6hdr *ip6 = data + sizeof(struct ethhdr);
	struct tcphdr *th = (void *)(ip6 + 1);
	if ((void *)(th + 1) > end)
		return malformed();
	if (!port_owned(&tcp_ports, th->dest))
		return shared ? pass() : reset_v6(ctx);
	struct flow_key k = {};
	__builtin_memcpy(k.addr, ip6->saddr.in6_u.u6_addr8, 16);
	int action = steer_tcp(ctx, &k, th->source, th->dest);
	if (steered_or_closed(action))
		return XDP_REDIRECT;
	return shared ? XDP_PASS : reset_v6(ctx);
}

// ARP for IPv4 over Ethernet: hardware type, protocol type, lengths, opcode, then sender
// hardware/protocol address and target hardware/protocol address.
struct arp_eth_ipv4 {
	__be16 htype;
	__be16 ptype;
	__u8 hlen;
	__u8 plen;
	__be16 oper;
	__u8 sha[ETH_ALEN];
	__u8 spa[4];
	__u8 tha[ETH_ALEN];
	__u8 tpa[4];
} __attribute__((packed));

static __always_inline int handle_arp(struct xdp_md *ctx, void *l3, void *end)
{
	struct arp_eth_ipv4 *arp = l3;
	if ((void *)(arp + 1) > end)
		return malformed();
	if (arp->htype != bpf_htons(1) || arp->ptype != bpf_htons(ETH_P_IP) || arp->hlen != 6 ||
	    arp->plen != 4)
		return pass();
	__u32 tpa;
	__builtin_memcpy(&tpa, arp->tpa, 4);
	int owned = v4_owned(tpa);
	if (owned & ADDR_SHARED) {
		// The kernel's to answer. What a reply's sender says of itself is noted for corelane
		// (the answers to the requests a core sends from the address, which the kernel takes);
		// a request says only what its sender claims, from any source, and is not.
		if (arp->oper != bpf_htons(2))
			return pass();
		struct in6_key sender = {};
		sender.addr[10] = 0xff;
		sender.addr[11] = 0xff;
		__builtin_memcpy(sender.addr + 12, arp->spa, 4);
		note_neighbour(sender.addr, arp->sha);
		return pass();
	}
	return owned ? steer(ctx) : pass();
}

static __always_inline int handle_ipv4(struct xdp_md *ctx, void *l3, void *end)
{
	struct iphdr *ip = l3;
	if ((void *)(ip + 1) > end)
		return malformed();
	if (ip->version != 4 || ip->ihl < 5)
		return malformed();
	int owned = v4_owned(ip->daddr);
	if (!owned)
		return pass();
	int shared = owned & ADDR_SHARED;
	// Fragments of datagrams to owned addresses: the stack reassembles them (the kernel, for
	// a shared address: a fragment does not say its port).
	if (ip->frag_off & bpf_htons(0x3fff))
		return shared ? pass() : steer(ctx);
	void *l4 = l3 + ip->ihl * 4;
	if (l4 > end)
		return malformed();
	if (ip->protocol == IPPROTO_UDP && ip->ihl == 5) {
		struct udphdr *uh = l4;
		if ((void *)(uh + 1) > end)
			return malformed();
		if (!port_owned(&udp_ports, uh->dest))
			return shared ? pass() : unreachable_v4(ctx);
		if (steered_or_closed(steer(ctx)))
			return XDP_REDIRECT;
		return shared ? XDP_PASS : unreachable_v4(ctx);
	}
	if (ip->protocol == IPPROTO_TCP && ip->ihl == 5) {
		if (syn_cookie(ctx) == XDP_TX)
			return XDP_TX;
		// Not answered here: steered as any segment (from fresh pointers, as the frame may
		// have been resized).
		return tcp_steer(ctx, shared);
	}
	if (shared && ip->protocol == IPPROTO_ICMP)
		return shared_icmp(ctx, IPPROTO_ICMP, l4, end);
	// A shared address's other protocols are the kernel's.
	if (shared && ip->protocol != IPPROTO_TCP && ip->protocol != IPPROTO_UDP)
		return pass();
	struct flow_key k = {};
	v4_peer(&k, ip->saddr);
	return l4_steer(ctx, ip->protocol, l4, end, &k);
}

// Neighbour discovery: the 8-byte ICMPv6 header (type, code, checksum, flags/reserved word) is
// followed by the target address.
struct nd_target {
	__u8 addr[16];
};

static __always_inline int handle_ipv6(struct xdp_md *ctx, void *l3, void *end)
{
	struct ipv6hdr *ip6 = l3;
	if ((void *)(ip6 + 1) > end)
		return malformed();
	if (ip6->version != 6)
		return malformed();
	void *l4 = (void *)(ip6 + 1);
	if (ip6->nexthdr == IPPROTO_ICMPV6) {
		struct icmp6hdr *icmp = l4;
		if ((void *)(icmp + 1) > end)
			return malformed();
		// 135: neighbour solicitation, 136: neighbour advertisement. The rest (echo,
		// errors) is the stack's when addressed to an owned address. A shared address's
		// neighbour discovery and ping are the kernel's.
		int dst = v6_owned(ip6->daddr.in6_u.u6_addr8);
		if (icmp->icmp6_type != 135 && icmp->icmp6_type != 136) {
			if (dst & ADDR_SHARED)
				return shared_icmp(ctx, IPPROTO_ICMPV6, l4, end);
			return dst ? steer(ctx) : pass();
		}
		struct nd_target *nd = (void *)(icmp + 1);
		if ((void *)(nd + 1) > end)
			return malformed();
		int target = v6_owned(nd->addr);
		if ((target && !(target & ADDR_SHARED)) || (dst && !(dst & ADDR_SHARED)))
			return steer(ctx);
		// To or about a shared address: the kernel's, and what a solicited advertisement says
		// of its target is noted for corelane (its target link-layer option, when it comes
		// first).
		// Only a solicited advertisement is noted, and only one that passes RFC 4861 7.1.2's
		// checks a program can make: hop limit 255 (it was not routed), code 0, its target
		// not a group's (the checksum is the kernel's to check; a forged one needs to be on
		// the link, and the answer it could plant is the one its sender could give).
		if ((target | dst) & ADDR_SHARED) {
			__u8 *opt = (void *)(nd + 1);
			if ((void *)(opt + 8) > end || opt[1] != 1)
				return pass();
			__u8 solicited = ((__u8 *)icmp)[4] & 0x40;
			if (icmp->icmp6_type == 136 && opt[0] == 2 && ip6->hop_limit == 255 &&
			    icmp->icmp6_code == 0 && solicited && nd->addr[0] != 0xff)
				note_neighbour(nd->addr, opt + 2);
		}
		return pass();
	}
	int owned = v6_owned(ip6->daddr.in6_u.u6_addr8);
	if (!owned)
		return pass();
	int shared = owned & ADDR_SHARED;
	if (ip6->nexthdr == IPPROTO_TCP) {
		if (syn_cookie6(ctx) == XDP_TX)
			return XDP_TX;
		return tcp6_steer(ctx, shared);
	}
	if (ip6->nexthdr == IPPROTO_UDP) {
		struct udphdr *uh = l4;
		if ((void *)(uh + 1) > end)
			return malformed();
		if (!port_owned(&udp_ports, uh->dest))
			return shared ? pass() : unreachable_v6(ctx);
		if (steered_or_closed(steer(ctx)))
			return XDP_REDIRECT;
		return shared ? XDP_PASS : unreachable_v6(ctx);
	}
	// A shared address's extension headers and fragments are the kernel's.
	if (shared)
		return pass();
	struct flow_key k = {};
	__builtin_memcpy(k.addr, ip6->saddr.in6_u.u6_addr8, 16);
	return l4_steer(ctx, ip6->nexthdr, l4, end, &k);
}

// A global function (neither static nor inlined): the verifier checks it once, on its own,
// instead of once for each of the two places the program calls it (untagged frames, and tagged
// ones with their tags off): the program is half as long and loads in about a quarter of the time.
__attribute__((noinline)) int steer_untagged(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return malformed();
	void *l3 = (void *)(eth + 1);
	switch (bpf_ntohs(eth->h_proto)) {
	case ETH_P_ARP:
		return handle_arp(ctx, l3, end);
	case ETH_P_IP:
		return handle_ipv4(ctx, l3, end);
	case ETH_P_IPV6:
		return handle_ipv6(ctx, l3, end);
	default:
		return pass();
	}
}

#define ETH_P_8021Q_TAG 0x8100
#define ETH_P_8021AD_TAG 0x88A8

// The VLAN served and the service VLAN around it (0: none).
static __always_inline void served_tags(__u16 *vid, __u16 *svid)
{
	__u32 zero = 0;
	struct iface_cfg *c = bpf_map_lookup_elem(&iface, &zero);
	*vid = c ? c->vid & 0x0fff : 0;
	*svid = c ? c->svid & 0x0fff : 0;
}

// Puts a tag (`tpid`, `tci`) back in front of the frame's EtherType, after its addresses.
static __always_inline int push_tag(struct xdp_md *ctx, __u16 tpid, __u16 tci)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	if (data + 2 * ETH_ALEN > end)
		return -1;
	__u8 macs[2 * ETH_ALEN];
	__builtin_memcpy(macs, data, 2 * ETH_ALEN);
	if (bpf_xdp_adjust_head(ctx, -4))
		return -1;
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	if (data + 2 * ETH_ALEN + 4 > end)
		return -1;
	__builtin_memcpy(data, macs, 2 * ETH_ALEN);
	__u16 t = bpf_htons(tpid), c = bpf_htons(tci);
	__builtin_memcpy(data + 2 * ETH_ALEN, &t, 2);
	__builtin_memcpy(data + 2 * ETH_ALEN + 2, &c, 2);
	return 0;
}

// Reads the tag at `tag` into `tci` when it has type `tpid` and carries VLAN `vid`.
static __always_inline int tag_is(__u8 *tag, void *end, __u16 tpid, __u16 vid, __u16 *tci)
{
	if ((void *)(tag + 4) > end)
		return 0;
	__u16 t;
	__builtin_memcpy(&t, tag, 2);
	if (t != bpf_htons(tpid))
		return 0;
	__builtin_memcpy(&t, tag + 2, 2);
	*tci = bpf_ntohs(t);
	return (*tci & 0x0fff) == vid;
}

// Loaded as a multi-buffer ("frags") program: a jumbo frame arrives in several buffers, of which
// the first holds every header this program reads; the answers it writes shrink the frame first
// (to its headers, dropping the other buffers), so they read the length of the whole frame.
SEC("xdp.frags")
int corelane_steer(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return malformed();
	__u16 vid, svid;
	served_tags(&vid, &svid);
	if (!vid && !svid)
		return eth->h_proto == bpf_htons(ETH_P_8021Q_TAG) ||
				       eth->h_proto == bpf_htons(ETH_P_8021AD_TAG)
			       ? pass()
			       : steer_untagged(ctx);
	// Tagged: corelane's only when the tags are the ones it serves, outermost first; they come
	// off while the frame is judged and go back on unless the frame is steered or dropped.
	__u8 *tag = (void *)&eth->h_proto;
	__u16 outer = 0, inner = 0;
	int len = 0;
	if (svid) {
		if (!tag_is(tag, end, ETH_P_8021AD_TAG, svid, &outer))
			return pass();
		tag += 4;
		len = 4;
	}
	if (vid) {
		if (!tag_is(tag, end, ETH_P_8021Q_TAG, vid, &inner))
			return pass();
		len += 4;
	}
	__u8 macs[2 * ETH_ALEN];
	__builtin_memcpy(macs, data, 2 * ETH_ALEN);
	if (bpf_xdp_adjust_head(ctx, len))
		return pass();
	data = (void *)(long)ctx->data;
	end = (void *)(long)ctx->data_end;
	if (data + 2 * ETH_ALEN > end)
		return XDP_DROP;
	__builtin_memcpy(data, macs, 2 * ETH_ALEN);
	int verdict = steer_untagged(ctx);
	if (verdict == XDP_REDIRECT || verdict == XDP_DROP)
		return verdict;
	// Passed on, or answered from here (the answer's addresses already swapped): tagged again,
	// the inner tag first so that the outer one ends up outside it.
	if (vid && push_tag(ctx, ETH_P_8021Q_TAG, inner))
		return XDP_DROP;
	if (svid && push_tag(ctx, ETH_P_8021AD_TAG, outer))
		return XDP_DROP;
	return verdict;
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
