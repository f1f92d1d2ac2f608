/* See traffic.h. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "traffic.h"

#define MAX_BATCH 256
#define MAX_PAYLOAD 65507

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void fill(uint8_t *p, uint32_t len, uint64_t seq)
{
    uint32_t i;
    for (i = 0; i < 8 && i < len; i++)
        p[i] = (uint8_t)(seq >> (8 * i));
    for (; i < len; i++)
        p[i] = (uint8_t)(seq + i);
}

int traffic_udp_send(const char *dst_ip, int port, uint32_t payload, uint64_t count,
                     double seconds, uint64_t rate_pps, uint32_t batch, uint64_t first_seq,
                     struct traffic_result *result)
{
    struct sockaddr_in dst;
    struct mmsghdr msgs[MAX_BATCH];
    struct iovec iovs[MAX_BATCH];
    uint8_t *bufs;
    uint64_t seq = first_seq, start, deadline = 0;
    int fd, err = 0;
    uint32_t i;

    memset(result, 0, sizeof(*result));
    if (payload < 8 || payload > MAX_PAYLOAD || batch == 0 || batch > MAX_BATCH)
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
    bufs = malloc((size_t)payload * batch);
    if (!bufs) {
        close(fd);
        return -ENOMEM;
    }
    memset(msgs, 0, sizeof(msgs));
    for (i = 0; i < batch; i++) {
        iovs[i].iov_base = bufs + (size_t)i * payload;
        iovs[i].iov_len = payload;
        msgs[i].msg_hdr.msg_iov = &iovs[i];
        msgs[i].msg_hdr.msg_iovlen = 1;
    }
    start = now_ns();
    if (seconds > 0)
        deadline = start + (uint64_t)(seconds * 1e9);
    while (result->sent + result->refused < count || (count == 0 && deadline)) {
        uint64_t left = count ? count - result->sent - result->refused : batch;
        uint32_t n = left < batch ? (uint32_t)left : batch;
        int r;

        if (deadline && now_ns() >= deadline)
            break;
        if (rate_pps) {
            /* Pace: do not get ahead of rate_pps since start. */
            uint64_t due = start + (result->sent + result->refused) * 1000000000u / rate_pps;
            while (now_ns() < due)
                ;
        }
        for (i = 0; i < n; i++)
            fill(iovs[i].iov_base, payload, seq + i);
        r = sendmmsg(fd, msgs, n, 0);
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
    free(bufs);
    close(fd);
    return err;
}
