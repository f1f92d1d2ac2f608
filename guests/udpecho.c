/*
 * udpecho: sends every UDP datagram to its IP and PORT on net device
 * "service0" back to where it came from (addresses and ports swapped, the
 * payload unchanged).
 *
 *   udpecho.hvt IP PORT [COUNT]      COUNT 0 (default) = forever
 *
 * Replies (and ARP replies) are queued with pyvmm_net_queue while the
 * waiting frames are drained, and one pyvmm_net_flush follows each batch.
 * After COUNT echoes it prints `echoed: N` and SUCCESS (exit 0).  Lines
 * before that: MAC, MTU, IP, path, ready.
 */
#include "netproto.h"

GUEST_MANIFEST(MFT_NET("service0"));

#define USAGE "FAILURE: usage: udpecho.hvt IP PORT [COUNT]\n"

int solo5_app_main(const struct solo5_start_info *si)
{
    const char *p = rt_skip_spaces(si->cmdline);
    uint8_t ip[4];
    uint64_t port, count = 0;

    if (!np_parse_ip_port(&p, ip, &port))
        goto usage;
    p = rt_skip_spaces(p);
    if (*p != '\0' && !rt_parse_u64(&p, &count))
        goto usage;
    if (*rt_skip_spaces(p) != '\0')
        goto usage;

    struct np_iface ifc;
    if (!np_open(&ifc, "service0", ip))
        return SOLO5_EXIT_FAILURE;
    uint8_t *frame = ifc.frame;
    if (count != 0)
        rt_printf("ready: echoing %lu UDP datagrams to port %lu\n",
                  (unsigned long)count, (unsigned long)port);
    else
        rt_printf("ready: echoing UDP to port %lu forever\n",
                  (unsigned long)port);

    uint64_t echoed = 0, ring_full = 0;
    for (;;) {
        bool queued = false;
        for (;;) {
            size_t len = 0, out;
            if (!np_recv(&ifc, &len))
                break;
            struct np_ipv4 pkt;
            struct np_udp udp;
            if ((out = np_arp_reply(&ifc, frame, len)) != 0) {
                queued |= np_queue(&ifc, frame, out, &ring_full);
            } else if (np_ipv4_parse(&ifc, frame, len, &pkt) &&
                       np_udp_parse(&pkt, &udp, NULL) && udp.dport == port) {
                out = np_udp_echo(&ifc, frame, &pkt);
                if (np_queue(&ifc, frame, out, &ring_full)) {
                    queued = true;
                    echoed++;
                }
                if (count != 0 && echoed >= count)
                    break;
            }
        }
        if (queued)
            pyvmm_net_flush(ifc.handle);
        if (count != 0 && echoed >= count)
            break;
        solo5_yield(solo5_clock_monotonic() + 1000000000ULL, NULL);
    }

    pyvmm_net_tx_wait(ifc.handle);
    struct pyvmm_net_stats st;
    pyvmm_net_stats(ifc.handle, &st);
    rt_printf("echoed: %lu\n", (unsigned long)echoed);
    rt_printf("kicks: %lu\n", (unsigned long)st.kicks);
    rt_printf("ring_full: %lu\n", (unsigned long)ring_full);
    rt_puts("SUCCESS\n");
    return SOLO5_EXIT_SUCCESS;

usage:
    rt_puts(USAGE);
    return SOLO5_EXIT_FAILURE;
}
