/*
 * udpsend: sends COUNT UDP datagrams as fast as it can, on net device
 * "service0".
 *
 *   udpsend.hvt SRC_IP DST_IP DST_MAC PORT COUNT SIZE [BATCH]
 *
 * Each datagram goes from SRC_IP:PORT to DST_IP:PORT, Ethernet destination
 * DST_MAC (no ARP lookup), with SIZE payload bytes (8 .. MTU - 28) carrying
 * the udpsink pattern: a little-endian uint64 sequence number s (0, 1, ...)
 * in bytes 0-7, then byte i = (s + i) & 0xff.  IPv4 header checksum and UDP
 * checksum are filled in (the UDP payload's sum comes from a table indexed
 * by s & 0xff, so it costs nothing per datagram).
 *
 * Up to BATCH (default 32) frames are queued with pyvmm_net_queue, then one
 * pyvmm_net_flush; a full TX ring means flush and send that frame with
 * solo5_net_write (which waits for room).  Between batches, waiting frames
 * are read and ARP requests for SRC_IP answered.  At the end it waits until
 * the host has taken every frame (pyvmm_net_tx_wait).  Output: MAC, MTU, IP,
 * path, ready, then
 *   sent: N  elapsed_us: N  kicks: N  ring_full: N  SUCCESS
 */
#include "netproto.h"

GUEST_MANIFEST(MFT_NET("service0"));

#define USAGE "FAILURE: usage: udpsend.hvt SRC_IP DST_IP DST_MAC PORT COUNT " \
              "SIZE [BATCH]\n"
#define MAX_BATCH 65536

static bool next_ip(const char **p, uint8_t ip[4])
{
    if (!np_parse_ip(p, ip) || **p != ' ')
        return false;
    *p = rt_skip_spaces(*p);
    return true;
}

static bool next_u64(const char **p, uint64_t *v)
{
    if (!rt_parse_u64(p, v) || (**p != ' ' && **p != '\0'))
        return false;
    *p = rt_skip_spaces(*p);
    return true;
}

/* Answer ARP requests among the frames waiting; drop everything else. */
static bool serve_rx(const struct np_iface *ifc, uint8_t *frame)
{
    bool queued = false;
    for (;;) {
        size_t len = 0, out;
        solo5_result_t r = solo5_net_read(ifc->handle, frame, ifc->frame_size,
                                          &len);
        if (r != SOLO5_R_OK)
            return queued;
        if ((out = np_arp_reply(ifc, frame, len)) != 0)
            queued |= np_queue(ifc, frame, out, NULL);
    }
}

int solo5_app_main(const struct solo5_start_info *si)
{
    const char *p = rt_skip_spaces(si->cmdline);
    uint8_t src_ip[4], dst_ip[4], dst_mac[ETH_ALEN];
    uint64_t port, count, size, batch = 32;

    if (!next_ip(&p, src_ip) || !next_ip(&p, dst_ip))
        goto usage;
    if (!np_parse_mac(&p, dst_mac) || *p != ' ')
        goto usage;
    p = rt_skip_spaces(p);
    if (!next_u64(&p, &port) || port == 0 || port > 65535)
        goto usage;
    if (!next_u64(&p, &count) || !next_u64(&p, &size))
        goto usage;
    if (*p != '\0' && (!next_u64(&p, &batch) || batch == 0 ||
                       batch > MAX_BATCH))
        goto usage;
    if (*p != '\0')
        goto usage;

    struct np_iface ifc;
    if (!np_open(&ifc, "service0", src_ip))
        return SOLO5_EXIT_FAILURE;
    if (size < 8 || size > ifc.mtu - IPV4_HLEN - UDP_HLEN) {
        rt_printf("FAILURE: SIZE must be 8..%lu\n",
                  (unsigned long)(ifc.mtu - IPV4_HLEN - UDP_HLEN));
        return SOLO5_EXIT_FAILURE;
    }
    uint8_t *frame = rt_alloc(ifc.frame_size, 64);
    uint8_t *rx = rt_alloc(ifc.frame_size, 64);
    /* ramp[k] = k & 0xff: the payload after the sequence number is
     * ramp + ((s + 8) & 0xff), one copy. */
    uint8_t *ramp = rt_alloc(size + 256, 64);
    uint64_t *sums = rt_alloc(256 * sizeof(uint64_t), 64);
    if (frame == NULL || rx == NULL || ramp == NULL || sums == NULL) {
        rt_puts("FAILURE: out of heap\n");
        return SOLO5_EXIT_FAILURE;
    }
    for (uint64_t k = 0; k < size + 256; k++)
        ramp[k] = (uint8_t)k;
    /* sums[r]: one's complement sum of payload bytes 8.. when byte 8 is r. */
    for (int r = 0; r < 256; r++)
        sums[r] = np_csum_add(0, ramp + r, size - 8);

    uint8_t *payload = frame + NP_UDP_PAYLOAD;
    rt_printf("ready: sending %lu datagrams of %lu bytes to "
              "%u.%u.%u.%u:%lu, batches of %lu\n", (unsigned long)count,
              (unsigned long)size, dst_ip[0], dst_ip[1], dst_ip[2], dst_ip[3],
              (unsigned long)port, (unsigned long)batch);

    uint64_t sent = 0, ring_full = 0;
    solo5_time_t start = solo5_clock_monotonic();
    while (sent < count) {
        for (uint64_t b = 0; b < batch && sent < count; b++) {
            uint64_t s = sent;
            size_t len = np_udp_build(frame, ifc.mac, dst_mac, src_ip, dst_ip,
                                      (uint16_t)port, (uint16_t)port, size,
                                      (uint16_t)s);
            np_put_le64(payload, s);
            memcpy(payload + 8, ramp + ((s + 8) & 0xff), size - 8);
            np_udp_set_checksum(frame,
                                np_csum_add(sums[(s + 8) & 0xff], payload, 8));
            if (!np_queue(&ifc, frame, len, &ring_full)) {
                rt_printf("FAILURE: datagram %lu not sent\n", (unsigned long)s);
                return SOLO5_EXIT_FAILURE;
            }
            sent++;
        }
        pyvmm_net_flush(ifc.handle);
        if (serve_rx(&ifc, rx))
            pyvmm_net_flush(ifc.handle);
    }
    pyvmm_net_tx_wait(ifc.handle);
    solo5_time_t end = solo5_clock_monotonic();

    struct pyvmm_net_stats st;
    pyvmm_net_stats(ifc.handle, &st);
    rt_printf("sent: %lu\n", (unsigned long)sent);
    rt_printf("elapsed_us: %lu\n", (unsigned long)((end - start) / 1000));
    rt_printf("kicks: %lu\n", (unsigned long)st.kicks);
    rt_printf("ring_full: %lu\n", (unsigned long)ring_full);
    rt_puts("SUCCESS\n");
    return SOLO5_EXIT_SUCCESS;

usage:
    rt_puts(USAGE);
    return SOLO5_EXIT_FAILURE;
}
