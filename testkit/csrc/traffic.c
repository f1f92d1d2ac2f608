/* See traffic.h. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <linux/if_packet.h>
#include <net/ethernet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "traffic.h"

#define MAX_BATCH 1024
#define MAX_SOCKETS 16
#define MAX_PAYLOAD 65507
#define HDR_LEN 42 /* Ethernet 14 + IPv4 20 + UDP 8 */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint64_t cpu_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void put_le64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

static uint16_t ip_checksum(const uint8_t *p, size_t len)
{
    uint32_t sum = 0;
    for (size_t i = 0; i + 1 < len; i += 2)
        sum += (uint32_t)(p[i] << 8 | p[i + 1]);
    while (sum >> 16)
        sum = (sum & 0xffff) + (sum >> 16);
    return (uint16_t)~sum;
}

/* Ethernet + IPv4 + UDP headers, constant for every datagram (IP id 0, DF,
 * UDP checksum 0 = none, which IPv4 allows and udpsink accepts). */
static void build_headers(uint8_t *h, const struct traffic_opts *o, struct in_addr src,
                          struct in_addr dst)
{
    uint16_t ulen = (uint16_t)(8 + o->payload), tlen = (uint16_t)(20 + ulen);

    memcpy(h, o->dst_mac, 6);
    memcpy(h + 6, o->src_mac, 6);
    h[12] = 0x08, h[13] = 0x00;
    uint8_t *ip = h + 14;
    memset(ip, 0, 20);
    ip[0] = 0x45;
    ip[2] = (uint8_t)(tlen >> 8), ip[3] = (uint8_t)tlen;
    ip[6] = 0x40; /* DF */
    ip[8] = 64;
    ip[9] = 17;
    memcpy(ip + 12, &src, 4);
    memcpy(ip + 16, &dst, 4);
    uint16_t c = ip_checksum(ip, 20);
    ip[10] = (uint8_t)(c >> 8), ip[11] = (uint8_t)c;
    uint8_t *udp = ip + 20;
    udp[0] = (uint8_t)(o->port >> 8), udp[1] = (uint8_t)o->port;
    udp[2] = (uint8_t)(o->port >> 8), udp[3] = (uint8_t)o->port;
    udp[4] = (uint8_t)(ulen >> 8), udp[5] = (uint8_t)ulen;
    udp[6] = udp[7] = 0;
}

static int open_sockets(const struct traffic_opts *o, const struct sockaddr_in *dst, int *fds,
                        uint32_t n)
{
    uint32_t i;
    for (i = 0; i < n; i++) {
        int fd;
        if (o->ifindex > 0) {
            struct sockaddr_ll ll;
            fd = socket(AF_PACKET, SOCK_RAW | SOCK_CLOEXEC, 0);
            if (fd < 0)
                goto fail;
            memset(&ll, 0, sizeof(ll));
            ll.sll_family = AF_PACKET;
            ll.sll_ifindex = o->ifindex;
            ll.sll_protocol = 0; /* send only: receive nothing */
            if (bind(fd, (struct sockaddr *)&ll, sizeof(ll)) < 0)
                goto fail_fd;
            if (!o->qdisc) {
                int one = 1;
                if (setsockopt(fd, SOL_PACKET, PACKET_QDISC_BYPASS, &one, sizeof(one)) < 0)
                    goto fail_fd;
            }
        } else {
            fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
            if (fd < 0)
                goto fail;
            if (connect(fd, (const struct sockaddr *)dst, sizeof(*dst)) < 0)
                goto fail_fd;
        }
        if (o->sndbuf > 0 &&
            setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &o->sndbuf, sizeof(o->sndbuf)) < 0 &&
            setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &o->sndbuf, sizeof(o->sndbuf)) < 0)
            goto fail_fd;
        fds[i] = fd;
        continue;
    fail_fd:
        fds[i] = fd;
        i++;
    fail: {
        int err = -errno;
        while (i-- > 0)
            close(fds[i]);
        return err;
    }
    }
    return 0;
}

