/* See tap_io.h: tap frame I/O and its drop policy, written once. */
#define _GNU_SOURCE
#include <errno.h>
#include <sys/uio.h>
#include <unistd.h>

#include "tap_io.h"

static void bump(uint64_t *counter, uint64_t by)
{
    if (counter)
        *counter += by;
}

static int failed(const struct tap_io_tally *t)
{
    if (t)
        bump(t->errors, 1);
    return TAP_IO_FAILED;
}

void tap_io_count_frame(const struct tap_io_tally *t, uint32_t len)
{
    if (!t)
        return;
    bump(t->frames, 1);
    bump(t->bytes, len);
}

int tap_io_read_one(int fd, void *buf, uint32_t size, uint32_t *len, const struct tap_io_tally *t)
{
    uint8_t overflow;
    struct iovec iov[2] = { { buf, size }, { &overflow, 1 } };
    ssize_t n;

    do
        n = readv(fd, iov, 2);
    while (n < 0 && errno == EINTR);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (t)
            bump(t->again, 1);
        return TAP_IO_AGAIN;
    }
    if (n < 0)
        return failed(t);
    if ((uint64_t)n > size) {
        if (t)
            bump(t->oversize, 1);
        return TAP_IO_OVERSIZE;
    }
    *len = (uint32_t)n;
    tap_io_count_frame(t, (uint32_t)n);
    return TAP_IO_FRAME;
}

int tap_io_read(int fd, void *buf, uint32_t size, uint32_t *len, const struct tap_io_tally *t)
{
    int drops = 0, r;

    while ((r = tap_io_read_one(fd, buf, size, len, t)) == TAP_IO_OVERSIZE)
        if (++drops >= TAP_IO_TURN) {
            if (t)
                bump(t->again, 1);
            return TAP_IO_AGAIN;
        }
    return r;
}

/* A tap that cannot take a frame now: its queue is full (EAGAIN,
 * ENOBUFS), its link is down (EIO), or it refuses the frame (EINVAL). */
static int is_drop(int err)
{
    return err == EAGAIN || err == EWOULDBLOCK || err == ENOBUFS || err == EIO || err == EINVAL;
}

int tap_io_write(int fd, const void *buf, uint32_t len, uint32_t min_len,
                 const struct tap_io_tally *t)
{
    ssize_t n = 0;

    if (len >= min_len) {
        do
            n = write(fd, buf, len);
        while (n < 0 && errno == EINTR);
    }
    if (len < min_len || (n < 0 && is_drop(errno))) {
        if (t)
            bump(t->failed, 1);
        return TAP_IO_DROPPED;
    }
    if (n < 0)
        return failed(t);
    tap_io_count_frame(t, len);
    return TAP_IO_FRAME;
}
