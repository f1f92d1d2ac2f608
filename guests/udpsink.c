/*
 * udpsink: counts the UDP datagrams sent to its IP and PORT on net device
 * "service0" and checks their payload pattern.
 *
 *   udpsink.hvt IP PORT [any] [EXPECTED [IDLE_MS]]
 *
 * Pattern (what the test and bench senders generate): bytes 0-7 of the
 * payload are a little-endian uint64 sequence number s, every later byte i
 * (0-based offset in the payload) is (s + i) & 0xff.  A payload shorter
 * than 8 bytes is a pattern error.  With `any`, every datagram to PORT is
 * counted and none is checked (ordinary UDP: `echo hi > /dev/udp/IP/PORT`).
 *
 * Ends when EXPECTED datagrams arrived (EXPECTED > 0), or when none arrived
 * for IDLE_MS milliseconds (default 2000) after the first one.  Frames are
 * processed in batches: every waiting frame is read before the next yield,
 * each checked where it lies (pyvmm_net_read_zc: in its RX slot, no copy).
 * ARP requests for IP are answered.  Output:
 *   MAC: .., MTU: .., IP: .., path: shmstream|hypercall, ready ...
 *   frames: N  bytes: N (payload)  pattern_errors: N  out_of_order: N
 *   elapsed_us: N (first to last datagram)  kicks: N (our TX notifications)
 *   batches: N  max_batch: N  bad_checksum: N
 *   SUCCESS (exit 0) if pattern_errors == 0, else FAILURE: ... (exit 1),
 *   the line saying what the pattern is and that `any` takes any payload
 */
#include "netproto.h"

GUEST_MANIFEST(MFT_NET("service0"));

#define USAGE "FAILURE: usage: udpsink.hvt IP PORT [any] [EXPECTED [IDLE_MS]]\n"

struct sink {
    bool check; /* the payload pattern (not with `any`) */
    uint64_t frames, bytes, pattern_errors, out_of_order, bad_checksum;
    uint64_t last_seq;
    solo5_time_t first, last;
};

/* Bytes 8.. of a payload with sequence number s. */
static bool pattern_ok(const uint8_t *p, size_t len, uint64_t s)
{
    uint8_t expect = (uint8_t)(s + 8);
    for (size_t i = 8; i < len; i++, expect++)
        if (p[i] != expect)
            return false;
    return true;
}

static void count_datagram(struct sink *k, const struct np_udp *udp)
{
    solo5_time_t now = solo5_clock_monotonic();

    if (k->frames == 0)
        k->first = now;
    k->last = now;
    k->frames++;
    k->bytes += udp->len;
    if (!k->check)
        return;
    if (udp->len < 8) {
        k->pattern_errors++;
        return;
    }
    uint64_t s = np_get_le64(udp->payload);
    if (k->frames > 1 && s <= k->last_seq)
        k->out_of_order++;
    k->last_seq = s;
    if (!pattern_ok(udp->payload, udp->len, s))
        k->pattern_errors++;
}