int traffic_send(const struct traffic_opts *o, struct traffic_result *result)
{
    static struct mmsghdr msgs[MAX_BATCH];
    static struct iovec iovs[MAX_BATCH][2];
    struct sockaddr_in dst;
    struct in_addr src = {0};
    uint8_t *heads, *ramp;
    uint64_t seq = o->first_seq, start, deadline = 0, cpu0;
    uint32_t nsock = o->sockets ? o->sockets : 1, turn = 0, batch = o->batch, i;
    uint32_t hlen = o->ifindex > 0 ? HDR_LEN + 8 : 8; /* per-datagram head */
    int fds[MAX_SOCKETS];
    int err = 0;

    memset(result, 0, sizeof(*result));
    if (o->payload < 8 || o->payload > MAX_PAYLOAD || batch == 0 || batch > MAX_BATCH ||
        nsock > MAX_SOCKETS)
        return -EINVAL;
    memset(&dst, 0, sizeof(dst));
    dst.sin_family = AF_INET;
    dst.sin_port = htons((uint16_t)o->port);
    if (inet_pton(AF_INET, o->dst_ip, &dst.sin_addr) != 1)
        return -EINVAL;
    if (o->ifindex > 0 && (!o->src_ip || inet_pton(AF_INET, o->src_ip, &src) != 1))
        return -EINVAL;
    if (o->cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(o->cpu, &set);
        if (sched_setaffinity(0, sizeof(set), &set) < 0)
            return -errno;
    }
    heads = malloc((size_t)hlen * batch);
    ramp = malloc((size_t)o->payload + 256);
    if (!heads || !ramp) {
        free(heads);
        free(ramp);
        return -ENOMEM;
    }
    for (i = 0; i < o->payload + 256; i++)
        ramp[i] = (uint8_t)i;
    memset(msgs, 0, sizeof(msgs));
    for (i = 0; i < batch; i++) {
        uint8_t *h = heads + (size_t)i * hlen;
        if (o->ifindex > 0)
            build_headers(h, o, src, dst.sin_addr);
        iovs[i][0].iov_base = h;
        iovs[i][0].iov_len = hlen;
        iovs[i][1].iov_len = o->payload - 8;
        msgs[i].msg_hdr.msg_iov = iovs[i];
        msgs[i].msg_hdr.msg_iovlen = o->payload > 8 ? 2 : 1;
    }
    err = open_sockets(o, &dst, fds, nsock);
    if (err) {
        free(heads);
        free(ramp);
        return err;
    }
    cpu0 = cpu_now_ns();
    start = now_ns();
    if (o->seconds > 0)
        deadline = start + (uint64_t)(o->seconds * 1e9);
    while (result->sent + result->refused < o->count || (o->count == 0 && deadline)) {
        uint64_t left = o->count ? o->count - result->sent - result->refused : batch;
        uint32_t n = left < batch ? (uint32_t)left : batch;
        int r;

        if (deadline && now_ns() >= deadline)
            break;
        if (o->rate_pps) {
            /* Pace: do not get ahead of rate_pps since start. */
            uint64_t due =
                start + (result->sent + result->refused) * 1000000000u / o->rate_pps;
            while (now_ns() < due)
                ;
        }
        for (i = 0; i < n; i++) {
            put_le64((uint8_t *)iovs[i][0].iov_base + hlen - 8, seq + i);
            iovs[i][1].iov_base = ramp + ((seq + i + 8) & 0xff);
        }
        r = sendmmsg(fds[turn], msgs, n, 0);
        result->calls++;
        turn = (turn + 1) % nsock;
        if (r < 0) {
            if (errno == EINTR)
                continue;
            if (errno == ENOBUFS || errno == EAGAIN || errno == ECONNREFUSED) {
                /* The datagram at the head was refused: skip it. */
                result->refused++;
                seq++;
                continue;
            }
            err = -errno;
            break;
        }
        result->sent += (uint64_t)r;
        seq += (uint64_t)r;
    }
    result->elapsed_ns = now_ns() - start;
    result->cpu_ns = cpu_now_ns() - cpu0;
    for (i = 0; i < nsock; i++)
        close(fds[i]);
    free(heads);
    free(ramp);
    return err;
}

int traffic_udp_send(const char *dst_ip, int port, uint32_t payload, uint64_t count,
                     double seconds, uint64_t rate_pps, uint32_t batch, uint64_t first_seq,
                     struct traffic_result *result)
{
    struct traffic_opts o;
    memset(&o, 0, sizeof(o));
    o.dst_ip = dst_ip;
    o.port = port;
    o.payload = payload;
    o.count = count;
    o.seconds = seconds;
    o.rate_pps = rate_pps;
    o.batch = batch;
    o.first_seq = first_seq;
    o.sockets = 1;
    o.cpu = -1;
    return traffic_send(&o, result);
}

static int bound_udp(const char *ip, int port, int rcvbuf)
{
    struct sockaddr_in a;
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    memset(&a, 0, sizeof(a));
    a.sin_family = AF_INET;
    a.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, ip, &a.sin_addr) != 1) {
        close(fd);
        return -EINVAL;
    }
    if (rcvbuf > 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &rcvbuf, sizeof(rcvbuf));
    if (bind(fd, (struct sockaddr *)&a, sizeof(a)) < 0) {
        int err = -errno;
        close(fd);
        return err;
    }
    return fd;
}

