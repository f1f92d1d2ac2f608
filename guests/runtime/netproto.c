/* Ethernet / ARP / IPv4 / ICMP / UDP helpers: see netproto.h. */
#include "netproto.h"

/* Unaligned loads of wire data. */
typedef uint32_t __attribute__((aligned(1), may_alias)) u32_unaligned;
typedef uint16_t __attribute__((aligned(1), may_alias)) u16_unaligned;

static const uint8_t broadcast_mac[ETH_ALEN] = {
    0xff, 0xff, 0xff, 0xff, 0xff, 0xff
};

uint64_t np_get_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = v << 8 | p[i];
    return v;
}

void np_put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++, v >>= 8)
        p[i] = (uint8_t)v;
}

/*
 * The sum is kept in the CPU's (little-endian) byte order: 32-bit loads
 * into a 64-bit accumulator, so no carry is lost for any realistic length.
 * RFC 1071: a one's complement sum of byte-swapped words is the byte-swapped
 * sum, so np_csum_fold swaps once at the end.
 */
uint64_t np_csum_add(uint64_t sum, const uint8_t *p, size_t len)
{
    for (; len >= 16; p += 16, len -= 16) {
        sum += *(const u32_unaligned *)p;
        sum += *(const u32_unaligned *)(p + 4);
        sum += *(const u32_unaligned *)(p + 8);
        sum += *(const u32_unaligned *)(p + 12);
    }
    for (; len >= 4; p += 4, len -= 4)
        sum += *(const u32_unaligned *)p;
    if (len >= 2) {
        sum += *(const u16_unaligned *)p;
        p += 2;
        len -= 2;
    }
    if (len == 1)
        sum += p[0];     /* the high byte of a big-endian word: low here */
    return sum;
}

uint16_t np_csum_fold(uint64_t sum)
{
    while (sum >> 16)
        sum = (sum & 0xffff) + (sum >> 16);
    uint16_t v = (uint16_t)sum;
    v = (uint16_t)(v << 8 | v >> 8);
    return (uint16_t)~v;
}

uint16_t np_checksum(const uint8_t *p, size_t len)
{
    return np_csum_fold(np_csum_add(0, p, len));
}

