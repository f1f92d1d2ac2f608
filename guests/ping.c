/*
 * ping: answers ARP requests for its IPv4 address and ICMP echo requests
 * sent to it, on net device "service0".
 *   ping.hvt [IP [COUNT]]    default IP 10.0.0.2, COUNT 0 (= forever)
 * After COUNT echo replies it prints SUCCESS and exits 0.  Frames of any
 * size up to MTU + 14 bytes are accepted; everything else is ignored.
 */
#include "rt.h"

GUEST_MANIFEST(MFT_NET("service0"));

#define ETH_HLEN 14
#define ETHERTYPE_IPV4 0x0800
#define ETHERTYPE_ARP 0x0806
#define ARP_LEN 28
#define IP_PROTO_ICMP 1
#define ICMP_ECHO_REPLY 0
#define ICMP_ECHO_REQUEST 8

static uint8_t my_mac[6];
static uint8_t my_ip[4];
static solo5_handle_t net;

static uint16_t get16(const uint8_t *p)
{
    return (uint16_t)(p[0] << 8 | p[1]);
}

static void put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)(v >> 8);
    p[1] = (uint8_t)v;
}

/* The Internet checksum (RFC 1071) of len bytes. */
static uint16_t inet_checksum(const uint8_t *p, size_t len)
{
    uint64_t sum = 0;
    for (; len >= 2; p += 2, len -= 2)
        sum += get16(p);
    if (len == 1)
        sum += (uint32_t)p[0] << 8;
    while (sum >> 16)
        sum = (sum & 0xffff) + (sum >> 16);
    return (uint16_t)~sum;
}

static bool parse_ip(const char **s, uint8_t ip[4])
{
    const char *p = *s;
    for (int i = 0; i < 4; i++) {
        uint64_t v;
        if (!rt_parse_u64(&p, &v) || v > 255)
            return false;
        ip[i] = (uint8_t)v;
        if (i < 3 && *p++ != '.')
            return false;
    }
    *s = p;
    return true;
}

static bool send(const uint8_t *frame, size_t len)
{
    solo5_result_t r = solo5_net_write(net, frame, len);
    if (r != SOLO5_R_OK) {
        rt_printf("ping: net_write failed (%d)\n", (int)r);
        return false;
    }
    return true;
}

/* An ARP request for our address: answer in place. */
static bool handle_arp(uint8_t *f, size_t len)
{
    uint8_t *a = f + ETH_HLEN;
    if (len < ETH_HLEN + ARP_LEN)
        return false;
    if (get16(a) != 1 || get16(a + 2) != ETHERTYPE_IPV4 || a[4] != 6 ||
            a[5] != 4 || get16(a + 6) != 1 || memcmp(a + 24, my_ip, 4) != 0)
        return false;

    memcpy(f, a + 8, 6);            /* to the sender */
    memcpy(f + 6, my_mac, 6);
    put16(a + 6, 2);                /* reply */
    memcpy(a + 18, a + 8, 10);      /* target = sender (MAC + IP) */
    memcpy(a + 8, my_mac, 6);       /* sender = us */
    memcpy(a + 14, my_ip, 4);
    return send(f, ETH_HLEN + ARP_LEN);
}

/* An ICMP echo request to our address: turn it into the reply in place.
 * Returns true if a reply was sent. */
static bool handle_ipv4(uint8_t *f, size_t len)
{
    uint8_t *ip = f + ETH_HLEN;
    if (len < ETH_HLEN + 20 || (ip[0] >> 4) != 4)
        return false;
    size_t ihl = (size_t)(ip[0] & 15) * 4;
    size_t total = get16(ip + 2);
    if (ihl < 20 || total < ihl + 8 || ETH_HLEN + total > len)
        return false;
    if (inet_checksum(ip, ihl) != 0 || memcmp(ip + 16, my_ip, 4) != 0)
        return false;
    if (ip[9] != IP_PROTO_ICMP || (get16(ip + 6) & 0x3fff) != 0)
        return false; /* not ICMP, or a fragment */

    uint8_t *icmp = ip + ihl;
    size_t icmp_len = total - ihl;
    if (icmp[0] != ICMP_ECHO_REQUEST || icmp[1] != 0 ||
            inet_checksum(icmp, icmp_len) != 0)
        return false;

    uint8_t tmp[6];
    memcpy(f, f + 6, 6);            /* to the sender */
    memcpy(f + 6, my_mac, 6);
    memcpy(tmp, ip + 12, 4);        /* swap addresses */
    memcpy(ip + 16, tmp, 4);
    memcpy(ip + 12, my_ip, 4);
    ip[8] = 64;                     /* TTL */
    put16(ip + 10, 0);
    put16(ip + 10, inet_checksum(ip, ihl));
    icmp[0] = ICMP_ECHO_REPLY;
    put16(icmp + 2, 0);
    put16(icmp + 2, inet_checksum(icmp, icmp_len));
    return send(f, ETH_HLEN + total);
}