int traffic_udp_recv(const char *bind_ip, int port, uint64_t count, uint32_t idle_ms,
                     double max_seconds, int ready_fd, struct traffic_recv_result *result)
{
    enum { RB = 64, RSZ = 2048 };
    static uint8_t bufs[RB][RSZ];
    struct mmsghdr msgs[RB];
    struct iovec iovs[RB];
    uint64_t end, cpu0, last_seq = 0;
    int fd, i;

    memset(result, 0, sizeof(*result));
    fd = bound_udp(bind_ip, port, 8 << 20);
    if (fd < 0)
        return fd;
    if (ready_fd >= 0 && write(ready_fd, "ready\n", 6) < 0) {
        int err = -errno;
        close(fd);
        return err;
    }
    memset(msgs, 0, sizeof(msgs));
    for (i = 0; i < RB; i++) {
        iovs[i].iov_base = bufs[i];
        iovs[i].iov_len = RSZ;
        msgs[i].msg_hdr.msg_iov = &iovs[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
    }
    cpu0 = cpu_now_ns();
    end = now_ns() + (uint64_t)(max_seconds * 1e9);
    while (count == 0 || result->received < count) {
        uint64_t now = now_ns();
        int64_t wait_ms = (int64_t)(end - now) / 1000000;
        struct pollfd p = {fd, POLLIN, 0};
        if (now >= end)
            break;
        if (result->received && wait_ms > idle_ms)
            wait_ms = idle_ms;
        int r = poll(&p, 1, (int)wait_ms);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            if (result->received)
                break; /* idle after traffic */
            continue;
        }
        r = recvmmsg(fd, msgs, RB, MSG_DONTWAIT, NULL);
        if (r <= 0)
            continue;
        now = now_ns();
        if (!result->received)
            result->first_ns = now;
        result->last_ns = now;
        for (i = 0; i < r; i++) {
            const uint8_t *p8 = bufs[i];
            uint32_t len = msgs[i].msg_len, k;
            uint64_t s;
            result->bytes += len;
            if (len < 8) {
                result->pattern_errors++;
                continue;
            }
            s = get_le64(p8);
            if (result->received + (uint64_t)i > 0 && s <= last_seq)
                result->out_of_order++;
            last_seq = s;
            for (k = 8; k < len; k++)
                if (p8[k] != (uint8_t)(s + k)) {
                    result->pattern_errors++;
                    break;
                }
        }
        result->received += (uint64_t)r;
    }
    result->cpu_ns = cpu_now_ns() - cpu0;
    close(fd);
    return 0;
}

int64_t traffic_udp_rtt(const char *dst_ip, int port, uint32_t payload, uint64_t count,
                        uint64_t warmup, uint32_t interval_us, uint32_t timeout_ms,
                        uint64_t *rtt_ns)
{
    struct sockaddr_in dst;
    uint8_t *out, *in;
    int64_t answered = 0;
    int fd, err = 0;

    if (payload < 8 || payload > 9000)
        return -EINVAL;
    memset(&dst, 0, sizeof(dst));
    dst.sin_family = AF_INET;
    dst.sin_port = htons((uint16_t)port);
    if (inet_pton(AF_INET, dst_ip, &dst.sin_addr) != 1)
        return -EINVAL;
    fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    if (connect(fd, (struct sockaddr *)&dst, sizeof(dst)) < 0) {
        err = -errno;
        close(fd);
        return err;
    }
    out = malloc(payload);
    in = malloc(payload + 64);
    if (!out || !in) {
        free(out);
        free(in);
        close(fd);
        return -ENOMEM;
    }
    for (uint64_t n = 0; n < warmup + count; n++) {
        uint64_t t0 = now_ns(), got = 0;
        put_le64(out, n);
        for (uint32_t k = 8; k < payload; k++)
            out[k] = (uint8_t)(n + k);
        if (send(fd, out, payload, 0) < 0 && errno != ECONNREFUSED) {
            err = -errno;
            break;
        }
        for (;;) {
            uint64_t now = now_ns();
            int64_t left_ms = (int64_t)timeout_ms - (int64_t)((now - t0) / 1000000);
            struct pollfd p = {fd, POLLIN, 0};
            if (left_ms <= 0)
                break;
            int r = poll(&p, 1, (int)left_ms);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                break;
            ssize_t len = recv(fd, in, payload + 64, MSG_DONTWAIT);
            now = now_ns();
            if (len >= 8 && get_le64(in) == n) {
                got = now - t0;
                break;
            }
            /* a late answer to an earlier request: keep waiting */
        }
        if (n >= warmup) {
            rtt_ns[n - warmup] = got;
            answered += got != 0;
        }
        uint64_t next = t0 + (uint64_t)interval_us * 1000;
        while (now_ns() < next) {
            struct timespec ts = {0, 20000};
            nanosleep(&ts, NULL);
        }
    }
    free(out);
    free(in);
    close(fd);
    return err ? err : answered;
}
