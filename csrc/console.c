/* See console.h: the guest's console output, interruptible by a stop. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <unistd.h>

#include "console.h"
#include "signals.h"

long pyvmm_console_write(int fd, const void *buf, uint64_t len)
{
    const uint8_t *p = buf;
    uint64_t done = 0;
    long result = 0;
    int flags = fcntl(fd, F_GETFL);
    int set = flags >= 0 && !(flags & O_NONBLOCK);

    /*
     * Non-blocking only while this call writes, so that a full pipe or a
     * stopped terminal leaves us in poll, with the stop eventfd, and never
     * asleep in write() where a stop signal that arrived just before would
     * be lost (Python's os.write retries after EINTR on its own).
     */
    if (set && fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
        set = 0;
    while (done < len) {
        ssize_t n;

        if (pyvmm_stop_signal()) {
            result = -EINTR;
            break;
        }
        n = write(fd, p + done, len - done);
        if (n > 0) {
            done += (uint64_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd pfds[2] = {
                { .fd = fd, .events = POLLOUT },
                { .fd = pyvmm_stop_fd(), .events = POLLIN },
            };
            /* No stop eventfd (-1: no run): poll ignores it. */
            if (poll(pfds, 2, -1) < 0 && errno != EINTR) {
                result = -errno;
                break;
            }
            continue;
        }
        result = n < 0 ? -errno : -EIO;
        break;
    }
    if (set)
        fcntl(fd, F_SETFL, flags);
    return result < 0 ? result : (long)done;
}