int solo5_app_main(const struct solo5_start_info *si)
{
    const char *p = rt_skip_spaces(si->cmdline);
    uint8_t ip[4];
    uint64_t port, expected = 0, idle_ms = 2000;

    bool check = true;

    if (!np_parse_ip_port(&p, ip, &port))
        goto usage;
    p = rt_skip_spaces(p);
    if (p[0] == 'a' && p[1] == 'n' && p[2] == 'y' && (p[3] == ' ' || p[3] == '\0')) {
        check = false;
        p = rt_skip_spaces(p + 3);
    }
    if (*p != '\0' && !rt_parse_u64(&p, &expected))
        goto usage;
    p = rt_skip_spaces(p);
    if (*p != '\0' && (!rt_parse_u64(&p, &idle_ms) || idle_ms == 0 ||
                       idle_ms > 86400000))
        goto usage;
    if (*rt_skip_spaces(p) != '\0')
        goto usage;

    struct np_iface ifc;
    if (!np_open(&ifc, "service0", ip))
        return SOLO5_EXIT_FAILURE;
    uint8_t *frame = ifc.frame;
    rt_printf("ready: counting UDP to port %lu", (unsigned long)port);
    if (expected != 0)
        rt_printf(", until %lu datagrams", (unsigned long)expected);
    rt_printf(" or %lu ms idle%s\n", (unsigned long)idle_ms,
              check ? ", checking the test pattern" : ", any payload");

    struct sink k = { .check = check };
    uint64_t batches = 0, max_batch = 0;
    const solo5_time_t idle_ns = idle_ms * 1000000ULL;
    for (;;) {
        /* The batch: everything waiting, replies flushed once at the end. */
        uint64_t n = 0;
        bool queued = false;
        for (;;) {
            size_t len = 0, out;
            uint8_t *f;
            if (!np_recv_zc(&ifc, &f, &len))
                break;
            n++;
            struct np_ipv4 pkt;
            struct np_udp udp;
            bool bad_csum;
            if (len >= ETH_HLEN && len <= ifc.frame_size &&
                    np_ethertype(f) == ETHERTYPE_ARP) {
                /* Answered from a copy: the slot goes back untouched. */
                memcpy(frame, f, len);
                if ((out = np_arp_reply(&ifc, frame, len)) != 0)
                    queued |= np_queue(&ifc, frame, out, NULL);
            } else if (np_ipv4_parse(&ifc, f, len, &pkt)) {
                if (np_udp_parse(&pkt, &udp, &bad_csum)) {
                    if (udp.dport == port)
                        count_datagram(&k, &udp);
                } else if (bad_csum) {
                    k.bad_checksum++;
                }
            }
            np_recv_done(&ifc);
            if (expected != 0 && k.frames >= expected)
                break;
        }
        if (queued)
            pyvmm_net_flush(ifc.handle);
        if (n != 0) {
            batches++;
            if (n > max_batch)
                max_batch = n;
        }
        if (expected != 0 && k.frames >= expected)
            break;

        solo5_time_t now = solo5_clock_monotonic(), deadline;
        if (k.frames == 0) {
            deadline = now + 1000000000ULL;
        } else {
            deadline = k.last + idle_ns;
            if (now >= deadline)
                break;
        }
        solo5_yield(deadline, NULL);
    }

    pyvmm_net_tx_wait(ifc.handle);
    struct pyvmm_net_stats st;
    pyvmm_net_stats(ifc.handle, &st);
    rt_printf("frames: %lu\n", (unsigned long)k.frames);
    rt_printf("bytes: %lu\n", (unsigned long)k.bytes);
    rt_printf("pattern_errors: %lu\n", (unsigned long)k.pattern_errors);
    rt_printf("out_of_order: %lu\n", (unsigned long)k.out_of_order);
    rt_printf("elapsed_us: %lu\n", (unsigned long)((k.last - k.first) / 1000));
    rt_printf("kicks: %lu\n", (unsigned long)st.kicks);
    rt_printf("batches: %lu\n", (unsigned long)batches);
    rt_printf("max_batch: %lu\n", (unsigned long)max_batch);
    rt_printf("bad_checksum: %lu\n", (unsigned long)k.bad_checksum);
    if (st.rx_dropped != 0 || st.bad_index != 0)
        rt_printf("rx_dropped: %lu\nbad_index: %lu\n",
                  (unsigned long)st.rx_dropped, (unsigned long)st.bad_index);
    if (k.pattern_errors != 0) {
        rt_printf("FAILURE: %lu pattern errors (the test pattern: a "
                  "little-endian 64-bit sequence number s, then byte i = "
                  "(s + i) & 0xff, as testkit.traffic sends; `any` after "
                  "PORT counts any UDP)\n",
                  (unsigned long)k.pattern_errors);
        return SOLO5_EXIT_FAILURE;
    }
    rt_puts("SUCCESS\n");
    return SOLO5_EXIT_SUCCESS;

usage:
    rt_puts(USAGE);
    return SOLO5_EXIT_FAILURE;
}
