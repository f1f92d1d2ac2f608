/*
 * Minimal Ethernet / ARP / IPv4 / ICMP / UDP helpers shared by the network
 * programs (ping, udpsink, udpecho, udpsend).  No state beyond struct
 * np_iface; frames are edited in place.  Byte order on the wire is big
 * endian; np_get16/np_put16 convert.
 */
#ifndef NETPROTO_H
#define NETPROTO_H

#include "rt.h"

#define ETH_HLEN 14
#define ETH_ALEN 6
#define ETHERTYPE_IPV4 0x0800
#define ETHERTYPE_ARP 0x0806
#define ARP_LEN 28
#define IPV4_HLEN 20
#define UDP_HLEN 8
#define IP_PROTO_ICMP 1
#define IP_PROTO_UDP 17
#define ICMP_ECHO_REPLY 0
#define ICMP_ECHO_REQUEST 8
/* Offset of a UDP payload in a frame with a 20-byte IPv4 header. */
#define NP_UDP_PAYLOAD (ETH_HLEN + IPV4_HLEN + UDP_HLEN)

/* One net device and our address on it. */
struct np_iface {
    solo5_handle_t handle;
    uint8_t mac[ETH_ALEN];
    uint8_t ip[4];
    size_t mtu;
    size_t frame_size;          /* mtu + ETH_HLEN: the largest frame */
    uint8_t *frame;             /* a receive buffer of frame_size bytes */
};

/* A checked IPv4 packet inside a frame (pointers into the frame). */
struct np_ipv4 {
    uint8_t *hdr;               /* the IPv4 header */
    size_t hlen;                /* its length (IHL * 4) */
    size_t total;               /* IPv4 total length */
    uint8_t proto;
    uint8_t *l4;                /* hdr + hlen */
    size_t l4_len;              /* total - hlen */
};

/* A checked UDP datagram. */
struct np_udp {
    uint16_t sport, dport;
    uint8_t *payload;
    size_t len;                 /* payload bytes */
};

static inline uint16_t np_get16(const uint8_t *p)
{
    return (uint16_t)(p[0] << 8 | p[1]);
}

static inline void np_put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

/* The 64-bit little-endian value at p (no alignment needed). */
uint64_t np_get_le64(const uint8_t *p);
void np_put_le64(uint8_t *p, uint64_t v);

/* One's complement sum (RFC 1071) of len bytes starting at an even offset
 * of the checksummed data, added to sum (unfolded; combine several such
 * sums by adding them).  np_csum_fold folds a sum and complements it: the
 * value to store in a checksum field, or 0 when checking data that
 * includes its checksum field. */
uint64_t np_csum_add(uint64_t sum, const uint8_t *p, size_t len);
uint16_t np_csum_fold(uint64_t sum);
/* The Internet checksum of len bytes. */
uint16_t np_checksum(const uint8_t *p, size_t len);

/* "a.b.c.d" at *s (advanced past it); false if malformed. */
bool np_parse_ip(const char **s, uint8_t ip[4]);
/* "xx:xx:xx:xx:xx:xx" (hex, either case) at *s; false if malformed. */
bool np_parse_mac(const char **s, uint8_t mac[ETH_ALEN]);

/* Acquire net device (name) into (ifc) with our address (ip) and print the
 * `MAC:`, `MTU:`, `IP:` and `path: shmstream|hypercall` lines.  False (and a
 * FAILURE: line) if the device cannot be acquired. */
bool np_open(struct np_iface *ifc, const char *name, const uint8_t ip[4]);

/* Read the next waiting frame into ifc->frame: true with *len set, false
 * when none is waiting; a read error ends the program (FAILURE, exit 1). */
bool np_recv(const struct np_iface *ifc, size_t *len);

/* The next waiting frame where it lies (pyvmm_net_read_zc): true with *f
 * and *len set, false when none is waiting; a read error ends the program.
 * np_recv_done gives it back; the next np_recv_zc does so by itself. */
bool np_recv_zc(const struct np_iface *ifc, uint8_t **f, size_t *len);
void np_recv_done(const struct np_iface *ifc);

/* "IP PORT" at *p (advanced past it): a port in 1..65535; false if bad. */
bool np_parse_ip_port(const char **p, uint8_t ip[4], uint64_t *port);

/* The command line "[IP [COUNT]]" of ping-like programs; on a bad one,
 * prints `usage` and returns false. */
bool np_parse_ip_count(const char *cmdline, uint8_t ip[4], uint64_t *count,
                       const char *usage);

/* Whether the frame is addressed to our MAC, or is a broadcast. */
bool np_to_us(const struct np_iface *ifc, const uint8_t *f, size_t len);
bool np_broadcast(const uint8_t *f, size_t len);
static inline uint16_t np_ethertype(const uint8_t *f)
{
    return np_get16(f + 12);
}

/* An ARP request for our IP (f: a whole frame of len bytes): rewritten in
 * place into the reply.  Returns the reply's length, 0 if the frame is not
 * such a request. */
size_t np_arp_reply(const struct np_iface *ifc, uint8_t *f, size_t len);

/* An IPv4 packet to our MAC and IP with a good header checksum, not a
 * fragment, length consistent with the frame: true and (*ip) filled in. */
bool np_ipv4_parse(const struct np_iface *ifc, uint8_t *f, size_t len,
        struct np_ipv4 *ip);

/* An ICMP echo request in (ip) (checksum checked): rewritten in place into
 * the reply (addresses swapped, TTL 64, checksums recomputed).  Returns the
 * reply frame's length, 0 if it is not an echo request. */
size_t np_icmp_echo_reply(const struct np_iface *ifc, uint8_t *f,
        struct np_ipv4 *ip);

/* A UDP datagram in (ip): length checked, checksum checked unless it is 0
 * (IPv4 allows "none").  False for anything else (*bad_csum set when only
 * the checksum is wrong, if bad_csum is not NULL). */
bool np_udp_parse(const struct np_ipv4 *ip, struct np_udp *udp,
        bool *bad_csum);

/* Turn a received UDP datagram (parsed into ip, udp) into its echo in
 * place: MACs, IPs and ports swapped, TTL 64, IPv4 checksum recomputed.
 * The UDP checksum stays valid (swapping commutes in a one's complement
 * sum).  Returns the reply frame's length. */
size_t np_udp_echo(const struct np_iface *ifc, uint8_t *f,
        const struct np_ipv4 *ip);

/* Write Ethernet, IPv4 (20 bytes, DF, TTL 64, id, header checksum) and UDP
 * headers for a payload of payload_len bytes already at f +
 * NP_UDP_PAYLOAD.  The UDP checksum is set to 0; np_udp_set_checksum fills
 * it in given the one's complement sum of the payload.  Returns the frame
 * length. */
size_t np_udp_build(uint8_t *f, const uint8_t src_mac[ETH_ALEN],
        const uint8_t dst_mac[ETH_ALEN], const uint8_t src_ip[4],
        const uint8_t dst_ip[4], uint16_t sport, uint16_t dport,
        size_t payload_len, uint16_t id);
void np_udp_set_checksum(uint8_t *f, uint64_t payload_sum);

/* Send a frame and count a failure (solo5_net_write). */
bool np_send(const struct np_iface *ifc, const uint8_t *f, size_t len);

/* Queue a frame (pyvmm_net_queue); with the TX ring full: flush and send it
 * with solo5_net_write, which waits for room.  *ring_full counts those
 * times if not NULL.  False if the frame could not be sent. */
bool np_queue(const struct np_iface *ifc, const uint8_t *f, size_t len,
        uint64_t *ring_full);

#endif
