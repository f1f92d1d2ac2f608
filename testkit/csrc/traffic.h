/*
 * A UDP traffic generator for tests and benchmarks (run inside a network
 * namespace the caller created).  Payload pattern, as the guests' udpsink
 * checks it: bytes 0-7 the little-endian sequence number s, byte i >= 8 is
 * (s + i) & 0xff.
 */
#ifndef PYVMM_TRAFFIC_H
#define PYVMM_TRAFFIC_H

#include <stdint.h>

struct traffic_result {
    uint64_t sent;          /* datagrams the kernel accepted */
    uint64_t refused;       /* ENOBUFS/EAGAIN: dropped before the wire */
    uint64_t elapsed_ns;
};

/*
 * Send `count` datagrams (or until `seconds` pass, if > 0) of `payload`
 * bytes to dst_ip:port with sendmmsg in batches of `batch`, at most
 * `rate_pps` per second (0 = as fast as possible), first sequence number
 * `first_seq`.  Returns 0 or -errno.
 */
int traffic_udp_send(const char *dst_ip, int port, uint32_t payload, uint64_t count,
                     double seconds, uint64_t rate_pps, uint32_t batch, uint64_t first_seq,
                     struct traffic_result *result);

#endif