int solo5_app_main(const struct solo5_start_info *si)
{
    const char *p = rt_skip_spaces(si->cmdline);
    uint64_t count = 0;

    my_ip[0] = 10; my_ip[1] = 0; my_ip[2] = 0; my_ip[3] = 2;
    if (*p != '\0') {
        if (!parse_ip(&p, my_ip) || (*p != '\0' && *p != ' ')) {
            rt_puts("FAILURE: usage: ping.hvt [IP [COUNT]]\n");
            return SOLO5_EXIT_FAILURE;
        }
        p = rt_skip_spaces(p);
        if (*p != '\0' && (!rt_parse_u64(&p, &count) ||
                           *rt_skip_spaces(p) != '\0')) {
            rt_puts("FAILURE: usage: ping.hvt [IP [COUNT]]\n");
            return SOLO5_EXIT_FAILURE;
        }
    }

    struct solo5_net_info info;
    if (solo5_net_acquire("service0", &net, &info) != SOLO5_R_OK) {
        rt_puts("FAILURE: cannot acquire net device \"service0\"\n");
        return SOLO5_EXIT_FAILURE;
    }
    memcpy(my_mac, info.mac_address, 6);
    rt_printf("MAC: %02x:%02x:%02x:%02x:%02x:%02x\n", my_mac[0], my_mac[1],
              my_mac[2], my_mac[3], my_mac[4], my_mac[5]);
    rt_printf("MTU: %lu\n", (unsigned long)info.mtu);
    rt_printf("IP: %u.%u.%u.%u\n", my_ip[0], my_ip[1], my_ip[2], my_ip[3]);
    if (count != 0)
        rt_printf("answering %lu echo requests\n", (unsigned long)count);
    else
        rt_puts("answering echo requests forever\n");

    size_t frame_size = info.mtu + SOLO5_NET_HLEN;
    uint8_t *frame = rt_alloc(frame_size, 64);
    if (frame == NULL) {
        rt_puts("FAILURE: out of heap\n");
        return SOLO5_EXIT_FAILURE;
    }

    uint64_t replies = 0;
    bool warned = false;
    for (;;) {
        solo5_handle_set_t ready = 0;
        solo5_yield(solo5_clock_monotonic() + 1000000000ULL, &ready);
        bool reported = (ready & (1ULL << net)) != 0;

        /* Drain even when poll did not report the device: a frame found then
         * means the tender's ready set is wrong, which is worth a line. */
        for (;;) {
            size_t len = 0;
            solo5_result_t r = solo5_net_read(net, frame, frame_size, &len);
            if (r == SOLO5_R_AGAIN)
                break;
            if (r != SOLO5_R_OK) {
                rt_printf("FAILURE: net_read: %d\n", (int)r);
                return SOLO5_EXIT_FAILURE;
            }
            if (!reported && !warned) {
                rt_puts("ping: warning: a frame was waiting but poll did not "
                        "report the device ready\n");
                warned = true;
            }
            if (len < ETH_HLEN)
                continue;
            bool for_us = memcmp(frame, my_mac, 6) == 0;
            bool broadcast = memcmp(frame, "\xff\xff\xff\xff\xff\xff", 6) == 0;
            uint16_t type = get16(frame + 12);
            if (type == ETHERTYPE_ARP && (for_us || broadcast)) {
                handle_arp(frame, len);
            } else if (type == ETHERTYPE_IPV4 && for_us) {
                if (handle_ipv4(frame, len)) {
                    replies++;
                    if (count != 0 && replies == count) {
                        rt_printf("answered %lu echo requests\n",
                                  (unsigned long)replies);
                        rt_puts("SUCCESS\n");
                        return SOLO5_EXIT_SUCCESS;
                    }
                }
            }
        }
    }
}
