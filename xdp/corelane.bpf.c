// SPDX-License-Identifier: (MIT OR Apache-2.0)
//
// corelane steering program.
//
// Frames for an address AND port the application owns go to the AF_XDP socket of the queue they
// arrived on; ARP for owned IPv4 addresses and NDP (neighbour solicitation/advertisement) for owned
// IPv6 addresses go there too, and so do ICMP, ICMPv6 and IPv4 and IPv6 fragments addressed to an
// owned address (the stack answers echo requests, acts on errors and reassembles fragments).
// Everything else passes to the kernel untouched, so ping, ssh and kernel listeners on the
// kernel's own addresses keep working. Frames too short for the headers they announce
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
	STAT_MAX = 4,
};

struct in6_key {
	__u8 addr[16];
};

// Owned IPv4 addresses (network byte order) -> 1.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_ADDRS);
	__type(key, __u32);
	__type(value, __u8);
} owned_v4 SEC(".maps");

// Owned IPv6 addresses -> 1.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_ADDRS);
	__type(key, struct in6_key);
	__type(value, __u8);
} owned_v6 SEC(".maps");

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

// One AF_XDP socket per receive queue.
struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, MAX_QUEUES);
	__type(key, __u32);
	__type(value, __u32);
} xsks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

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

static __always_inline int steer(struct xdp_md *ctx)
{
	int action = bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);
	count(action == XDP_REDIRECT ? STAT_STEERED : STAT_NO_SOCKET);
	return action;
}

static __always_inline int port_owned(void *map, __u16 port_be)
{
	__u32 key = bpf_ntohs(port_be);
	__u8 *v = bpf_map_lookup_elem(map, &key);
	return v && *v;
}

static __always_inline int v4_owned(__u32 addr)
{
	__u8 *v = bpf_map_lookup_elem(&owned_v4, &addr);
	return v && *v;
}

static __always_inline int v6_owned(const __u8 *addr)
{
	struct in6_key key;
	__builtin_memcpy(key.addr, addr, 16);
	__u8 *v = bpf_map_lookup_elem(&owned_v6, &key);
	return v && *v;
}

// Steer a TCP or UDP segment whose destination port is owned, and ICMP (echo requests, and the
// errors that tell a flow its path's MTU or that a peer is unreachable) and IPv6 fragments for an
// owned address; pass everything else.
static __always_inline int l4_steer(struct xdp_md *ctx, __u8 proto, void *l4, void *end)
{
	if (proto == IPPROTO_ICMP || proto == IPPROTO_ICMPV6 || proto == IPPROTO_FRAGMENT)
		return steer(ctx);
	if (proto == IPPROTO_TCP) {
		struct tcphdr *th = l4;
		if ((void *)(th + 1) > end)
			return malformed();
		return port_owned(&tcp_ports, th->dest) ? steer(ctx) : pass();
	}
	if (proto == IPPROTO_UDP) {
		struct udphdr *uh = l4;
		if ((void *)(uh + 1) > end)
			return malformed();
		return port_owned(&udp_ports, uh->dest) ? steer(ctx) : pass();
	}
	return pass();
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
	return v4_owned(tpa) ? steer(ctx) : pass();
}

static __always_inline int handle_ipv4(struct xdp_md *ctx, void *l3, void *end)
{
	struct iphdr *ip = l3;
	if ((void *)(ip + 1) > end)
		return malformed();
	if (ip->version != 4 || ip->ihl < 5)
		return malformed();
	if (!v4_owned(ip->daddr))
		return pass();
	// Fragments of datagrams to owned addresses: the stack reassembles them.
	if (ip->frag_off & bpf_htons(0x3fff))
		return steer(ctx);
	void *l4 = l3 + ip->ihl * 4;
	if (l4 > end)
		return malformed();
	return l4_steer(ctx, ip->protocol, l4, end);
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
		// errors) is the stack's when addressed to an owned address.
		if (icmp->icmp6_type != 135 && icmp->icmp6_type != 136)
			return v6_owned(ip6->daddr.in6_u.u6_addr8) ? steer(ctx) : pass();
		struct nd_target *nd = (void *)(icmp + 1);
		if ((void *)(nd + 1) > end)
			return malformed();
		if (v6_owned(nd->addr) || v6_owned(ip6->daddr.in6_u.u6_addr8))
			return steer(ctx);
		return pass();
	}
	if (!v6_owned(ip6->daddr.in6_u.u6_addr8))
		return pass();
	return l4_steer(ctx, ip6->nexthdr, l4, end);
}

SEC("xdp")
int corelane_steer(struct xdp_md *ctx)
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

char LICENSE[] SEC("license") = "Dual MIT/GPL";