bool np_parse_ip(const char **s, uint8_t ip[4])
{
    const char *p = *s;
    for (int i = 0; i < 4; i++) {
        uint64_t v;
        if (*p < '0' || *p > '9' || !rt_parse_u64(&p, &v) || v > 255)
            return false;
        ip[i] = (uint8_t)v;
        if (i < 3 && *p++ != '.')
            return false;
    }
    *s = p;
    return true;
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

bool np_parse_mac(const char **s, uint8_t mac[ETH_ALEN])
{
    const char *p = *s;
    for (int i = 0; i < ETH_ALEN; i++) {
        int hi = hex_digit(p[0]), lo = hi < 0 ? -1 : hex_digit(p[1]);
        if (lo < 0)
            return false;
        mac[i] = (uint8_t)(hi << 4 | lo);
        p += 2;
        if (i < ETH_ALEN - 1 && *p++ != ':')
            return false;
    }
    *s = p;
    return true;
}

bool np_open(struct np_iface *ifc, const char *name, const uint8_t ip[4])
{
    struct solo5_net_info info;

    if (solo5_net_acquire(name, &ifc->handle, &info) != SOLO5_R_OK) {
        rt_printf("FAILURE: cannot acquire net device \"%s\"\n", name);
        return false;
    }
    memcpy(ifc->mac, info.mac_address, ETH_ALEN);
    memcpy(ifc->ip, ip, 4);
    ifc->mtu = info.mtu;
    ifc->frame_size = info.mtu + SOLO5_NET_HLEN;
    ifc->frame = rt_alloc(ifc->frame_size, 64);
    if (ifc->frame == NULL) {
        rt_puts("FAILURE: out of heap\n");
        return false;
    }
    const uint8_t *m = ifc->mac;
    rt_printf("MAC: %02x:%02x:%02x:%02x:%02x:%02x\n", m[0], m[1], m[2], m[3],
              m[4], m[5]);
    rt_printf("MTU: %lu\n", (unsigned long)ifc->mtu);
    rt_printf("IP: %u.%u.%u.%u\n", ip[0], ip[1], ip[2], ip[3]);
    rt_printf("path: %s\n",
              pyvmm_net_shm_active(ifc->handle) ? "shmstream" : "hypercall");
    return true;
}

bool np_recv(const struct np_iface *ifc, size_t *len)
{
    solo5_result_t r = solo5_net_read(ifc->handle, ifc->frame, ifc->frame_size, len);

    if (r == SOLO5_R_AGAIN)
        return false;
    if (r != SOLO5_R_OK) {
        rt_printf("FAILURE: net_read: %d\n", (int)r);
        solo5_exit(SOLO5_EXIT_FAILURE);
    }
    return true;
}

bool np_recv_zc(const struct np_iface *ifc, uint8_t **f, size_t *len)
{
    solo5_result_t r = pyvmm_net_read_zc(ifc->handle, f, len);

    if (r == SOLO5_R_AGAIN)
        return false;
    if (r != SOLO5_R_OK) {
        rt_printf("FAILURE: net_read_zc: %d\n", (int)r);
        solo5_exit(SOLO5_EXIT_FAILURE);
    }
    return true;
}

void np_recv_done(const struct np_iface *ifc)
{
    pyvmm_net_read_done(ifc->handle);
}

bool np_parse_ip_port(const char **p, uint8_t ip[4], uint64_t *port)
{
    if (!np_parse_ip(p, ip) || **p != ' ')
        return false;
    *p = rt_skip_spaces(*p);
    return rt_parse_u64(p, port) && *port != 0 && *port <= 65535;
}

bool np_parse_ip_count(const char *cmdline, uint8_t ip[4], uint64_t *count,
                       const char *usage)
{
    const char *p = rt_skip_spaces(cmdline);

    if (*p == '\0')
        return true;
    if (!np_parse_ip(&p, ip) || (*p != '\0' && *p != ' '))
        goto bad;
    p = rt_skip_spaces(p);
    if (*p != '\0' && (!rt_parse_u64(&p, count) || *rt_skip_spaces(p) != '\0'))
        goto bad;
    return true;
bad:
    rt_puts(usage);
    return false;
}

bool np_to_us(const struct np_iface *ifc, const uint8_t *f, size_t len)
{
    return len >= ETH_HLEN && memcmp(f, ifc->mac, ETH_ALEN) == 0;
}

bool np_broadcast(const uint8_t *f, size_t len)
{
    return len >= ETH_HLEN && memcmp(f, broadcast_mac, ETH_ALEN) == 0;
}

size_t np_arp_reply(const struct np_iface *ifc, uint8_t *f, size_t len)
{
    uint8_t *a = f + ETH_HLEN;

    if (len < ETH_HLEN + ARP_LEN || np_ethertype(f) != ETHERTYPE_ARP)
        return 0;
    if (!np_to_us(ifc, f, len) && !np_broadcast(f, len))
        return 0;
    if (np_get16(a) != 1 || np_get16(a + 2) != ETHERTYPE_IPV4 || a[4] != 6 ||
            a[5] != 4 || np_get16(a + 6) != 1 || memcmp(a + 24, ifc->ip, 4) != 0)
        return 0;

    memcpy(f, a + 8, ETH_ALEN);         /* to the sender */
    memcpy(f + 6, ifc->mac, ETH_ALEN);
    np_put16(a + 6, 2);                 /* reply */
    memcpy(a + 18, a + 8, 10);          /* target = sender (MAC + IP) */
    memcpy(a + 8, ifc->mac, ETH_ALEN);  /* sender = us */
    memcpy(a + 14, ifc->ip, 4);
    return ETH_HLEN + ARP_LEN;
}

bool np_ipv4_parse(const struct np_iface *ifc, uint8_t *f, size_t len,
        struct np_ipv4 *ip)
{
    uint8_t *h = f + ETH_HLEN;

    if (!np_to_us(ifc, f, len) || np_ethertype(f) != ETHERTYPE_IPV4)
        return false;
    if (len < ETH_HLEN + IPV4_HLEN || (h[0] >> 4) != 4)
        return false;
    size_t hlen = (size_t)(h[0] & 15) * 4;
    size_t total = np_get16(h + 2);
    if (hlen < IPV4_HLEN || total < hlen || ETH_HLEN + total > len)
        return false;
    if (np_checksum(h, hlen) != 0 || memcmp(h + 16, ifc->ip, 4) != 0)
        return false;
    if ((np_get16(h + 6) & 0x3fff) != 0)
        return false;                   /* a fragment */
    ip->hdr = h;
    ip->hlen = hlen;
    ip->total = total;
    ip->proto = h[9];
    ip->l4 = h + hlen;
    ip->l4_len = total - hlen;
    return true;
}

/* Reply to (ip)'s sender: MACs and IPs swapped, TTL 64, header checksum. */
static void ipv4_turn_around(const struct np_iface *ifc, uint8_t *f,
        const struct np_ipv4 *ip)
{
    uint8_t *h = ip->hdr;
    memcpy(f, f + 6, ETH_ALEN);
    memcpy(f + 6, ifc->mac, ETH_ALEN);
    memcpy(h + 16, h + 12, 4);
    memcpy(h + 12, ifc->ip, 4);
    h[8] = 64;
    np_put16(h + 10, 0);
    np_put16(h + 10, np_checksum(h, ip->hlen));
}

size_t np_icmp_echo_reply(const struct np_iface *ifc, uint8_t *f,
        struct np_ipv4 *ip)
{
    uint8_t *icmp = ip->l4;

    if (ip->proto != IP_PROTO_ICMP || ip->l4_len < 8)
        return 0;
    if (icmp[0] != ICMP_ECHO_REQUEST || icmp[1] != 0 ||
            np_checksum(icmp, ip->l4_len) != 0)
        return 0;
    ipv4_turn_around(ifc, f, ip);
    icmp[0] = ICMP_ECHO_REPLY;
    np_put16(icmp + 2, 0);
    np_put16(icmp + 2, np_checksum(icmp, ip->l4_len));
    return ETH_HLEN + ip->total;
}

/* The one's complement sum of the UDP pseudo header. */
static uint64_t pseudo_sum(const uint8_t src[4], const uint8_t dst[4],
        size_t udp_len)
{
    uint8_t ph[12];
    memcpy(ph, src, 4);
    memcpy(ph + 4, dst, 4);
    ph[8] = 0;
    ph[9] = IP_PROTO_UDP;
    np_put16(ph + 10, (uint16_t)udp_len);
    return np_csum_add(0, ph, sizeof(ph));
}

bool np_udp_parse(const struct np_ipv4 *ip, struct np_udp *udp,
        bool *bad_csum)
{
    const uint8_t *u = ip->l4;

    if (bad_csum != NULL)
        *bad_csum = false;
    if (ip->proto != IP_PROTO_UDP || ip->l4_len < UDP_HLEN)
        return false;
    size_t ulen = np_get16(u + 4);
    if (ulen < UDP_HLEN || ulen > ip->l4_len)
        return false;
    if (np_get16(u + 6) != 0) {
        uint64_t sum = pseudo_sum(ip->hdr + 12, ip->hdr + 16, ulen);
        if (np_csum_fold(np_csum_add(sum, u, ulen)) != 0) {
            if (bad_csum != NULL)
                *bad_csum = true;
            return false;
        }
    }
    udp->sport = np_get16(u);
    udp->dport = np_get16(u + 2);
    udp->payload = ip->l4 + UDP_HLEN;
    udp->len = ulen - UDP_HLEN;
    return true;
}

size_t np_udp_echo(const struct np_iface *ifc, uint8_t *f,
        const struct np_ipv4 *ip)
{
    uint8_t *u = ip->l4, port[2];
    memcpy(port, u, 2);
    memcpy(u, u + 2, 2);
    memcpy(u + 2, port, 2);
    ipv4_turn_around(ifc, f, ip);
    return ETH_HLEN + ip->total;
}

size_t np_udp_build(uint8_t *f, const uint8_t src_mac[ETH_ALEN],
        const uint8_t dst_mac[ETH_ALEN], const uint8_t src_ip[4],
        const uint8_t dst_ip[4], uint16_t sport, uint16_t dport,
        size_t payload_len, uint16_t id)
{
    uint8_t *h = f + ETH_HLEN, *u = h + IPV4_HLEN;
    size_t ulen = UDP_HLEN + payload_len;

    memcpy(f, dst_mac, ETH_ALEN);
    memcpy(f + 6, src_mac, ETH_ALEN);
    np_put16(f + 12, ETHERTYPE_IPV4);
    h[0] = 0x45;                        /* version 4, 20-byte header */
    h[1] = 0;
    np_put16(h + 2, (uint16_t)(IPV4_HLEN + ulen));
    np_put16(h + 4, id);
    np_put16(h + 6, 0x4000);            /* don't fragment */
    h[8] = 64;
    h[9] = IP_PROTO_UDP;
    np_put16(h + 10, 0);
    memcpy(h + 12, src_ip, 4);
    memcpy(h + 16, dst_ip, 4);
    np_put16(h + 10, np_checksum(h, IPV4_HLEN));
    np_put16(u, sport);
    np_put16(u + 2, dport);
    np_put16(u + 4, (uint16_t)ulen);
    np_put16(u + 6, 0);
    return ETH_HLEN + IPV4_HLEN + ulen;
}

void np_udp_set_checksum(uint8_t *f, uint64_t payload_sum)
{
    uint8_t *h = f + ETH_HLEN, *u = h + IPV4_HLEN;
    size_t ulen = np_get16(u + 4);

    np_put16(u + 6, 0);
    uint64_t sum = pseudo_sum(h + 12, h + 16, ulen);
    sum = np_csum_add(sum, u, UDP_HLEN) + payload_sum;
    uint16_t c = np_csum_fold(sum);
    np_put16(u + 6, c == 0 ? 0xffff : c);  /* 0 would mean "no checksum" */
}

bool np_send(const struct np_iface *ifc, const uint8_t *f, size_t len)
{
    solo5_result_t r = solo5_net_write(ifc->handle, f, len);
    if (r != SOLO5_R_OK) {
        rt_printf("net_write failed (%d)\n", (int)r);
        return false;
    }
    return true;
}

bool np_queue(const struct np_iface *ifc, const uint8_t *f, size_t len,
        uint64_t *ring_full)
{
    solo5_result_t r = pyvmm_net_queue(ifc->handle, f, len);
    if (r == SOLO5_R_AGAIN) {
        if (ring_full != NULL)
            (*ring_full)++;
        pyvmm_net_flush(ifc->handle);
        return np_send(ifc, f, len);
    }
    if (r != SOLO5_R_OK) {
        rt_printf("net_queue failed (%d)\n", (int)r);
        return false;
    }
    return true;
}
