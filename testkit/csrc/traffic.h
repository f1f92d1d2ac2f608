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
    uint64_t cpu_ns;        /* the sender's own CPU time (this thread) */
    uint64_t calls;         /* sendmmsg calls */
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

/*
 * The same with every knob.  The payload is never written per datagram:
 * each datagram is two iovecs, its own 8-byte sequence number and a window
 * into one precomputed byte ramp.  sockets: UDP sockets used round-robin,
 * one batch each (default 1); sndbuf: SO_SNDBUFFORCE bytes (0 = the
 * default), large enough that a slow reader makes the tap drop instead of
 * blocking the sender; cpu >= 0 pins the calling thread.  ifindex > 0:
 * AF_PACKET injection on that interface instead (Ethernet, IPv4 and UDP
 * headers built here, UDP checksum 0, qdisc bypassed unless qdisc != 0):
 * the frames skip the host's IP and UDP stack and go straight to the
 * device's transmit routine (for a tap: to its reader); src_ip, src_mac
 * and dst_mac are then used.  A frame the device refuses counts in
 * `refused` (AF_PACKET sees the tap's drops, a UDP socket does not).
 */
struct traffic_opts {
    const char *dst_ip;
    int port;
    uint32_t payload;
    uint64_t count;
    double seconds;
    uint64_t rate_pps;
    uint32_t batch;
    uint64_t first_seq;
    uint32_t sockets;
    int sndbuf;
    int cpu;
    int ifindex;
    int qdisc;
    const char *src_ip;
    uint8_t src_mac[6];
    uint8_t dst_mac[6];
};

int traffic_send(const struct traffic_opts *opts, struct traffic_result *result);

/*
 * Count the UDP datagrams arriving at bind_ip:port (recvmmsg, 8 MiB
 * receive buffer): until `count` arrived (count > 0), or `idle_ms` passed
 * without one after the first, or `max_seconds` in all.  ready_fd >= 0
 * gets one byte written once the socket is bound.  Returns 0 or -errno.
 */
struct traffic_recv_result {
    uint64_t received;
    uint64_t bytes;
    uint64_t pattern_errors;  /* payload not the udpsink pattern */
    uint64_t out_of_order;
    uint64_t first_ns;        /* CLOCK_MONOTONIC of the first and last */
    uint64_t last_ns;
    uint64_t cpu_ns;
};

int traffic_udp_recv(const char *bind_ip, int port, uint64_t count, uint32_t idle_ms,
                     double max_seconds, int ready_fd, struct traffic_recv_result *result);

/*
 * Request/response round trips to an echo at dst_ip:port: `count`
 * datagrams of `payload` bytes, one outstanding at a time, `interval_us`
 * between the start of one and the next (low load), each waited for at
 * most timeout_ms.  rtt_ns[i] gets the i-th round trip in ns, or 0 if its
 * answer never came.  `warmup` round trips first are not recorded.
 * Returns the number answered or -errno.
 */
int64_t traffic_udp_rtt(const char *dst_ip, int port, uint32_t payload, uint64_t count,
                        uint64_t warmup, uint32_t interval_us, uint32_t timeout_ms,
                        uint64_t *rtt_ns);

#endif
