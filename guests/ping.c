/*
 * ping: answers ARP requests for its IPv4 address and ICMP echo requests
 * sent to it, on net device "service0".
 *   ping.hvt [IP [COUNT]]    default IP 10.0.0.2, COUNT 0 (= forever)
 * After COUNT echo replies it prints SUCCESS and exits 0.  Frames of any
 * size up to MTU + 14 bytes are accepted; everything else is ignored.
 * Works on either net path (shmstream rings or hypercalls, see the `path:`
 * line); replies go out with solo5_net_write, one at a time.
 */
#include "netproto.h"

GUEST_MANIFEST(MFT_NET("service0"));

#define USAGE "FAILURE: usage: ping.hvt [IP [COUNT]]\n"

int solo5_app_main(const struct solo5_start_info *si)
{
    uint64_t count = 0;
    uint8_t ip[4] = { 10, 0, 0, 2 };

    if (!np_parse_ip_count(si->cmdline, ip, &count, USAGE))
        return SOLO5_EXIT_FAILURE;

    struct np_iface ifc;
    if (!np_open(&ifc, "service0", ip))
        return SOLO5_EXIT_FAILURE;
    uint8_t *frame = ifc.frame;
    if (count != 0)
        rt_printf("answering %lu echo requests\n", (unsigned long)count);
    else
        rt_puts("answering echo requests forever\n");
    rt_puts("ready\n");

    uint64_t replies = 0;
    bool warned = false;
    for (;;) {
        solo5_handle_set_t ready = 0;
        solo5_yield(solo5_clock_monotonic() + 1000000000ULL, &ready);
        bool reported = (ready & (1ULL << ifc.handle)) != 0;

        /* Drain even when poll did not report the device: a frame found then
         * means the tender's ready set is wrong, which is worth a line. */
        for (;;) {
            size_t len = 0, out;
            if (!np_recv(&ifc, &len))
                break;
            if (!reported && !warned) {
                rt_puts("ping: warning: a frame was waiting but poll did not "
                        "report the device ready\n");
                warned = true;
            }
            struct np_ipv4 pkt;
            if ((out = np_arp_reply(&ifc, frame, len)) != 0) {
                np_send(&ifc, frame, out);
            } else if (np_ipv4_parse(&ifc, frame, len, &pkt) &&
                       (out = np_icmp_echo_reply(&ifc, frame, &pkt)) != 0) {
                if (!np_send(&ifc, frame, out))
                    continue;
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
